/* What failed in a job, as the driver saw it: the agents' watches and reports (AGENT_WATCH,
 * AGENT_REPORT), lost task services, and the ranks' results, put in the order they reached
 * the driver, so that the part that failed first on its own can be named
 * (hvd_driver_failure) rather than one that was merely stopped because of it. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"
#include "hvd/launch.h"
#include "hvd/proto.h"

/* ---- The jobs' MPI ------------------------------------------------------------------------- */

/* Declared in hvd/launch.h, with the MPI names; here because the driver's sentences use them
 * (libhvd_driver does not link libhvd_launch). */

const char *hvd_mpi_daemon(hvd_mpi_impl mpi) {
    switch (mpi) {
    case HVD_MPI_OPENMPI5:
        return "prted";
    case HVD_MPI_MPICH:
        return "hydra_pmi_proxy";
    default:
        return "orted";
    }
}

void hvd_driver_set_mpi(hvd_driver *d, hvd_mpi_impl mpi) {
    pthread_mutex_lock(&d->mu);
    d->mpi = mpi;
    pthread_mutex_unlock(&d->mu);
}

hvd_mpi_impl hvd_driver_mpi(hvd_driver *d) {
    pthread_mutex_lock(&d->mu);
    hvd_mpi_impl mpi = d->mpi;
    pthread_mutex_unlock(&d->mu);
    return mpi;
}

/* The daemon of the jobs' MPI (d->mu held). */
static const char *daemon_of(const hvd_driver *d) {
    return hvd_mpi_daemon(d->mpi);
}

/* ---- Events ------------------------------------------------------------------------------ */

/* Records an event (d->mu held) and returns it; the first DRV_EVENTS_MAX are kept (NULL
 * beyond). */
static drv_event *add_event(hvd_driver *d, uint32_t agent, bool weak, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static drv_event *add_event(hvd_driver *d, uint32_t agent, bool weak, const char *fmt, ...) {
    if (d->nevents >= DRV_EVENTS_MAX) return NULL;
    drv_event *e = &d->events[d->nevents++];
    *e = (drv_event){.seq = ++d->reg.seq, .agent = agent, .weak = weak};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->text, sizeof e->text, fmt, ap);
    va_end(ap);
    return e;
}

void hvd_driver_launch_failed(hvd_driver *d, const char *text) {
    pthread_mutex_lock(&d->mu);
    drv_event *e = add_event(d, 0, false, "%s", text);
    if (e) e->launch = true;
    pthread_mutex_unlock(&d->mu);
}

void hvd_driver_stopping_job(hvd_driver *d) {
    pthread_mutex_lock(&d->mu);
    if (!d->stopping_seq) d->stopping_seq = d->reg.seq + 1; /* seq from here on: after it */
    pthread_mutex_unlock(&d->mu);
}

/* Forgets the "went away" events of an agent that turned out to be alive (its report came on
 * another connection after a reconnect). d->mu held. */
static void drop_agent_events(hvd_driver *d, uint32_t pid) {
    size_t k = 0;
    for (size_t i = 0; i < d->nevents; i++)
        if (d->events[i].agent != pid) d->events[k++] = d->events[i];
    d->nevents = k;
}

/* Events that still mean something: not once the driver is ending the job (d->mu held). */
static bool job_running(const hvd_driver *d) {
    return !d->tasks_shutdown;
}

/* ---- Agents ------------------------------------------------------------------------------ */

static void agent_unlink(hvd_driver *d, drv_agent *a) {
    if (a->prev)
        a->prev->next = a->next;
    else
        d->agents = a->next;
    if (a->next) a->next->prev = a->prev;
}

/* The agent's connection closed: without a report first, the agent died. */
static void on_agent_gone(void *arg) {
    drv_agent *a = arg;
    hvd_driver *d = a->d;
    pthread_mutex_lock(&d->mu);
    if (!a->reported && job_running(d))
        add_event(d, a->pid, true,
                  "the agent of host %s (hvd-rsh, pid %u) went away without reporting how its "
                  "command (%s) ended: was it killed?",
                  a->host_hash, a->pid, daemon_of(d));
    pthread_mutex_unlock(&d->mu);
    agent_unlink(d, a);
    free(a);
}

