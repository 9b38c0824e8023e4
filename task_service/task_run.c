/* hvd_task_run: the rest of a task's life after registration (Horovod's _task_fn, steps
 * T1.5-T2) and the driver watcher.
 *
 * The first task of a host waits for its command and returns its exit code; a sibling
 * holds a WAIT_EXIT long-poll on the first task and returns that code. Meanwhile a watcher
 * thread holds a WAIT_SHUTDOWN long-poll on the driver: its answer, or its connection
 * breaking, aborts the task. Nothing here polls: waits are condition variables, blocking
 * calls without timeouts, and eventfds that interrupt those calls. Aborts go through
 * held.h. */
#include "run.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"
#include "held.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "state.h"

/* The watcher's client accepts frames up to this size: its only reply is an ack. */
#define WATCH_MAX_FRAME 4096
/* How often the watcher tries to reach the driver before concluding it went away. */
#define WATCH_CONNECT_TRIES 3

/* The error hvd_task_run returns after an abort. */
static int aborted_err(hvd_task *t, hvd_err *err) {
    pthread_mutex_lock(&t->mu);
    task_abort why = t->abort_why;
    char detail[HVD_ERR_MAX];
    snprintf(detail, sizeof detail, "%s", t->abort_detail);
    pthread_mutex_unlock(&t->mu);
    switch (why) {
    case ABORT_DRIVER_SHUTDOWN:
        return hvd_err_set(err, HVD_E_SHUTDOWN, "the driver shut the job down");
    case ABORT_DRIVER_GONE:
        return hvd_err_set(err, HVD_E_IO, "%s", detail);
    case ABORT_REQUEST:
        return hvd_err_set(err, HVD_E_STATE, "%s was aborted before its command started (%s)",
                           t->name, detail);
    default:
        return hvd_err_set(err, HVD_E_SHUTDOWN, "%s was aborted", t->name);
    }
}

/* ---- Driver watcher -------------------------------------------------------------------------- */

typedef struct watcher {
    hvd_task *t;
    pthread_t thread;
    bool running;
    int stop_efd;     /* readable: hvd_task_stop is stopping the watcher */
    atomic_bool stop; /* same, for checks between calls */
} watcher;

/* Ends the blocking call in progress on c; runs as that call's interrupt callback. A task
 * that ended normally first says TASK_DONE, so that the driver does not count the close as a
 * lost task. hvd_client has no cancel operation, but it drops its connection whenever a
 * request cannot be sent, and a request longer than the client's max_frame (WATCH_MAX_FRAME)
 * never is: the call in progress then fails with "connection lost while interrupting". */
static void drop_connection(hvd_client *c, void *user) {
    watcher *w = user;
    hvd_task *t = w->t;
    char why[sizeof t->ending_why];
    pthread_mutex_lock(&t->mu);
    bool done = t->ended_normally;
    snprintf(why, sizeof why, "%s", t->ending_why);
    pthread_mutex_unlock(&t->mu);
    hvd_task_event_msg ev = {
        .index = t->cfg.index, .kind = done ? HVD_TASK_EV_DONE : HVD_TASK_EV_ENDING, .text = why};
    hvd_err e;
    if (done || why[0]) (void)hvd_client_send(c, &hvd_task_event_desc, &ev, &e);
    char big[2 * WATCH_MAX_FRAME];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    hvd_host_msg m = {.host_hash = big};
    hvd_err err;
    hvd_client_call(c, &hvd_host_indices_desc, &m, &hvd_indices_desc, NULL, 0, 0, &err);
}

/* Connects the watcher's client to the driver: a few tries, a short pause between them,
 * until hvd_task_stop stops the watcher. NULL with err. */
