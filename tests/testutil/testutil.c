#include "testutil.h"

#include <string.h>
#include <time.h>

_Atomic int test_failures;
_Atomic int test_checks;

int test_finish(void) {
    fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
    return test_failures == 0 && test_checks > 0 ? 0 : 1;
}

int64_t test_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long test_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            sscanf(line + 6, "%ld", &kib);
            break;
        }
    }
    fclose(f);
    return kib;
}
