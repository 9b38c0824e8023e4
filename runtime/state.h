/* What user threads and the background thread share, behind one mutex: the run state and the
 * job's identity, the submission queue, the handle table, the names in flight on this rank,
 * and the published counters. Everything else belongs to the background thread (cycle.h).
 * The public calls that only read this state (hvd_poll, hvd_wait, hvd_get_stats, hvd_rank,
 * ...) live in state.c. */
#ifndef HVD_RUNTIME_STATE_H
#define HVD_RUNTIME_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "entry.h"
#include "hvd/runtime.h"

/* Run states. */
enum {
    RT_STOPPED = 0, /* no background thread (never started, or shut down) */
    RT_RUNNING,     /* the background thread cycles */
    RT_ENDED        /* the background thread's loop ended; hvd_shutdown has not joined it yet */
};

/* The job's shape as MPI sees it. */
typedef struct rt_ids {
    int rank, size, local_rank, local_size, cross_rank, cross_size;
} rt_ids;

/* ---- lifecycle (engine.c) ----------------------------------------------------------- */

/* The run state; reason receives the stop reason ("" if none). */
int rt_state_run_state(char reason[HVD_ERR_MAX]);
/* Resets what a new start must not inherit (the init result, shutdown request, identity,
 * stop reason, unnamed counters, statistics). */
void rt_state_prepare_start(void);
/* Records the job's identity (background thread, during start-up). */
void rt_state_set_ids(const rt_ids *ids);
/* Publishes the start-up result (background thread): rc 0 makes the runtime running. */
void rt_state_init_done(int rc, const hvd_err *err);
/* Waits for the start-up result. Returns it (0 or -1 with err). */
int rt_state_wait_init(hvd_err *err);
/* Asks the background thread to shut down. */
void rt_state_request_shutdown(void);
/* After the background thread was joined: stopped, identity invalid. */
void rt_state_stopped(void);

/* ---- the background thread (cycle.c) ------------------------------------------------ */

/* Sleeps until the monotonic instant t_ns (hvd_now_ns time) between two cycles, or less: a
 * submission, or hvd_shutdown, ends the sleep at once. A collective submitted while the
 * runtime idles therefore starts its cycle right away instead of up to a cycle time later
 * (HOROVOD_CYCLE_TIME is the longest wait between cycles, not a fixed period); a burst of
 * submissions still goes into one cycle (rt_state_drain waits for its end). */
void rt_state_sleep_until(int64_t t_ns);
/* Takes the queued entries (linked by next) once the current burst of submissions is over,
 * and tells whether hvd_shutdown was called. */
rt_entry *rt_state_drain(bool *shutdown_requested);
/* Completes entries: publishes their outcome to their handles, forgets their names and frees
 * them. stats (may be NULL) is published with them, so that a waiter sees counts that
 * include its own tensors. */
void rt_state_complete(rt_entry **v, size_t n, const hvd_stats *stats);
/* Publishes the counters. */
void rt_state_publish(const hvd_stats *stats);
/* Marks the runtime ended with reason and returns what is still queued. */
rt_entry *rt_state_end(const char *reason);

/* ---- submissions (api.c, user threads) ---------------------------------------------- */

/* Queues e (with its parameters and buffers filled in) under name, or a generated
 * "<op>.noname.<n>" when name is NULL. Returns 0 with *handle set, or -1 with err (e is
 * freed). */
int rt_submit(rt_entry *e, const char *name, hvd_handle *handle, hvd_err *err);
/* hvd_size() while running, else -1 with err as a refused submission's (HVD_E_SHUTDOWN once
 * the runtime has stopped, HVD_E_STATE before hvd_init). */
int rt_current_size(hvd_err *err);

#endif