static hvd_client *watch_connect(watcher *w, hvd_err *err) {
    hvd_task *t = w->t;
    hvd_client *c = NULL;
    hvd_client_config cc = {.service = HVD_DRIVER_SERVICE,
                            .secret = t->cfg.secret,
                            .addrs = t->driver_addrs,
                            .naddrs = t->n_driver_addrs,
                            .io_timeout_ms = t->cfg.net_timeout_ms, /* set by hvd_task_start */
                            .max_frame = WATCH_MAX_FRAME};
    for (int i = 0; i < WATCH_CONNECT_TRIES && !c && !atomic_load(&w->stop); i++) {
        if (i > 0) {
            struct pollfd pf = {.fd = w->stop_efd, .events = POLLIN};
            poll(&pf, 1, 300 * i);
        }
        c = hvd_client_connect(&cc, err);
    }
    hvd_secret_wipe(&cc.secret);
    return c;
}

/* The watcher lost the driver (err says how): the task ends. */
static void driver_gone(hvd_task *t, const hvd_err *err) {
    char why[HVD_ERR_MAX];
    snprintf(why, sizeof why, "the driver went away: %s", err->msg);
    task_request_abort(t, ABORT_DRIVER_GONE, why);
}

static void *watch_main(void *arg) {
    watcher *w = arg;
    hvd_task *t = w->t;
    hvd_err err = {0, ""};
    hvd_client *c = watch_connect(w, &err);
    if (!c) {
        if (!atomic_load(&w->stop)) driver_gone(t, &err);
        return NULL;
    }
    /* The driver counts this task as lost only when this long-poll of its index breaks. */
    hvd_index_msg me = {.index = t->cfg.index};
    int rc = hvd_client_call_stream(c, &hvd_wait_shutdown_desc, &me, NULL, w, w->stop_efd,
                                    drop_connection, &hvd_ack_desc, NULL, -1, &err);
    hvd_client_close(c);
    if (atomic_load(&w->stop)) return NULL;
    if (rc == 0 || err.code == HVD_E_SHUTDOWN) {
        task_request_abort(t, ABORT_DRIVER_SHUTDOWN, "the driver shut the job down");
    } else if (err.code == HVD_E_IO || err.code == HVD_E_TIMEOUT || err.code == HVD_E_AUTH ||
               err.code == HVD_E_PROTOCOL) {
        driver_gone(t, &err);
    } else {
        /* The driver answered, but refused the long-poll: it still runs the job. */
        task_log(t, HVD_LOG_WARN, "not watching the driver for shutdown: %s", err.msg);
    }
    return NULL;
}

static void watcher_start(watcher *w, hvd_task *t) {
    w->t = t;
    atomic_init(&w->stop, false);
    w->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    w->running = w->stop_efd >= 0 && pthread_create(&w->thread, NULL, watch_main, w) == 0;
    if (!w->running)
        task_log(t, HVD_LOG_WARN, "cannot watch the driver for shutdown: %s", strerror(errno));
}

static void watcher_stop(watcher *w) {
    atomic_store(&w->stop, true);
    if (w->running) {
        uint64_t one = 1;
        (void)!write(w->stop_efd, &one, sizeof one);
        pthread_join(w->thread, NULL);
    }
    if (w->stop_efd >= 0) close(w->stop_efd);
}

/* ---- The first task of a host ---------------------------------------------------------------- */

static int run_first(hvd_task *t, int *exit_code, hvd_err *err) {
    int secs = t->cfg.start_timeout_ms / 1000;
    task_log(t, HVD_LOG_INFO, "%s runs the command of host %s: waiting up to %d s for it", t->name,
             t->host_hash, secs);
    int64_t deadline = hvd_now_ms() + t->cfg.start_timeout_ms;
    pthread_mutex_lock(&t->mu);
    while (!t->started && t->abort_why == ABORT_NONE && task_wait_until(t, deadline)) {
    }
    if (!t->started && t->abort_why == ABORT_NONE) {
        pthread_mutex_unlock(&t->mu);
        return hvd_err_set(err, HVD_E_TIMEOUT,
                           "no command reached %s within %d s: did mpirun start? (hvd-rsh must "
                           "reach this task for host %s)",
                           t->name, secs, t->host_hash);
    }
    while (!t->ended && t->abort_why == ABORT_NONE)
        task_wait_until(t, -1);
    if (!t->ended && t->started) {
        /* Aborting: the loop stops the command (after the settle time on a driver
         * shutdown); the keeper guarantees it is gone after the grace period. */
        int64_t until = hvd_now_ms() + TASK_SETTLE_MS + t->cfg.grace_ms + TASK_END_SLACK_MS;
        while (!t->ended && task_wait_until(t, until)) {
        }
    }
    bool ended = t->ended;
    int code = t->exit_code;
    /* A command that ended without being aborted ended on its own: that is its result. */
    bool aborted = t->abort_why != ABORT_NONE && (!ended || t->abort_sent);
    pthread_mutex_unlock(&t->mu);
    if (aborted) return aborted_err(t, err);
    *exit_code = code;
    return 0;
}

