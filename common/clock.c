/* Monotonic time (common/clock.h). */
#include "common/clock.h"

#include <limits.h>

int64_t hvd_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t hvd_now_ms(void) {
    return hvd_now_ns() / 1000000;
}

struct timespec hvd_ms_to_timespec(int64_t deadline_ms) {
    struct timespec ts = {.tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000};
    return ts;
}

int hvd_ms_left(int64_t deadline_ms) {
    if (deadline_ms < 0) return -1;
    int64_t left = deadline_ms - hvd_now_ms();
    if (left <= 0) return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}