static void on_agent_watch(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_agent_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_agent_watch_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    drv_agent *a = calloc(1, sizeof *a);
    if (!a) {
        hvd_msg_free(&hvd_agent_watch_desc, &m);
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory");
        return;
    }
    *a = (drv_agent){.d = d, .call = call, .pid = m.pid, .next = d->agents};
    snprintf(a->host_hash, sizeof a->host_hash, "%s", m.host_hash ? m.host_hash : "?");
    hvd_msg_free(&hvd_agent_watch_desc, &m);
    if (d->agents) d->agents->prev = a;
    d->agents = a;
    pthread_mutex_lock(&d->mu);
    drv_host *h = drv_reg_host(&d->reg, a->host_hash);
    if (h) h->agent_seen = true;
    pthread_mutex_unlock(&d->mu);
    hvd_call_on_cancel(call, on_agent_gone, a); /* never answered: held until it closes */
}

/* The signal's name for a sentence: "9 (Killed)". */
static void signal_text(int sig, char *buf, size_t cap) {
    const char *name = sig > 0 && sig < 65 ? strsignal(sig) : NULL;
    snprintf(buf, cap, "%d%s%s%s", sig, name ? " (" : "", name ? name : "", name ? ")" : "");
}

/* What a report says went wrong, as an event (d->mu held); nothing for a command that ended
 * (the task service tells how: TASK_EV_COMMAND_ENDED), or whose end mpirun asked for. */
static void report_event(hvd_driver *d, const hvd_agent_report_msg *m) {
    const char *host = m->host_hash ? m->host_hash : "?";
    char task[32] = "";
    if (m->index >= 0) snprintf(task, sizeof task, " (task %d)", m->index);
    if (m->lost)
        add_event(d, 0, false,
                  "the agent of host %s (hvd-rsh) lost the task service%s that ran %s: %s", host,
                  task, daemon_of(d), m->error ? m->error : "its connection broke");
    else if (!m->started && m->error)
        add_event(d, 0, false, "the agent of host %s (hvd-rsh) could not start %s%s: %s", host,
                  daemon_of(d), task, m->error);
    else if (m->error) /* stopped from outside: a signal not from mpirun */
        add_event(d, 0, false, "the agent of host %s (hvd-rsh) was %s", host, m->error);
}

static void on_agent_report(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_agent_report_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_agent_report_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    for (drv_agent *a = d->agents; a; a = a->next)
        if (a->pid == m.pid && m.host_hash && strcmp(a->host_hash, m.host_hash) == 0)
            a->reported = true;
    pthread_mutex_lock(&d->mu);
    drop_agent_events(d, m.pid);
    if (job_running(d)) report_event(d, &m);
    pthread_mutex_unlock(&d->mu);
    hvd_msg_free(&hvd_agent_report_desc, &m);
    hvd_call_reply(call, &hvd_ack_desc, NULL);
}

/* ---- Task services' events ------------------------------------------------------------------ */

/* The daemon of task `index` on host could not run: its shell did not find it (exit status
 * 127; the executor lacks the MPI, or has it off its PATH) or could not execute it (126). One
 * event that says so and what to do (d->mu held). Not weak: nothing else makes sh exit so. */
static void daemon_not_run(hvd_driver *d, const char *host, uint32_t index, int code) {
    const char *daemon = daemon_of(d);
    if (code == 126) {
        add_event(d, 0, false,
                  "%s could not start on host %s (task %u): that executor's shell found %s but "
                  "could not run it (exit status 126: not executable, or not a program for that "
                  "machine); check the MPI install on that executor",
                  daemon, host, index, daemon);
    } else if (d->mpi == HVD_MPI_MPICH) { /* Hydra runs its proxy by the path mpiexec has */
        add_event(d, 0, false,
                  "%s could not start on host %s (task %u): that executor has no %s where the "
                  "driver's mpiexec has it (its shell could not find it: exit status 127); install "
                  "the driver's MPI (MPICH or Intel MPI) on every executor, at the path it has on "
                  "the driver",
                  daemon, host, index, daemon);
    } else if (d->mpi == HVD_MPI_OPENMPI5) { /* prterun often gives prted's full path */
        add_event(d, 0, false,
                  "%s could not start on host %s (task %u): that executor has no %s on its PATH "
                  "or where the driver's Open MPI has it (its shell could not find it: exit status "
                  "127); install Open MPI 5 (the version of the driver's mpirun) on every "
                  "executor, at the path it has on the driver, or give mpirun --prefix with its "
                  "install dir there",
                  daemon, host, index, daemon);
    } else {
        add_event(d, 0, false,
                  "%s could not start on host %s (task %u): that executor has no %s on its PATH "
                  "(its shell could not find it: exit status 127); install Open MPI (the version "
                  "of the driver's mpirun) on every executor, or give mpirun --prefix with its "
                  "install dir, or put its bin dir on the executors' PATH",
                  daemon, host, index, daemon);
    }
}

