/* Monotonic time, in the units the rest of the tree counts in. */
#ifndef HVD_COMMON_CLOCK_H
#define HVD_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds and nanoseconds of CLOCK_MONOTONIC (no meaning across processes, never jumps). */
int64_t hvd_now_ms(void);
int64_t hvd_now_ns(void);

/* The CLOCK_MONOTONIC instant deadline_ms (hvd_now_ms time) as a timespec, for
 * pthread_cond_timedwait on a condition variable created with CLOCK_MONOTONIC and for
 * clock_nanosleep(TIMER_ABSTIME). */
struct timespec hvd_ms_to_timespec(int64_t deadline_ms);

/* Milliseconds left until deadline_ms, for poll(): 0 when it has passed, -1 when deadline_ms
 * is negative (no deadline), capped at INT32_MAX. */
int hvd_ms_left(int64_t deadline_ms);

#endif
