/* The command's output, from its pipes to the subscribers (or to our own stdout/stderr), and
 * the command's end. Everything here runs on the server's loop thread.
 *
 * Back-pressure: a chunk is formatted only when every sink has room for a whole chunk
 * (hvd_call_stream_room, or the local queue's room). When one has not, the pipes are taken
 * off the loop (paused) and the sinks without room are asked to call back when they have
 * drained (hvd_call_on_writable, hvd_local_out_notify). The command then fills its pipe and
 * blocks in write(). So the service holds at most one read buffer per pipe, one formatted
 * chunk, and what the server's per-connection bound allows: it never buffers without bound.
 * The agent that ran the command (the runner) must get every byte, so while it is behind the
 * command waits, and if it stops reading altogether the server's write timeout drops it. An
 * ATTACH subscriber is only watching: one that holds the output back for TASK_SUB_STALL_MS is
 * answered with an error and left out, so that it cannot freeze the job's output for everybody
 * until the write timeout (30 s). Either way the others resume.
 *
 * The command has ended when its exit descriptor fired (the keeper is gone, so every
 * process of the command is gone) and both pipes reached end-of-file with everything read
 * delivered. Then subscribers and WAIT_EXIT calls get the exit code. */
#include "pump.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/io.h"
#include "common/loop.h"
#include "common/proc.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "local_out.h"
#include "notes.h"
#include "output.h"
#include "state.h"

static void check_end(hvd_task *t);
static void on_pipe(int fd, uint32_t events, void *arg);

static bool has_active_subs(const hvd_task *t) {
    for (const task_sub *s = t->subs; s; s = s->next)
        if (s->call && s->active) return true;
    return false;
}

static void loop_local_room(void *arg) {
    pump_resume(arg);
}

/* Writer thread: the local queue drained; continue on the loop. */
static void on_local_room(void *arg) {
    hvd_task *t = arg;
    hvd_loop_post(hvd_server_loop(t->srv), loop_local_room, t);
}

/* Whether every sink can take a whole chunk now. Starts the local sink on first use. */
static bool room_ok(hvd_task *t) {
    bool any = false;
    for (task_sub *s = t->subs; s; s = s->next) {
        if (!s->call || !s->active) continue;
        any = true;
        if (hvd_call_stream_room(s->call) < TASK_CHUNK_MAX + TASK_CHUNK_SLACK) return false;
    }
    if (any) return true;
    if (!t->local && !t->local_failed) {
        hvd_err err;
        t->local = hvd_local_out_create(TASK_LOCAL_MAX, on_local_room, t, &err);
        t->local_failed = !t->local;
        if (t->local_failed)
            task_log(t, HVD_LOG_WARN, "writing the command's output directly: %s", err.msg);
    }
    if (!t->local) return true; /* deliver() then writes synchronously */
    return hvd_local_out_room(t->local) >= TASK_CHUNK_MAX;
}

static void on_sub_writable(void *arg) {
    task_sub *s = arg;
    s->armed = false;
    s->behind_ms = 0;
    pump_resume(s->t);
}

static bool sub_behind(const task_sub *s) {
    return s->call && s->active &&
           hvd_call_stream_room(s->call) < TASK_CHUNK_MAX + TASK_CHUNK_SLACK;
}

static void arm_stall_timer(hvd_task *t, int delay_ms);

/* Loop timer: answers the ATTACH subscribers that held the output back for TASK_SUB_STALL_MS
 * with an error, then lets the output go on to the others. */