/* One TASK_EVENT (d->mu held; t registered). */
static void task_event(hvd_driver *d, uint32_t index, drv_task *t, const hvd_task_event_msg *m) {
    const char *host = t->info.host_hash;
    switch (m->kind) {
    case HVD_TASK_EV_DONE:
        t->done = true;
        break;
    case HVD_TASK_EV_ENDING:
        drv_mark_lost(d, t, 0, m->text ? m->text : "it was stopped");
        break;
    case HVD_TASK_EV_COMMAND_ENDED:
        if (m->signal > 0) {
            char sig[64];
            signal_text(m->signal, sig, sizeof sig);
            add_event(d, 0, false, "%s of host %s (in task %u) was killed by signal %s",
                      daemon_of(d), host, index, sig);
        } else if (m->exit_code == 127 || m->exit_code == 126) {
            daemon_not_run(d, host, index, m->exit_code);
        } else { /* weak: also how orted ends when mpirun is stopped while it starts them */
            add_event(d, 0, true, "%s of host %s (in task %u) exited with status %d", daemon_of(d),
                      host, index, m->exit_code);
        }
        break;
    case HVD_TASK_EV_COMMAND_STARTED: /* spent, whether or not a rank comes (one-shot) */
        t->used = true;
        break;
    case HVD_TASK_EV_AGENT_GONE: /* weak: mpirun kills its agents when it gives up a launch */
        add_event(d, 0, true,
                  "the agent of host %s (hvd-rsh%s%s) went away while %s ran in task %u: was it "
                  "killed?",
                  host, m->text ? " at " : "", m->text ? m->text : "", daemon_of(d), index);
        break;
    default:
        break;
    }
}

static void on_task_event(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_task_event_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_task_event_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    if (m.index >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID, "TASK_EVENT for task %u, outside 0..%u", m.index,
                      d->num_tasks - 1);
        hvd_msg_free(&hvd_task_event_desc, &m);
        return;
    }
    pthread_mutex_lock(&d->mu);
    drv_task *t = &d->reg.tasks[m.index];
    if (t->registered && job_running(d)) task_event(d, m.index, t, &m);
    pthread_mutex_unlock(&d->mu);
    hvd_msg_free(&hvd_task_event_desc, &m);
    hvd_call_reply(call, &hvd_ack_desc, NULL);
}

/* ---- Ranks ------------------------------------------------------------------------------- */

/* The rank's connection closed: before its result, the rank died then (a rank killed
 * outright reports nothing, and mpirun SIGKILLs the others a moment later: which silent rank
 * went first tells the cause from its echoes). */
static void on_rank_gone(void *arg) {
    drv_rank_watch *w = arg;
    hvd_driver *d = w->d;
    pthread_mutex_lock(&d->mu);
    drv_registry *r = &d->reg;
    if (w->job == r->job && w->rank < r->nact && !r->results[w->rank].present &&
        !r->gone_order[w->rank] && job_running(d))
        r->gone_order[w->rank] = ++r->seq;
    pthread_mutex_unlock(&d->mu);
    free(w);
}

static void on_rank_watch(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_rank_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_rank_watch_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    drv_rank_watch *w = malloc(sizeof *w);
    if (!w) {
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory");
        return;
    }
    pthread_mutex_lock(&d->mu);
    *w = (drv_rank_watch){.d = d, .rank = m.rank, .job = d->reg.job};
    uint32_t nranks = d->reg.nact;
    pthread_mutex_unlock(&d->mu);
    if (m.rank >= nranks) {
        free(w);
        hvd_call_fail(call, HVD_E_INVALID, "RANK_WATCH for rank %u, outside 0..%u", m.rank,
                      nranks - 1);
        return;
    }
    hvd_call_on_cancel(call, on_rank_gone, w); /* never answered: held until it closes */
}