/* ---- A sibling ------------------------------------------------------------------------------- */

typedef struct sibling {
    hvd_task *t;
    uint32_t first;
    bool sent_abort; /* we asked the first task to abort */
} sibling;

/* The sibling is aborting: the first task's command goes too, since the ranks this task
 * stands for could no longer report. Sent on the WAIT_EXIT connection, which then answers
 * with the exit code once the command has gone. */
static void sibling_interrupt(hvd_client *c, void *user) {
    sibling *s = user;
    hvd_err err;
    s->sent_abort = true;
    if (hvd_client_send(c, &hvd_abort_desc, NULL, &err) != 0)
        task_log(s->t, HVD_LOG_WARN, "cannot ask task %u to abort: %s", s->first, err.msg);
    else
        task_log(s->t, HVD_LOG_INFO, "asked task %u to abort the command of host %s", s->first,
                 s->t->host_hash);
}

static int run_sibling(hvd_task *t, hvd_client *driver, uint32_t first, int *exit_code,
                       hvd_err *err) {
    task_log(t, HVD_LOG_INFO, "%s runs nothing: task %u runs the command of host %s", t->name,
             first, t->host_hash);
    hvd_client *fc = hvd_task_connect(driver, &t->cfg.secret, first, err);
    if (!fc) {
        hvd_err_prefix(err, "cannot reach task %u, which runs the command of host %s: ", first,
                       t->host_hash);
        return -1;
    }
    sibling s = {t, first, false};
    hvd_exit_msg ex;
    int rc = hvd_client_call_stream(fc, &hvd_wait_exit_desc, NULL, NULL, &s, t->abort_efd,
                                    sibling_interrupt, &hvd_exit_desc, &ex, -1, err);
    hvd_client_close(fc);
    pthread_mutex_lock(&t->mu);
    bool aborted = t->abort_why != ABORT_NONE;
    pthread_mutex_unlock(&t->mu);
    if (rc == 0)
        task_log(t, HVD_LOG_INFO, "the command of task %u ended with exit code %d", first,
                 ex.exit_code);
    /* An answer that came before we asked for an abort is the command's own end. */
    if (aborted && (rc != 0 || s.sent_abort)) return aborted_err(t, err);
    if (rc != 0) {
        hvd_err_prefix(err, "lost task %u, which runs the command of host %s: ", first,
                       t->host_hash);
        return -1;
    }
    *exit_code = ex.exit_code;
    return 0;
}

/* ---- hvd_task_run ---------------------------------------------------------------------------- */

