/* Held calls and aborts: see held.h. The loop holds subscribers and WAIT_EXIT calls until the
 * command ends (pump.c answers them then); an abort, from any thread, reaches the command
 * and those calls here, on the loop. */
#include "held.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/loop.h"
#include "common/proc.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "notes.h"
#include "pump.h"
#include "state.h"

/* ---- Held calls ------------------------------------------------------------------------------ */

static void sub_cancelled(void *arg) {
    task_sub *s = arg;
    hvd_task *t = s->t;
    s->call = NULL;
    s->armed = false;
    task_log(t, HVD_LOG_DEBUG, "a subscriber went away");
    pthread_mutex_lock(&t->mu);
    bool asked = t->abort_sent || t->abort_why != ABORT_NONE;
    pthread_mutex_unlock(&t->mu);
    /* The agent that started the command died while it ran, and nobody here ended it. */
    if (s->runner && t->cmd && !t->ended && !asked) {
        task_log(t, HVD_LOG_WARN, "the agent that started the command (at %s) went away", s->peer);
        task_note(t, HVD_TASK_EV_AGENT_GONE, 0, 0, s->peer);
    }
    pump_call_gone(t);
}

static void waiter_cancelled(void *arg) {
    task_waiter *w = arg;
    w->call = NULL;
    pump_call_gone(w->t);
}

void held_add_sub(hvd_task *t, hvd_call *call, bool active, bool runner) {
    task_sub *s = calloc(1, sizeof *s);
    if (!s) {
        hvd_call_fail(call, HVD_E_INTERNAL, "%s is out of memory", t->name);
        return;
    }
    s->t = t;
    s->call = call;
    s->active = active;
    s->runner = runner;
    snprintf(s->peer, sizeof s->peer, "%s", hvd_call_peer_host(call));
    task_sub **pp = &t->subs;
    while (*pp)
        pp = &(*pp)->next;
    *pp = s;
    hvd_call_on_cancel(call, sub_cancelled, s);
}

void held_activate_subs(hvd_task *t) {
    for (task_sub *s = t->subs; s; s = s->next)
        s->active = true;
}

void held_add_waiter(hvd_task *t, hvd_call *call, bool status) {
    task_waiter *w = calloc(1, sizeof *w);
    if (!w) {
        hvd_call_fail(call, HVD_E_INTERNAL, "%s is out of memory", t->name);
        return;
    }
    w->t = t;
    w->call = call;
    w->status = status;
    w->next = t->waiters;
    t->waiters = w;
    hvd_call_on_cancel(call, waiter_cancelled, w);
}

static void fail_held(hvd_call **call, int code, const char *msg) {
    hvd_call *c = *call;
    *call = NULL; /* before answering: a failed send cancels (and frees) the call */
    hvd_call_fail(c, code, "%s", msg);
}

/* Fails the ATTACH calls held for a command and the WAIT_EXIT calls. */
static void fail_waiting(hvd_task *t, int code, const char *msg) {
    for (task_sub *s = t->subs; s; s = s->next)
        if (s->call && !s->active) fail_held(&s->call, code, msg);
    for (task_waiter *w = t->waiters; w; w = w->next)
        if (w->call) fail_held(&w->call, code, msg);
    pump_call_gone(t);
}

void task_loop_quiesce(void *arg) {
    hvd_task *t = arg;
    t->loop_stopping = true;
    char msg[128];
    snprintf(msg, sizeof msg, "%s is stopping before its command ended", t->name);
    for (task_sub *s = t->subs; s; s = s->next) {
        if (!s->call) continue;
        if (t->ended)
            pump_reply_exit(t, &s->call);
        else
            fail_held(&s->call, HVD_E_SHUTDOWN, msg);
    }
    for (task_waiter *w = t->waiters; w; w = w->next) {
        if (!w->call) continue;
        if (t->ended)
            pump_reply_waiter(t, w);
        else
            fail_held(&w->call, HVD_E_SHUTDOWN, msg);
    }
    pump_sweep(t);
    pthread_mutex_lock(&t->mu);
    t->loop_quiesced = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* ---- Aborts ---------------------------------------------------------------------------------- */

void task_loop_abort(void *arg) {
    hvd_task *t = arg;
    if (t->cmd) {
        if (!t->ended) {
            pthread_mutex_lock(&t->mu);
            bool again = t->abort_sent;
            t->abort_sent = true;
            pthread_mutex_unlock(&t->mu);
            if (again) return; /* the keeper is at it */
            task_log(t, HVD_LOG_INFO,
                     "aborting the command: SIGTERM to all its processes, SIGKILL after %d ms",
                     t->cfg.grace_ms);
            hvd_proc_abort(t->cmd);
        }
        return;
    }
    if (t->refused || t->cfg.elastic) return; /* elastic: the next command is welcome */
    t->refused = true;
    char msg[128];
    snprintf(msg, sizeof msg, "%s was aborted before a command started", t->name);
    fail_waiting(t, HVD_E_STATE, msg);
}

void task_loop_kill(hvd_task *t) {
    if (!t->cmd || t->ended) return;
    pthread_mutex_lock(&t->mu);
    t->abort_sent = true;
    pthread_mutex_unlock(&t->mu);
    task_log(t, HVD_LOG_INFO, "killing the command: SIGKILL to all its processes");
    hvd_proc_kill(t->cmd);
}

/* Loop: interrupts the blocking calls of hvd_task_run and aborts the command. */
static void loop_abort_now(void *arg) {
    hvd_task *t = arg;
    uint64_t one = 1;
    (void)!write(t->abort_efd, &one, sizeof one);
    task_loop_abort(t);
}

/* Loop: the driver shut the job down. That is also how every job ends (the driver shuts the
 * tasks down as soon as mpirun is gone, while orted may still be exiting), so the command
 * and the first task's WAIT_EXIT get a moment to end on their own before the abort. */
static void loop_abort_later(void *arg) {
    hvd_task *t = arg;
    if (hvd_loop_timer(hvd_server_loop(t->srv), TASK_SETTLE_MS, loop_abort_now, t) == 0)
        loop_abort_now(t);
}

void task_request_abort(hvd_task *t, task_abort why, const char *detail) {
    pthread_mutex_lock(&t->mu);
    bool first = t->abort_why == ABORT_NONE;
    if (why == ABORT_DRIVER_SHUTDOWN) t->job_over = true;
    if (first) {
        t->abort_why = why;
        snprintf(t->abort_detail, sizeof t->abort_detail, "%s", detail);
    }
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    hvd_loop_fn fn = loop_abort_now;
    if (why == ABORT_DRIVER_SHUTDOWN) {
        if (!first) return; /* something else is ending the task already */
        fn = loop_abort_later;
    }
    task_log(t, why == ABORT_DRIVER_GONE ? HVD_LOG_ERROR : HVD_LOG_INFO, "%s: ending", detail);
    if (hvd_loop_on_thread(hvd_server_loop(t->srv)))
        fn(t);
    else
        hvd_loop_post(hvd_server_loop(t->srv), fn, t);
}