int drv_install_agent_handlers(hvd_driver *d) {
    if (hvd_server_handle(d->srv, HVD_MSG_AGENT_WATCH, on_agent_watch, d) != 0 ||
        hvd_server_handle(d->srv, HVD_MSG_RANK_WATCH, on_rank_watch, d) != 0 ||
        hvd_server_handle(d->srv, HVD_MSG_AGENT_REPORT, on_agent_report, d) != 0 ||
        hvd_server_handle(d->srv, HVD_MSG_TASK_EVENT, on_task_event, d) != 0)
        return -1;
    return 0;
}

/* ---- Lost task services -------------------------------------------------------------------- */

/* The task lost first (its index in *first_idx), and the other lost tasks of its host (d->mu
 * held). */
static const drv_task *first_lost(hvd_driver *d, uint32_t *first_idx, uint32_t *idx, size_t cap,
                                  size_t *n) {
    const drv_task *first = NULL;
    *n = 0;
    for (uint32_t i = 0; i < d->num_tasks; i++) {
        const drv_task *t = &d->reg.tasks[i];
        if (t->lost && (!first || t->lost_seq < first->lost_seq)) {
            first = t;
            *first_idx = i;
        }
    }
    for (uint32_t i = 0; first && i < d->num_tasks && *n < cap; i++) {
        const drv_task *t = &d->reg.tasks[i];
        if (t != first && t->lost && strcmp(t->info.host_hash, first->info.host_hash) == 0)
            idx[(*n)++] = i;
    }
    return first;
}

int drv_lost_text(hvd_driver *d, char *buf, size_t cap, uint64_t *seq) {
    uint32_t first, idx[64];
    size_t n;
    const drv_task *t = first_lost(d, &first, idx, sizeof idx / sizeof idx[0], &n);
    if (!t) return -1;
    *seq = t->lost_seq;
    char who[HVD_HOST_MAX + HVD_HOST_HASH_MAX + 192], list[96];
    drv_format_ranges(idx, n, list, sizeof list);
    if (n == 0)
        snprintf(who, sizeof who, "task %u (host %s at %s)", first, t->info.host_hash, t->peer);
    else
        snprintf(who, sizeof who, "task %u (host %s at %s; then also task%s %s of that host)",
                 first, t->info.host_hash, t->peer, n == 1 ? "" : "s", list);
    if (t->lost_why[0]) {
        snprintf(buf, cap, "%s ended while the job ran: %s", who, t->lost_why);
        return 0;
    }
    if (t->lost_err == ETIMEDOUT) {
        snprintf(buf, cap,
                 "lost contact with %s: its connection to the driver timed out (nothing heard "
                 "for about %d s: a network partition, or the host hangs)",
                 who, (d->net_timeout_ms + 999) / 1000);
        return 1;
    }
    snprintf(buf, cap,
             "%s went away while the job ran (its connection to the driver broke%s%s: did the "
             "executor die?)",
             who, t->lost_err ? ": " : "", t->lost_err ? strerror(t->lost_err) : "");
    return 0;
}

bool hvd_driver_lost_during_job(hvd_driver *d, const hvd_rank_result *r, size_t n) {
    uint64_t last = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].present && r[i].order > last) last = r[i].order;
    bool lost = false;
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < d->num_tasks && !lost; i++)
        lost = d->reg.tasks[i].lost && d->reg.tasks[i].lost_seq < last;
    pthread_mutex_unlock(&d->mu);
    return lost;
}

int hvd_driver_next_job(hvd_driver *d, hvd_err *err) {
    pthread_mutex_lock(&d->mu);
    bool down = d->tasks_shutdown;
    drv_registry *r = &d->reg;
    if (!down) {
        drv_reg_new_job(r); /* the same tasks, nothing of the job (nor of its agents) */
        d->nevents = 0;
        d->stopping_seq = 0;
    }
    pthread_mutex_unlock(&d->mu);
    if (down)
        return hvd_err_set(err, HVD_E_STATE,
                           "the task services were shut down after the last job: no job can "
                           "follow");
    drv_release_one_shot(d);
    return 0;
}

/* ---- Agents that never came ----------------------------------------------------------------- */

/* When agents of some hosts reached the driver and others never did, mpirun could not start
 * those (or they died at once): names the first such host into buf (d->mu held). Returns
 * whether there is one. An agent that dies before it reaches the driver leaves no other trace
 * here (mpirun's own message names no host). */
