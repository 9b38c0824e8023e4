/* Elastic training on the rank side (docs/elastic.md): beside the runtime's API
 * (include/hvd/runtime.h), for ranks of an elastic job (hvd-driver run --min-np/--max-np).
 *
 * Open MPI cannot grow or shrink a running job, so every change of hosts restarts the ranks
 * (a reset). A rank keeps its training state across resets by committing it to its task
 * service, which outlives the ranks: the same bytes on every rank, at the same point of the
 * training loop (the state is the same everywhere in data-parallel training). After a reset
 * the new ranks restore the newest commit that survives (a lost host takes its copy with it;
 * another host's serves) and are brought in sync from one rank that holds it. Horovod's
 * state.commit(), state.restore() after a restart, and state.check_host_updates():
 *
 *     hvd_init(&err);
 *     if (hvd_elastic_restore(&buf, &len, &err) == 1) load(buf, len);   // else start afresh
 *     for (step = ...) {
 *         train_one_step();                  // a failed collective: return HVD_ELASTIC_EXIT_RESET
 *         if (step % 10 == 0) {
 *             int r = hvd_elastic_commit(bytes, n, &err);
 *             if (r == HVD_ELASTIC_RESET) return HVD_ELASTIC_EXIT_RESET;  // hosts changed
 *             if (r < 0) return hvd_elastic_resettable(err.code) ? HVD_ELASTIC_EXIT_RESET : 1;
 *         }
 *     }
 *
 * Outside an elastic job (no HVD_ELASTIC_EPOCH in the environment) restore finds nothing,
 * commits go nowhere and no host ever changes, so the same code runs in static jobs.
 *
 * The collective functions (restore, commit, check_host_updates) must be called by every rank,
 * in the same order, like the runtime's collectives. Errors: return -1 with err (may be NULL)
 * naming what failed; nothing here exits or aborts. hvd_elastic_resettable(err->code) tells an
 * error a reset may cure (a task service or a rank went away: end with HVD_ELASTIC_EXIT_RESET)
 * from one the next launch would meet again (fail the rank with the error). One context per
 * process, made on first use; the functions are thread-safe but meant for the training thread. */
#ifndef HVD_ELASTIC_H
#define HVD_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/defaults.h"
#include "hvd/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What hvd_elastic_commit and hvd_elastic_check_host_updates return when the hosts changed:
 * the rank should end at once with HVD_ELASTIC_EXIT_RESET (include/hvd/defaults.h) as its
 * status; the driver then resets the job over the new hosts. */
#define HVD_ELASTIC_RESET 1

/* 1 in a rank of an elastic job (HVD_ELASTIC_EPOCH is set), else 0. */
int hvd_elastic_enabled(void);

/* Collective, after hvd_init: finds the newest commit any rank's task service holds and gives
 * it to every rank. Returns 1 with *state (malloc'd: free() it; NULL when the commit is empty)
 * and *len; 0 when there is no commit (a fresh start, or not elastic); -1 with err (a task
 * service cannot be reached, a collective failed). The restored commit is also stored in this
 * rank's task service, so that new hosts hold a copy from then on. */
int hvd_elastic_restore(void **state, size_t *len, hvd_err *err);

/* Stores len bytes (at most HVD_ELASTIC_STATE_MAX) in this rank's task service as the next
 * commit (hvd_elastic_commit_id() + 1). Not collective; every rank should save the same state
 * at the same point. Returns 0, or -1 with err: HVD_E_INVALID, before anything is sent, when
 * len is over HVD_ELASTIC_STATE_MAX (the message gives both sizes). */
int hvd_elastic_save(const void *state, size_t len, hvd_err *err);

/* Collective: 1 (HVD_ELASTIC_RESET) when the driver says the hosts changed since this launch
 * began, 0 when not (or not elastic), -1 with err. Rank 0 asks the driver; every rank gets its
 * answer, so all of them reset at the same point. */
int hvd_elastic_check_host_updates(hvd_err *err);

/* hvd_elastic_save, then hvd_elastic_check_host_updates (Horovod's state.commit()). Returns
 * 0, HVD_ELASTIC_RESET, or -1 with err. */
int hvd_elastic_commit(const void *state, size_t len, hvd_err *err);

/* Whether a reset may cure an error of the functions above, by its code (err->code): 1 for a
 * connection to the task service or the driver that broke or timed out, a collective that
 * failed because a rank went away or the runtime stopped (HVD_E_IO, HVD_E_TIMEOUT,
 * HVD_E_SHUTDOWN, HVD_E_INTERNAL): end the rank with HVD_ELASTIC_EXIT_RESET. 0 for the others,
 * which every launch would meet again, so that a reset would only repeat them for ever: a
 * state over HVD_ELASTIC_STATE_MAX (HVD_E_INVALID), a rank not started by hvd-exec or a task
 * service without --elastic (HVD_E_STATE), a wrong job secret (HVD_E_AUTH), ...: fail the rank
 * (a status of its own, 1-127 but 75) with the error. */
int hvd_elastic_resettable(int code);

/* The id of the newest commit this rank saved or restored: 0 before any. */
uint64_t hvd_elastic_commit_id(void);

/* Closes the connections to the task service and the driver (reopened on next use). */
void hvd_elastic_close(void);

#ifdef __cplusplus
}
#endif

#endif