static int run_body(hvd_task *t, int *exit_code, hvd_err *err) {
    int secs = t->cfg.start_timeout_ms / 1000;
    int64_t deadline = hvd_now_ms() + t->cfg.start_timeout_ms;
    pthread_mutex_lock(&t->mu);
    while (!t->registration_done && t->abort_why == ABORT_NONE && task_wait_until(t, deadline)) {
    }
    bool done = t->registration_done;
    bool aborted = t->abort_why != ABORT_NONE;
    pthread_mutex_unlock(&t->mu);
    if (aborted) return aborted_err(t, err);
    if (!done)
        return hvd_err_set(err, HVD_E_TIMEOUT,
                           "%s was not told within %d s that every task registered: are all "
                           "tasks running, and can the driver reach this one?",
                           t->name, secs);

    hvd_client *d = task_driver_connect(t, TASK_DRIVER_PROBE_MS, err);
    if (!d) {
        hvd_err_prefix(err, "cannot reach the driver: ");
        return -1;
    }
    hvd_host_msg hq = {.host_hash = t->host_hash};
    hvd_indices_msg hi;
    int rc = -1;
    if (hvd_client_call(d, &hvd_host_indices_desc, &hq, &hvd_indices_desc, &hi, 0, HVD_CALL_RETRY,
                        err) != 0) {
        hvd_err_prefix(err, "cannot learn the tasks of host %s: ", t->host_hash);
    } else if (hi.indices.n == 0) {
        hvd_err_set(err, HVD_E_NOT_FOUND, "the driver lists no task for host %s", t->host_hash);
    } else if (hi.indices.v[0] == t->cfg.index) {
        hvd_client_close(d);
        d = NULL;
        rc = run_first(t, exit_code, err);
    } else {
        rc = run_sibling(t, d, hi.indices.v[0], exit_code, err);
    }
    hvd_msg_free(&hvd_indices_desc, &hi);
    hvd_client_close(d);
    return rc;
}

/* ---- Elastic --------------------------------------------------------------------------------- */

/* Serves commands (handlers.c) until the driver shuts the job down or something aborts the
 * task; a command still running then is aborted by the loop (held.c). */
static int run_elastic(hvd_task *t, int *exit_code, hvd_err *err) {
    task_log(t, HVD_LOG_INFO, "%s serves the commands of an elastic job on host %s", t->name,
             t->host_hash);
    pthread_mutex_lock(&t->mu);
    while (t->abort_why == ABORT_NONE)
        task_wait_until(t, -1);
    int64_t until = hvd_now_ms() + TASK_SETTLE_MS + t->cfg.grace_ms + TASK_END_SLACK_MS;
    while (t->started && !t->ended && task_wait_until(t, until)) {
    }
    task_abort why = t->abort_why;
    int code = t->ended ? t->exit_code : 0;
    pthread_mutex_unlock(&t->mu);
    if (why != ABORT_DRIVER_SHUTDOWN) return aborted_err(t, err);
    *exit_code = code;
    return 0;
}

/* The watcher outlives hvd_task_run: after the command, hvd_task_stop keeps answering late
 * WAIT_EXITs for the minimum lifetime, unless the driver shuts the job down first (every
 * task then ends, so nobody needs the code any more), which the watcher hears. */
int hvd_task_run(hvd_task *t, int *exit_code, hvd_err *err) {
    if (!t->watch) {
        watcher *w = calloc(1, sizeof *w);
        if (w) watcher_start(w, t);
        pthread_mutex_lock(&t->mu);
        t->watch = w; /* task_watch_ending reads it from any thread */
        pthread_mutex_unlock(&t->mu);
    }
    int code = 0;
    int rc = t->cfg.elastic ? run_elastic(t, &code, err) : run_body(t, &code, err);
    if (rc == 0 && exit_code) *exit_code = code;
    pthread_mutex_lock(&t->mu);
    t->ended_normally = rc == 0;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void task_watch_ending(hvd_task *t, const char *why) {
    pthread_mutex_lock(&t->mu); /* t->watch stays while it is held */
    if (!t->ending_why[0]) snprintf(t->ending_why, sizeof t->ending_why, "%s", why);
    watcher *w = t->watch;
    if (w && w->running) {
        atomic_store(&w->stop, true); /* its call ends now: nothing more to watch */
        uint64_t one = 1;
        (void)!write(w->stop_efd, &one, sizeof one);
    }
    pthread_mutex_unlock(&t->mu);
}

void task_watch_stop(hvd_task *t) {
    pthread_mutex_lock(&t->mu);
    watcher *w = t->watch;
    t->watch = NULL;
    pthread_mutex_unlock(&t->mu);
    if (!w) return;
    watcher_stop(w);
    free(w);
}
