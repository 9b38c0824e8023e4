/* A tiny test harness: CHECK macros that report file:line and the failed expression, and a
 * summary line. A test program returns test_finish(): 0 if every check passed, 1 otherwise. */
#ifndef HVD_TESTUTIL_H
#define HVD_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

extern _Atomic int test_failures; /* CHECK may run on helper threads */
extern _Atomic int test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Runs one named test case function and prints its outcome. */
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        int before_ = test_failures;                                                               \
        fn();                                                                                      \
        fprintf(stderr, "%s %s\n", test_failures == before_ ? "ok  " : "FAIL", #fn);               \
    } while (0)

/* Prints "N checks, M failed" and returns the exit code. */
int test_finish(void);

/* Monotonic milliseconds. */
int64_t test_now_ms(void);

/* Resident set size of this process in KiB (from /proc/self/status), or -1. */
long test_rss_kib(void);

#endif