static void drop_stalled(void *arg) {
    hvd_task *t = arg;
    t->stall_timer = 0;
    if (!t->cmd || !t->paused || t->loop_stopping) return;
    int64_t now = hvd_now_ms(), next = 0;
    bool dropped = false;
    for (task_sub *s = t->subs; s; s = s->next) {
        if (s->runner || !s->behind_ms || !sub_behind(s)) continue;
        int64_t left = s->behind_ms + TASK_SUB_STALL_MS - now;
        if (left > 0) {
            if (!next || left < next) next = left;
            continue;
        }
        task_log(t, HVD_LOG_WARN,
                 "dropped the subscriber at %s: it read none of the command's "
                 "output for %d ms while the others waited",
                 s->peer, TASK_SUB_STALL_MS);
        hvd_call *c = s->call;
        s->call = NULL; /* answered: swept below */
        hvd_call_fail(c, HVD_E_TIMEOUT,
                      "%s: dropped: this subscriber read none of the command's "
                      "output for %d ms while the others waited",
                      t->name, TASK_SUB_STALL_MS);
        dropped = true;
    }
    if (next) arm_stall_timer(t, (int)next);
    if (dropped) pump_call_gone(t);
}

static void arm_stall_timer(hvd_task *t, int delay_ms) {
    if (!t->stall_timer)
        t->stall_timer = hvd_loop_timer(hvd_server_loop(t->srv), delay_ms, drop_stalled, t);
}

/* Takes the pipes off the loop and asks the sinks without room to call back. */
static void pause_pipes(hvd_task *t) {
    if (!t->paused) {
        t->paused = true;
        for (int i = 0; i < 2; i++) {
            task_pipe *p = &t->pipes[i];
            hvd_loop_unwatch(hvd_server_loop(t->srv), p->watch);
            p->watch = NULL;
        }
        task_log(t, HVD_LOG_DEBUG, "output paused: a reader is behind");
    }
    bool any = false;
    for (task_sub *s = t->subs; s; s = s->next) {
        if (!s->call || !s->active) continue;
        any = true;
        if (!s->armed && sub_behind(s)) {
            s->armed = true;
            hvd_call_on_writable(s->call, on_sub_writable, s);
        }
        if (s->armed && !s->runner) {
            if (!s->behind_ms) s->behind_ms = hvd_now_ms();
            arm_stall_timer(t, TASK_SUB_STALL_MS);
        }
    }
    if (!any && t->local) hvd_local_out_notify(t->local);
}

/* Hands one formatted chunk to every subscriber, or to our own stream if there is none. */
static void deliver(hvd_task *t, task_pipe *p, const uint8_t *data, size_t len) {
    if (has_active_subs(t)) {
        for (task_sub *s = t->subs; s; s = s->next) {
            /* A failed send closed the connection; its cancel callback cleared s->call. */
            if (s->call && s->active) hvd_call_stream(s->call, p->channel, data, len);
        }
        return;
    }
    if (t->local && hvd_local_out_write(t->local, p->local_fd, data, len) == 0) return;
    /* No writer thread, or no memory for the copy: write it here rather than lose it (or
     * drop it on a write error: output has nowhere to go then). */
    (void)hvd_write_all(p->local_fd, data, len);
}

/* Delivers what p holds. Returns false if it had to pause (input left in p). */
static bool drain(hvd_task *t, task_pipe *p) {
    while (p->off < p->len) {
        if (!room_ok(t)) {
            pause_pipes(t);
            return false;
        }
        size_t used = 0;
        size_t n = hvd_output_format(&p->fmt, p->buf + p->off, p->len - p->off, t->fbuf,
                                     TASK_CHUNK_MAX, &used);
        p->off += used;
        if (n > 0) deliver(t, p, t->fbuf, n);
    }
    p->off = p->len = 0;
    return true;
}

static int watch_pipe(hvd_task *t, task_pipe *p, hvd_err *err) {
    if (p->fd < 0 || p->watch) return 0;
    p->watch = hvd_loop_watch(hvd_server_loop(t->srv), p->fd, EPOLLIN, on_pipe, p, err);
    return p->watch ? 0 : -1;
}