static bool missing_agent(hvd_driver *d, char *buf, size_t cap) {
    size_t seen = 0, missing = 0;
    const drv_host *first = NULL;
    for (size_t i = 0; i < d->reg.nhosts; i++) {
        const drv_host *h = &d->reg.hosts[i];
        if (!drv_host_in_job(&d->reg, h)) continue; /* not in this launch: no agent due */
        if (h->agent_seen) {
            seen++;
        } else if (missing++ == 0) {
            first = h;
        }
    }
    if (!seen || !missing) return false;
    snprintf(buf, cap,
             "the agent of host %s (hvd-rsh) never reached the driver, while %zu of %zu hosts' "
             "agents did: mpirun could not start it, or it died at once",
             first->host_hash, seen, seen + missing);
    return true;
}

size_t hvd_driver_agents_seen(hvd_driver *d, size_t *hosts) {
    size_t seen = 0;
    pthread_mutex_lock(&d->mu);
    *hosts = 0;
    for (size_t i = 0; i < d->reg.nhosts; i++) {
        const drv_host *h = &d->reg.hosts[i];
        if (!drv_host_in_job(&d->reg, h)) continue;
        (*hosts)++;
        seen += h->agent_seen;
    }
    pthread_mutex_unlock(&d->mu);
    return seen;
}

/* ---- The first failure --------------------------------------------------------------------- */

void hvd_rank_failure_text(const hvd_rank_result *b, char *buf, size_t cap) {
    char task[16] = "?";
    if (b->index != UINT32_MAX) snprintf(task, sizeof task, "%u", b->index);
    const char *host = b->host_hash ? b->host_hash : "?";
    if (!b->present)
        snprintf(buf, cap,
                 "rank %d (task %s on %s) ended without reporting a result %s: it was killed "
                 "outright (SIGKILL, the OOM killer?) or crashed",
                 b->rank, task, host,
                 b->gone ? "(the first rank to go silently)" : "while other ranks reported theirs");
    else
        snprintf(buf, cap, "rank %d (task %s on %s) %s %d%s%s", b->rank, task, host,
                 b->stopped ? "was stopped with status" : "exited with status", b->status,
                 b->error ? ": " : "", b->error ? b->error : "");
}

hvd_failure_kind hvd_driver_failure(hvd_driver *d, const hvd_rank_result *r, size_t n, char *buf,
                                    size_t cap) {
    if (cap == 0) return HVD_FAILURE_NONE;
    buf[0] = '\0';
    pthread_mutex_lock(&d->mu);
    /* From `limit` on, in the order things reached the driver, failures followed the
     * launcher's own stop (hvd_driver_stopping_job). */
    uint64_t limit = d->stopping_seq ? d->stopping_seq : UINT64_MAX;
    int bad = drv_first_failed_before(r, n, limit);
    uint64_t best = bad >= 0 && r[bad].present ? r[bad].order : limit;
    hvd_failure_kind kind = best != limit ? HVD_FAILURE_RANK : HVD_FAILURE_NONE;
    if (kind) hvd_rank_failure_text(&r[bad], buf, cap);
    uint64_t seq;
    char lost[HVD_ERR_MAX];
    if (drv_lost_text(d, lost, sizeof lost, &seq) >= 0 && seq < best) {
        best = seq;
        kind = HVD_FAILURE_TASK;
        snprintf(buf, cap, "%s", lost);
    }
    for (size_t i = 0; i < d->nevents; i++)
        if (!d->events[i].weak && d->events[i].seq < best) {
            best = d->events[i].seq;
            kind = d->events[i].launch ? HVD_FAILURE_LAUNCH : HVD_FAILURE_AGENT;
            snprintf(buf, cap, "%s", d->events[i].text);
        }
    bool stopping = d->stopping_seq != 0;
    if (kind == HVD_FAILURE_NONE && !stopping && missing_agent(d, buf, cap))
        kind = HVD_FAILURE_AGENT;
    for (size_t i = 0; i < d->nevents && kind == HVD_FAILURE_NONE; i++)
        if (d->events[i].weak && d->events[i].seq < limit) { /* the first echo-prone event */
            kind = HVD_FAILURE_AGENT;
            snprintf(buf, cap, "%s", d->events[i].text);
        }
    pthread_mutex_unlock(&d->mu);
    if (kind == HVD_FAILURE_NONE && bad >= 0) { /* a silent rank (gone before any stop) */
        hvd_rank_failure_text(&r[bad], buf, cap);
        kind = HVD_FAILURE_SILENT_RANK;
    }
    return kind;
}
