/* The engine: hvd_init and hvd_shutdown, and the background thread that runs the cycles
 * (cycle.c) between its start-up and its tear-down.
 *
 * User threads only touch the shared state (state.c). Everything else (MPI, the cache, the
 * pending entries, the fusion buffer, the timeline) belongs to the background thread, which
 * makes every MPI call (MPI_THREAD_FUNNELED is enough when the runtime initializes MPI). */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "config.h"
#include "cycle.h"
#include "hvd/runtime.h"
#include "log.h"
#include "mpi_check.h"
#include "state.h"

/* The background thread's own state. */
typedef struct bg_state {
    rt_config cfg;
    hvd_err cfg_err; /* a malformed knob on this rank (code 0 if none) */
    MPI_Comm comm, local_comm, cross_comm;
    bool own_mpi; /* hvd_init initialized MPI, so hvd_shutdown finalizes it */
    bool cycle_ready;
    rt_cycle cycle;
} bg_state;

static pthread_mutex_t g_life_mu = PTHREAD_MUTEX_INITIALIZER; /* serializes init/shutdown */
static bool g_thread_started;                                 /* under g_life_mu */
static pthread_t g_thread;

/* ---- start-up and tear-down (background thread) -------------------------------------------- */

/* Initializes MPI (or checks the application's), and makes the runtime's communicators. */
static int mpi_setup(bg_state *b, rt_ids *ids, hvd_err *err) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
        return hvd_err_set(err, HVD_E_STATE,
                           "MPI was already finalized (by an earlier hvd_shutdown or by the "
                           "application); MPI cannot start twice in one process");
    /* Another MPI's launcher would not fail MPI_Init: every rank would come up alone. */
    if (rt_mpi_check_launcher(err) != 0) return -1;
    int provided = 0;
    if (!initialized) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Init_thread failed");
        b->own_mpi = true;
    } else {
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE)
            return hvd_err_set(
                err, HVD_E_STATE,
                "the application initialized MPI without MPI_THREAD_MULTIPLE; the runtime calls "
                "MPI from its own thread, so initialize MPI with MPI_Init_thread(..., "
                "MPI_THREAD_MULTIPLE, ...) or let hvd_init do it");
    }
    /* A private communicator keeps our traffic apart from the application's. */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &b->comm) != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &ids->rank);
    MPI_Comm_size(b->comm, &ids->size);
    rt_log_set_rank(ids->rank);
    if (MPI_Comm_split_type(b->comm, MPI_COMM_TYPE_SHARED, ids->rank, MPI_INFO_NULL,
                            &b->local_comm) != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Comm_split_type failed");
    MPI_Comm_rank(b->local_comm, &ids->local_rank);
    MPI_Comm_size(b->local_comm, &ids->local_size);
    if (MPI_Comm_split(b->comm, ids->local_rank, ids->rank, &b->cross_comm) != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Comm_split failed");
    MPI_Comm_rank(b->cross_comm, &ids->cross_rank);
    MPI_Comm_size(b->cross_comm, &ids->cross_size);
    return 0;
}

/* Fusion groups, cache slots and the bit vector must be identical on every rank, so every
 * rank uses rank 0's knobs. */
static int broadcast_knobs(bg_state *b, hvd_err *err) {
    int64_t knobs[5] = {b->cfg.cycle_ns, b->cfg.fusion_threshold, b->cfg.cache_capacity,
                        b->cfg.stall_warn_ns, b->cfg.stall_shutdown_ns};
    if (MPI_Bcast(knobs, 5, MPI_INT64_T, 0, b->comm) != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "broadcasting the runtime settings failed");
    b->cfg.cycle_ns = knobs[0];
    b->cfg.fusion_threshold = knobs[1];
    b->cfg.cache_capacity = knobs[2];
    b->cfg.stall_warn_ns = knobs[3];
    b->cfg.stall_shutdown_ns = knobs[4];
    return 0;
}

static int bg_setup(bg_state *b, hvd_err *err) {
    rt_ids ids;
    if (mpi_setup(b, &ids, err) != 0) return -1;
    rt_state_set_ids(&ids);
    if (broadcast_knobs(b, err) != 0) return -1;

    /* Local steps that can fail on one rank only (a malformed knob, the timeline file, out of
     * memory); agree on the outcome so that no rank starts cycling while another gives up. */
    hvd_err local = b->cfg_err;
    int ok = local.code == 0;
    if (ok) {
        ok = rt_cycle_init(&b->cycle, &b->cfg, b->comm, ids.rank, ids.size, &local) == 0;
        b->cycle_ready = true; /* rt_cycle_free is safe even after a failed init */
    }
    int all_ok = 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, b->comm) != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "agreeing on the start-up result failed");
    if (!ok) {
        rt_log("hvd_init failed: %s", local.msg); /* the other ranks point here */
        *err = local;
        return -1;
    }
    if (!all_ok)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "hvd_init failed on another rank (its log says why), so it fails "
                           "here too");
    return 0;
}

