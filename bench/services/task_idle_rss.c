/* Benchmark: resident memory of an idle hvd-task (target: under 5 MiB).
 *
 * Starts a driver in this process (one task), starts `hvd-task` against it, waits until the
 * task registered and was told that registration is complete (so it is in its steady state:
 * the server loop, the driver watcher's long-poll, waiting for a command), lets it settle, and
 * prints its VmRSS with the anonymous/file split from /proc/<pid>/status, and its
 * proportional (Pss) and private resident memory from /proc/<pid>/smaps_rollup. Then shuts
 * the job down.
 *
 * VmRSS counts every page of the shared libraries the process has mapped: libcrypto and
 * libc are most of it (OpenSSL 3's initialization alone touches megabytes; on the machine
 * this was written on, a program that only calls RAND_bytes() has a VmRSS of 5.3 MiB).
 * Those pages are shared by every process; the private memory is what each task adds.
 *
 * Pss depends on how many processes map the same library pages at that moment (other tasks
 * of the machine, anything else using libcrypto): alone, a task's Pss would be its VmRSS. So
 * it also prints where the pages are, per mapped file (from /proc/<pid>/smaps): RSS, Pss and
 * private KiB of the largest ones.
 *
 * Usage: task_idle_rss HVD_TASK_BINARY [SETTLE_MS]   (prints one line per measurement) */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd/driver.h"
#include "hvd/proto.h"

static long status_kib(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') v = strtol(line + fl + 1, NULL, 10);
    fclose(f);
    return v;
}

/* A field of /proc/<pid>/smaps_rollup, in KiB, or -1. */
static long rollup_kib(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') v = strtol(line + fl + 1, NULL, 10);
    fclose(f);
    return v;
}

/* Resident, proportional and private KiB of one mapped object (a file, or [heap], [anon]). */
typedef struct mapping {
    char name[96];
    long rss, pss, priv;
} mapping;

static int by_rss(const void *a, const void *b) {
    const mapping *x = a, *y = b;
    return (y->rss > x->rss) - (y->rss < x->rss);
}

/* Prints the largest objects of /proc/<pid>/smaps by resident size. */
static void print_mappings(pid_t pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    mapping m[256];
    size_t n = 0;
    mapping *cur = NULL;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8], name[400] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %399[^\n]", &lo, &hi, perms, name) >= 3) {
            const char *base = name[0] ? strrchr(name, '/') : NULL;
            const char *key = base ? base + 1 : name[0] ? name : "[anon]";
            cur = NULL;
            for (size_t i = 0; i < n && !cur; i++)
                if (strcmp(m[i].name, key) == 0) cur = &m[i];
            if (!cur && n < sizeof m / sizeof m[0]) {
                cur = &m[n++];
                memset(cur, 0, sizeof *cur);
                snprintf(cur->name, sizeof cur->name, "%s", key);
            }
            continue;
        }
        long v;
        if (!cur) continue;
        if (sscanf(line, "Rss: %ld", &v) == 1) cur->rss += v;
        if (sscanf(line, "Pss: %ld", &v) == 1) cur->pss += v;
        if (sscanf(line, "Private_Clean: %ld", &v) == 1) cur->priv += v;
        if (sscanf(line, "Private_Dirty: %ld", &v) == 1) cur->priv += v;
    }
    fclose(f);
    qsort(m, n, sizeof m[0], by_rss);
    printf("  largest mappings (RSS / Pss / private KiB):");
    for (size_t i = 0; i < n && i < 8; i++)
        printf("%s %s %ld/%ld/%ld", i ? ";" : "", m[i].name, m[i].rss, m[i].pss, m[i].priv);
    printf("\n");
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HVD_TASK_BINARY [SETTLE_MS]\n", argv[0]);
        return 2;
    }
    int settle = argc > 2 ? atoi(argv[2]) : 1000;
    hvd_err err;
    hvd_secret secret;
    char b64[45];
    if (hvd_secret_generate(&secret, &err) != 0) return 1;
    hvd_secret_to_base64(&secret, b64);
    setenv(HVD_SECRET_ENV, b64, 1);
    char *argv0[] = {"true", NULL};
    hvd_code_msg code = {.kind = HVD_CODE_ARGV, .argv = {argv0, 1}};
    hvd_driver_config dc = {.num_tasks = 1, .secret = secret, .code = &code};
    hvd_driver *d = hvd_driver_start(&dc, &err);
    if (!d) {
        fprintf(stderr, "driver: %s\n", err.msg);
        return 1;
    }
    hvd_addr *addrs;
    size_t n;
    if (hvd_driver_addrs(d, &addrs, &n, &err) != 0) return 1;
    char *text = hvd_addrs_format(addrs, n);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(argv[1], argv[1], "--driver", text, "--index", "0", "--log-level", "error",
              (char *)NULL);
        _exit(127);
    }
    char **ifaces = NULL;
    if (hvd_driver_wait_registration(d, 30000, &err) != 0 ||
        hvd_driver_common_interfaces(d, 30000, &ifaces, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        kill(pid, SIGKILL);
        return 1;
    }
    for (size_t i = 0; ifaces[i]; i++)
        free(ifaces[i]);
    free(ifaces);
    sleep_ms(settle);
    long rss = status_kib(pid, "VmRSS"), anon = status_kib(pid, "RssAnon"),
         file = status_kib(pid, "RssFile"), threads = status_kib(pid, "Threads");
    long pss = rollup_kib(pid, "Pss"),
         priv = rollup_kib(pid, "Private_Clean") + rollup_kib(pid, "Private_Dirty");
    printf("hvd-task idle: VmRSS %ld KiB (%.2f MiB; target < 5 MiB: %s): anonymous %ld KiB, "
           "files %ld KiB; Pss %ld KiB; private %ld KiB; %ld threads\n",
           rss, rss / 1024.0, rss < 5 * 1024 ? "met" : "not met", anon, file, pss, priv, threads);
    print_mappings(pid);
    hvd_driver_shutdown_tasks(d);
    int st;
    waitpid(pid, &st, 0);
    hvd_driver_stop(d);
    free(addrs);
    free(text);
    return rss > 0 ? 0 : 1;
}