void pump_resume(hvd_task *t) {
    if (!t->cmd || t->loop_stopping) return;
    if (t->paused) {
        if (!room_ok(t)) {
            pause_pipes(t); /* re-arm the sinks still behind */
            return;
        }
        t->paused = false;
        task_log(t, HVD_LOG_DEBUG, "output resumed");
        for (int i = 0; i < 2; i++)
            if (!drain(t, &t->pipes[i])) return;
    }
    for (int i = 0; i < 2; i++) {
        hvd_err err;
        if (watch_pipe(t, &t->pipes[i], &err) != 0) {
            task_log(t, HVD_LOG_ERROR, "cannot read the command's output: %s", err.msg);
            hvd_proc_abort(t->cmd);
        }
    }
    check_end(t);
}

static void on_pipe(int fd, uint32_t events, void *arg) {
    (void)events;
    task_pipe *p = arg;
    hvd_task *t = p->t;
    if (t->paused || p->off < p->len) return; /* not expected: unwatched while paused */
    ssize_t n = read(fd, p->buf, TASK_READ_MAX);
    if (n > 0) {
        p->off = 0;
        p->len = (size_t)n;
        drain(t, p);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    /* End-of-file: every process holding the write end has exited (or a read error, which
     * a pipe does not produce; treat it the same). */
    hvd_loop_unwatch(hvd_server_loop(t->srv), p->watch);
    p->watch = NULL;
    p->fd = -1;
    check_end(t);
}

static void on_exit_fd(int fd, uint32_t events, void *arg) {
    (void)fd;
    (void)events;
    hvd_task *t = arg;
    hvd_loop_unwatch(hvd_server_loop(t->srv), t->exit_watch);
    t->exit_watch = NULL;
    t->exit_seen = true;
    /* Reaped now, not once the pipes are closed: a keeper that was killed leaves its command
     * holding them, and reaping is what takes that command down (hvd_proc_reap). */
    (void)hvd_proc_reap(t->cmd, NULL);
    check_end(t);
}

int pump_start(hvd_task *t, bool prefix, bool timestamps, hvd_err *err) {
    if (!t->fbuf) {
        t->fbuf = malloc(TASK_CHUNK_MAX);
        t->pipes[0].buf = malloc(TASK_READ_MAX);
        t->pipes[1].buf = malloc(TASK_READ_MAX);
        if (!t->fbuf || !t->pipes[0].buf || !t->pipes[1].buf)
            return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    for (int i = 0; i < 2; i++) {
        task_pipe *p = &t->pipes[i];
        p->t = t;
        p->fd = i == 0 ? hvd_proc_stdout_fd(t->cmd) : hvd_proc_stderr_fd(t->cmd);
        p->channel = i == 0 ? HVD_CHANNEL_STDOUT : HVD_CHANNEL_STDERR;
        p->local_fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
        p->watch = NULL;
        p->off = p->len = 0;
        hvd_output_opts o = {.index = prefix ? (int)t->cfg.index : -1,
                             .stream = i == 0 ? HVD_OUTPUT_STDOUT : HVD_OUTPUT_STDERR,
                             .timestamp = timestamps};
        hvd_output_init(&p->fmt, &o);
        if (watch_pipe(t, p, err) != 0) return -1;
    }
    t->exit_watch = hvd_loop_watch(hvd_server_loop(t->srv), hvd_proc_exit_fd(t->cmd), EPOLLIN,
                                   on_exit_fd, t, err);
    return t->exit_watch ? 0 : -1;
}

void pump_stop(hvd_task *t) {
    hvd_loop_timer_cancel(hvd_server_loop(t->srv), t->stall_timer);
    t->stall_timer = 0;
    for (int i = 0; i < 2; i++) {
        task_pipe *p = &t->pipes[i];
        hvd_loop_unwatch(hvd_server_loop(t->srv), p->watch);
        p->watch = NULL;
        p->fd = -1;
        p->off = p->len = 0;
    }
    hvd_loop_unwatch(hvd_server_loop(t->srv), t->exit_watch);
    t->exit_watch = NULL;
}

void pump_reply_exit(const hvd_task *t, hvd_call **call) {
    hvd_call *c = *call;
    *call = NULL; /* before replying: a failed send cancels (and frees) the call */
    hvd_exit_msg ex = {.exit_code = t->exit_code, .signal = t->exit_signal};
    hvd_call_reply(c, &hvd_exit_desc, &ex);
}

void pump_recycle(hvd_task *t) {
    pump_stop(t);
    hvd_proc_free(t->cmd); /* ended: returns at once */
    t->cmd = NULL;
    t->exit_seen = false;
    t->paused = false;
    pthread_mutex_lock(&t->mu);
    t->started = false;
    t->ended = false;
    t->exit_code = 0;
    t->exit_signal = 0;
    t->abort_sent = false;
    pthread_mutex_unlock(&t->mu);
    free(t->shm_dir); /* its keeper removed the directory; the next command gets a new one */
    t->shm_dir = NULL;
    pump_sweep(t);
}

void pump_reply_waiter(const hvd_task *t, task_waiter *w) {
    if (!w->status) {
        pump_reply_exit(t, &w->call);
        return;
    }
    hvd_call *c = w->call;
    w->call = NULL; /* as in pump_reply_exit */
    hvd_status_msg st = {.started = true, .ended = true, .exit_code = t->exit_code};
    hvd_call_reply(c, &hvd_status_desc, &st);
}

static void check_end(hvd_task *t) {
    if (!t->cmd || !t->exit_seen || t->ended) return;
    for (int i = 0; i < 2; i++)
        if (t->pipes[i].fd >= 0 || t->pipes[i].off < t->pipes[i].len) return;
    int code = 0;
    int r = hvd_proc_reap(t->cmd, &code);
    if (r == 1) return; /* not expected once the exit fd fired */
    if (r < 0) {
        task_log(t, HVD_LOG_ERROR, "cannot collect the command's exit status: %s", strerror(errno));
        code = 255;
    }
    /* The command runs in /bin/sh -c, which exits 128 + N when the program in it was killed by
     * signal N (when the shell exec'd it, the shell itself was killed). */
    int sig = hvd_proc_exit_signal(t->cmd);
    if (!sig && code > 128 && code < 128 + 32) sig = code - 128;
    pthread_mutex_lock(&t->mu);
    t->ended = true;
    t->exit_code = code;
    t->exit_signal = t->abort_sent ? 0 : sig; /* only a kill nobody here asked for */
    bool unasked = !t->abort_sent && t->abort_why == ABORT_NONE;
    t->ended_ms = hvd_now_ms();
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    task_log(t, HVD_LOG_INFO, "the command ended with exit code %d", code);
    if (unasked && (code != 0 || sig)) task_note(t, HVD_TASK_EV_COMMAND_ENDED, code, sig, NULL);

    for (task_sub *s = t->subs; s; s = s->next)
        if (s->call) pump_reply_exit(t, &s->call);
    for (task_waiter *w = t->waiters; w; w = w->next)
        if (w->call) pump_reply_waiter(t, w);
    pump_call_gone(t);
}

static void loop_tidy(void *arg) {
    hvd_task *t = arg;
    t->tidy_posted = false;
    pump_sweep(t);
    pump_resume(t);
}

void pump_call_gone(hvd_task *t) {
    if (t->tidy_posted || t->loop_stopping) return;
    if (hvd_loop_post(hvd_server_loop(t->srv), loop_tidy, t) == 0) t->tidy_posted = true;
}

void pump_sweep(hvd_task *t) {
    for (task_sub **pp = &t->subs; *pp;) {
        task_sub *s = *pp;
        if (s->call) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        free(s);
    }
    for (task_waiter **pp = &t->waiters; *pp;) {
        task_waiter *w = *pp;
        if (w->call) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        free(w);
    }
}