static void bg_teardown(bg_state *b) {
    bool alone = b->cycle_ready && b->cycle.alone;
    if (b->cycle_ready) rt_cycle_free(&b->cycle);
    if (b->cross_comm != MPI_COMM_NULL) MPI_Comm_free(&b->cross_comm);
    if (b->local_comm != MPI_COMM_NULL) MPI_Comm_free(&b->local_comm);
    if (b->comm != MPI_COMM_NULL) MPI_Comm_free(&b->comm);
    /* MPI_Finalize waits for every rank, and the others may be inside a collective this rank
     * left (cycle.c): finalizing would hang this process with them. Exiting without it makes
     * the launcher end the whole job. */
    if (b->own_mpi && alone)
        rt_log("not finalizing MPI: the other ranks may be waiting in a collective this rank "
               "left, and mpirun ends the job when this process exits");
    else if (b->own_mpi)
        MPI_Finalize();
}

/* ---- the background thread --------------------------------------------------------------- */

static void *bg_main(void *arg) {
    bg_state *b = arg;
    hvd_err err = {0};
    int rc = bg_setup(b, &err);
    rt_state_init_done(rc, &err);
    if (rc == 0) {
        /* Cycles start on a grid of cycle times (absolute, so work adds no drift), or earlier
         * when a submission wakes the thread (rt_state_sleep_until), or at once while this
         * rank chases: it holds entries some peer has not submitted yet (a step's gradients
         * reach the ranks at different moments). A cycle's bit vector waits in MPI for every
         * peer, so a peer that submits then is met at once; on the grid, the two would meet
         * at this rank's next tick, up to a cycle time later. Chasing busy-waits in MPI, so it
         * lasts at most chase_ns per wait (a stalled peer, join) before the grid again. */
        int64_t next = hvd_now_ns(), chase_since = -1;
        while (!rt_cycle_run(&b->cycle)) {
            next += b->cfg.cycle_ns;
            int64_t now = hvd_now_ns();
            if (next < now) next = now;
            if (b->cycle.pending.count == 0) {
                chase_since = -1;
            } else {
                if (chase_since < 0) chase_since = now;
                if (now - chase_since < b->cfg.chase_ns) next = now;
            }
            rt_state_sleep_until(next);
        }
    }
    bg_teardown(b);
    free(b);
    return NULL;
}

/* ---- lifecycle (include/hvd/runtime.h) --------------------------------------------------- */

int hvd_init(hvd_err *err) {
    pthread_mutex_lock(&g_life_mu);
    char reason[HVD_ERR_MAX];
    int state = rt_state_run_state(reason);
    if (state == RT_RUNNING) {
        pthread_mutex_unlock(&g_life_mu);
        return 0;
    }
    if (g_thread_started) {
        pthread_mutex_unlock(&g_life_mu);
        return hvd_err_set(err, HVD_E_STATE,
                           "the collective runtime has stopped (%s); call hvd_shutdown() before "
                           "hvd_init()",
                           reason);
    }
    bg_state *b = calloc(1, sizeof *b);
    if (!b) {
        pthread_mutex_unlock(&g_life_mu);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory starting the collective runtime");
    }
    b->comm = b->local_comm = b->cross_comm = MPI_COMM_NULL;
    rt_config_read(&b->cfg, &b->cfg_err); /* an error fails in bg_setup, on every rank */
    rt_state_prepare_start();
    int prc = pthread_create(&g_thread, NULL, bg_main, b);
    if (prc != 0) {
        free(b);
        pthread_mutex_unlock(&g_life_mu);
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot start the background thread: %s",
                           strerror(prc));
    }
    hvd_err ierr = {0};
    if (rt_state_wait_init(&ierr) != 0) {
        pthread_join(g_thread, NULL);
        pthread_mutex_unlock(&g_life_mu);
        if (err) *err = ierr;
        return -1;
    }
    g_thread_started = true;
    pthread_mutex_unlock(&g_life_mu);
    return 0;
}

int hvd_shutdown(void) {
    pthread_mutex_lock(&g_life_mu);
    if (!g_thread_started) {
        pthread_mutex_unlock(&g_life_mu);
        return 0;
    }
    rt_state_request_shutdown();
    pthread_join(g_thread, NULL);
    g_thread_started = false;
    rt_state_stopped();
    pthread_mutex_unlock(&g_life_mu);
    return 0;
}
