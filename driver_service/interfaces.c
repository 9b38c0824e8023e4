/* Registration complete -> every task is told, the tasks the probe plan names probe the
 * tasks it gives them and report what they reached, and the driver computes the interface
 * names that work between every ordered pair of hosts. The plan (registry.c, drv_reg_plan)
 * probes per host and per network, not per task: the lowest task of a host runs its orted,
 * and hosts that share one network stack are probed as one (a ring proves they do), so
 * 1024 tasks on one machine make about 1024 probes instead of a million (Horovod probes a
 * ring of tasks). Runs on the launcher's thread, never on the loop thread: it makes blocking
 * calls to the tasks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/loop.h"
#include "common/strv.h"
#include "driver_internal.h"
#include "hvd/defaults.h"

/* Threads that tell the tasks at once (1024 tasks: 64 rounds of connect + call). */
#define NOTIFY_THREADS  16
#define NOTIFY_PROBE_MS 10000 /* connect budget per task, within the overall deadline */
#define NOTIFY_IO_MS    30000
#define LIST_PAIRS_MAX  10 /* pairs named in an error before "and N more" */
#define LIST_NAMES_MAX  6

/* Appends to a bounded sentence; text past the end is dropped. */
static void append(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t len, const char *fmt, ...) {
    size_t used = strnlen(buf, len);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* ---- Telling the tasks ------------------------------------------------------------------ */

typedef struct notify_job {
    hvd_driver *d;
    const hvd_task_info *tasks; /* [n] the registrations (read-only, shared) */
    const hvd_peers_msg *msgs;  /* [n] what to tell each task (read-only) */
    uint32_t n;
    int64_t deadline; /* hvd_now_ms() time, < 0: none */
    pthread_mutex_t mu;
    uint32_t next; /* next task to tell (under mu) */
    char **errors; /* [n]: why task i could not be told, or NULL */
} notify_job;

static int min_ms(int64_t a, int64_t b) {
    return (int)(a < b ? a : b);
}

static void *notify_worker(void *arg) {
    notify_job *j = arg;
    const hvd_task_info *tasks = j->tasks;
    uint32_t n = j->n;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint32_t i = j->next < n ? j->next++ : n;
        pthread_mutex_unlock(&j->mu);
        if (i >= n) break;
        int64_t left = j->deadline < 0 ? NOTIFY_IO_MS : j->deadline - hvd_now_ms();
        if (left <= 0) {
            j->errors[i] = strdup("not told: out of time");
            continue;
        }
        char name[HVD_SERVICE_NAME_MAX];
        hvd_task_service_name(tasks[i].index, name);
        hvd_client_config cc = {
            .service = name,
            .secret = j->d->secret,
            .addrs = tasks[i].addrs.v,
            .naddrs = tasks[i].addrs.n,
            .probe_timeout_ms = min_ms(left, NOTIFY_PROBE_MS),
            .io_timeout_ms = min_ms(left, NOTIFY_IO_MS),
            .stagger_ms = HVD_CONNECT_STAGGER_MS,
        };
        hvd_err err = {0};
        hvd_client *c = hvd_client_connect(&cc, &err);
        if (!c || hvd_client_call(c, &hvd_registration_done_desc, &j->msgs[i], &hvd_ack_desc, NULL,
                                  0, 0, &err) != 0)
            j->errors[i] = strdup(err.msg[0] ? err.msg : "failed");
        hvd_client_close(c);
    }
    return NULL;
}

/* Sends task i REGISTRATION_DONE msgs[i], for every task, from a pool of threads. Returns 0,
 * or -1 with err naming the tasks that could not be told. */
static int notify_all(hvd_driver *d, const hvd_task_info *tasks, const hvd_peers_msg *msgs,
                      uint32_t n, int64_t deadline, hvd_err *err) {
    notify_job j = {.d = d, .tasks = tasks, .msgs = msgs, .n = n, .deadline = deadline};
    j.errors = calloc(n, sizeof *j.errors);
    if (!j.errors) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[NOTIFY_THREADS];
    size_t nth = 0;
    /* The calling thread is one of the workers. */
    while (nth + 1 < NOTIFY_THREADS && nth + 1 < n &&
           pthread_create(&th[nth], NULL, notify_worker, &j) == 0)
        nth++;
    notify_worker(&j);
    for (size_t i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);

    uint32_t failed = 0;
    for (uint32_t i = 0; i < n; i++)
        if (j.errors[i]) failed++;
    if (failed > 0) {
        char msg[HVD_ERR_MAX] = "";
        append(msg, sizeof msg,
               "could not tell %u of %u task(s) that registration is complete (did they stop, or "
               "can the driver not reach their addresses?): ",
               failed, n);
        uint32_t named = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (!j.errors[i]) continue;
            if (named == 3) {
                append(msg, sizeof msg, "; and %u more", failed - named);
                break;
            }
            append(msg, sizeof msg, "%stask %u (host %s): %s", named ? "; " : "", tasks[i].index,
                   tasks[i].host_hash, j.errors[i]);
            named++;
        }
        hvd_err_set(err, HVD_E_IO, "%s", msg);
    }
    for (uint32_t i = 0; i < n; i++)
        free(j.errors[i]);
    free(j.errors);
    return failed ? -1 : 0;
}

/* notify_all for the tasks act[0..n-1] (all, or an elastic launch's), whose registrations
 * and messages infos and msgs hold by task index. */
static int notify_active(hvd_driver *d, const hvd_task_info *infos, const hvd_peers_msg *msgs,
                         const uint32_t *act, uint32_t n, int64_t deadline, hvd_err *err) {
    hvd_task_info *to = calloc(n ? n : 1, sizeof *to);
    hvd_peers_msg *tm = calloc(n ? n : 1, sizeof *tm);
    int rc = to && tm ? 0 : hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    for (uint32_t k = 0; rc == 0 && k < n; k++) { /* shallow copies */
        to[k] = infos[act[k]];
        tm[k] = msgs[act[k]];
    }
    if (rc == 0) rc = notify_all(d, to, tm, n, deadline, err);
    free(to);
    free(tm);
    return rc;
}

/* ---- The probed pairs ------------------------------------------------------------------- */

/* Builds the error that says why no candidate interface serves every probed pair. d->mu
 * held. */
static void mesh_error(const drv_registry *r, hvd_err *err) {
    uint64_t empty = 0, fails[DRV_MAX_CAND] = {0};
    uint32_t listed = 0, first[DRV_MAX_CAND][2];
    char pairs[HVD_ERR_MAX] = "", msg[HVD_ERR_MAX] = "";
    for (uint32_t i = 0; i < r->n; i++) {
        const drv_task *t = &r->tasks[i];
        for (uint32_t k = 0; k < t->nprobe; k++) {
            uint32_t j = t->probe_to[k];
            uint64_t m = t->reach[k];
            for (size_t c = 0; c < r->ncand; c++) {
                if ((m >> c) & 1) continue;
                if (fails[c]++ == 0) {
                    first[c][0] = i;
                    first[c][1] = j;
                }
            }
            if (m != 0) continue;
            if (empty++ < LIST_PAIRS_MAX) {
                append(pairs, sizeof pairs, "%stask %u -> task %u", listed ? ", " : "", i, j);
                listed++;
            }
        }
    }
    if (empty > 0) {
        append(msg, sizeof msg,
               "no network interface connects every pair of hosts: in %llu probed pair(s) the "
               "first host's task reached none of the second's addresses",
               (unsigned long long)empty);
        if (r->ncand < 8) {
            append(msg, sizeof msg, " on");
            for (size_t k = 0; k < r->ncand; k++)
                append(msg, sizeof msg, "%s %s", k ? "," : "", r->cand[k]);
        }
        append(msg, sizeof msg, ": %s", pairs);
        if (empty > listed)
            append(msg, sizeof msg, " and %llu more", (unsigned long long)(empty - listed));
    } else {
        append(msg, sizeof msg,
               "no single network interface connects every pair of hosts, though each pair "
               "shares one: ");
        for (size_t k = 0; k < r->ncand && k < LIST_NAMES_MAX; k++) {
            append(msg, sizeof msg, "%s%s fails task %u -> task %u", k ? ", " : "", r->cand[k],
                   first[k][0], first[k][1]);
            if (fails[k] > 1)
                append(msg, sizeof msg, " (and %llu more pairs)",
                       (unsigned long long)(fails[k] - 1));
        }
        if (r->ncand > LIST_NAMES_MAX) append(msg, sizeof msg, ", ...");
    }
    append(msg, sizeof msg,
           ": can those executors reach each other (firewalls, routes)? Or name the interfaces "
           "to use (--nics)");
    hvd_err_set(err, HVD_E_NOT_FOUND, "%s", msg);
}

/* Intersects the reached candidate interfaces over every probed pair (none probed: one host,
 * every candidate). d->mu held; every prober reported. Returns 0 with a NULL-terminated list
 * (candidate order, which is task 0's), or -1 with err. */
static int mesh(const drv_registry *r, char ***out, hvd_err *err) {
    uint64_t common = r->ncand == 64 ? UINT64_MAX : ((uint64_t)1 << r->ncand) - 1;
    for (uint32_t i = 0; i < r->n && common; i++)
        for (uint32_t k = 0; k < r->tasks[i].nprobe; k++)
            common &= r->tasks[i].reach[k];
    if (!common) {
        mesh_error(r, err);
        return -1;
    }
    hvd_strb b = {0};
    for (size_t k = 0; k < r->ncand; k++)
        if ((common >> k) & 1) hvd_strb_add(&b, r->cand[k]);
    char **res = hvd_strb_finish(&b);
    if (!res) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    *out = res;
    return 0;
}

static bool declares(const hvd_task_info *t, const char *ifname) {
    const hvd_addr *a = t->addrs.v;
    for (size_t x = 0; x < t->addrs.n; x++)
        if (strcmp(a[x].ifname, ifname) == 0) return true;
    return false;
}

/* The interface name of task t's address x when no earlier address has it (the task's
 * distinct names, in its order), else NULL; NULL for an unnamed address too. */
static const char *first_use(const hvd_task_info *t, size_t x) {
    const hvd_addr *a = t->addrs.v;
    if (!a[x].ifname[0]) return NULL;
    for (size_t y = 0; y < x; y++)
        if (strcmp(a[y].ifname, a[x].ifname) == 0) return NULL;
    return a[x].ifname;
}

/* The error when no interface name is declared by every task: for each of task 0's names,
 * the first task without it. d->mu held. */
static int no_candidates(const drv_registry *r, hvd_err *err) {
    char msg[HVD_ERR_MAX] = "";
    append(msg, sizeof msg, "the tasks have no network interface name in common:");
    const hvd_task_info *t0 = &r->tasks[r->act[0]].info;
    size_t shown = 0;
    for (size_t x = 0; x < t0->addrs.n && shown < LIST_NAMES_MAX; x++) {
        const char *name = first_use(t0, x);
        if (!name) continue;
        for (uint32_t k = 1; k < r->nact; k++) {
            uint32_t j = r->act[k];
            if (declares(&r->tasks[j].info, name)) continue;
            append(msg, sizeof msg, "%s task %u has %s, task %u has not", shown ? ";" : "",
                   r->act[0], name, j);
            shown++;
            break;
        }
    }
    if (shown == 0) append(msg, sizeof msg, " task %u declared no interface names", r->act[0]);
    append(msg, sizeof msg,
           ": give the executors a common interface, or name the interfaces to use (--nics)");
    return hvd_err_set(err, HVD_E_NOT_FOUND, "%s", msg);
}

/* The warning (into msg, "" if none) when an interface named by --nics is one that tasks
 * declared no address on: where it does not exist, mpirun ends with a message about one
 * host and the job with "mpirun exited with status 1". Only a warning: a task bound to one
 * address (--bind) or given its own --nics declares only those, and the name may still be
 * there. Alias labels ("eth0:1") are compared by their device, subnets ("10.0.0.0/8", which
 * Open MPI's if_include takes) not at all. d->mu held. */
static void nics_missing(const drv_registry *r, char *const *nics, char *msg, size_t cap) {
    msg[0] = '\0';
    for (size_t n = 0; nics[n]; n++) {
        if (strchr(nics[n], '/')) continue;
        char dev[HVD_IFNAME_MAX];
        snprintf(dev, sizeof dev, "%.*s", (int)strcspn(nics[n], ":"), nics[n]);
        uint32_t lacking = 0, first = UINT32_MAX;
        for (uint32_t k = 0; k < r->nact; k++) {
            if (declares(&r->tasks[r->act[k]].info, dev)) continue;
            if (lacking++ == 0) first = r->act[k];
        }
        if (lacking == 0) continue;
        const hvd_task_info *t = &r->tasks[first].info;
        char has[256] = "";
        for (size_t x = 0, shown = 0; x < t->addrs.n && shown < LIST_NAMES_MAX; x++) {
            const char *name = first_use(t, x);
            if (name) append(has, sizeof has, "%s%s", shown++ ? ", " : "", name);
        }
        snprintf(msg, cap,
                 "warning: --nics names %s, on which %u of %u tasks declared no address (task "
                 "%u on host %s declared: %s); if a host lacks it, mpirun fails: name "
                 "interfaces that every executor has, or leave --nics out to probe them",
                 nics[n], lacking, r->nact, first, t->host_hash ? t->host_hash : "?",
                 has[0] ? has : "none");
        return;
    }
}

/* The distinct interface names of one task's addresses, in its order. d->mu held. */
static int own_interfaces(const drv_task *t, char ***out, hvd_err *err) {
    hvd_strb b = {0};
    for (size_t x = 0; x < t->info.addrs.n; x++) {
        const char *name = first_use(&t->info, x);
        if (name) hvd_strb_add(&b, name);
    }
    size_t n = b.n;
    char **res = hvd_strb_finish(&b);
    if (!res) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    if (n == 0) {
        hvd_strv_free(res);
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "task %u declared no interface names with its addresses: name the "
                           "interfaces to use (--nics)",
                           t->info.index);
    }
    *out = res;
    return 0;
}

/* Waits for the report of every task the plan made probe. d->mu held. Returns 0, or -1
 * with err. */
static int wait_reports(hvd_driver *d, int64_t start, int64_t deadline, hvd_err *err) {
    drv_registry *r = &d->reg;
    while (r->nreported < r->nprobers) {
        if (d->aborted)
            return hvd_err_set(err, HVD_E_STATE,
                               "stopped waiting for the tasks' reachability reports: %s",
                               d->abort_reason);
        if (!drv_cond_wait(d, deadline) && r->nreported < r->nprobers) {
            uint32_t *v = malloc(r->n * sizeof *v);
            size_t n = 0;
            for (uint32_t i = 0; v && i < r->n; i++)
                if (r->tasks[i].nprobe > 0 && !r->tasks[i].reported) v[n++] = i;
            char missing[256] = "?";
            if (v) drv_format_ranges(v, n, missing, sizeof missing);
            free(v);
            return hvd_err_set(err, HVD_E_TIMEOUT,
                               "timed out after %lld ms waiting for the tasks to report which "
                               "peers they reached: %u of %u reported, missing task(s) %s: can "
                               "those executors connect to the other tasks (firewalls, routes)? "
                               "Or name the interfaces to use (--nics)",
                               (long long)(hvd_now_ms() - start), r->nreported, r->nprobers,
                               missing);
        }
    }
    return 0;
}

/* What to tell each task: the plan's targets, each with only its candidate addresses (the
 * others cannot count), in an order that starts after the receiver's own index, so that the
 * probers of a round do not all start at the same task. */
typedef struct tell_plan {
    hvd_peers_msg *msgs;  /* [n] */
    hvd_task_info *views; /* [n] targets as sent: index, host hash, candidate addresses */
    uint32_t n;
} tell_plan;

static void tell_free(tell_plan *tp) {
    for (uint32_t i = 0; tp->msgs && i < tp->n; i++)
        free(tp->msgs[i].tasks.v); /* shallow copies of views */
    for (uint32_t i = 0; tp->views && i < tp->n; i++)
        free(tp->views[i].addrs.v);
    free(tp->msgs);
    free(tp->views);
}

/* Fills tp from the registry's plan; infos is the snapshot the views point into. d->mu held.
 * Returns 0, or -1 on out of memory. */
static int tell_build(const drv_registry *r, bool probe, const hvd_task_info *infos,
                      tell_plan *tp) {
    tp->n = r->n;
    tp->msgs = calloc(r->n, sizeof *tp->msgs);
    tp->views = calloc(r->n, sizeof *tp->views);
    if (!tp->msgs || !tp->views) return -1;
    for (uint32_t i = 0; i < r->n; i++) {
        const drv_task *t = &r->tasks[i];
        tp->msgs[i].probe = probe && t->nprobe > 0;
        if (!tp->msgs[i].probe) continue;
        hvd_task_info *list = calloc(t->nprobe, sizeof *list);
        if (!list) return -1;
        tp->msgs[i].tasks.v = list;
        tp->msgs[i].tasks.n = t->nprobe;
        uint32_t from = 0;
        while (from < t->nprobe && t->probe_to[from] < i)
            from++;
        for (uint32_t k = 0; k < t->nprobe; k++) {
            uint32_t j = t->probe_to[(from + k) % t->nprobe];
            hvd_task_info *v = &tp->views[j];
            if (!v->host_hash) {
                const hvd_addr *a = infos[j].addrs.v;
                hvd_addr *keep = calloc(infos[j].addrs.n ? infos[j].addrs.n : 1, sizeof *keep);
                if (!keep) return -1;
                v->index = j;
                v->host_hash = infos[j].host_hash;
                v->addrs.v = keep;
                for (size_t x = 0; x < infos[j].addrs.n; x++)
                    if (drv_reg_is_cand(r, &a[x])) keep[v->addrs.n++] = a[x];
            }
            list[k] = *v;
        }
    }
    return 0;
}

int hvd_driver_common_interfaces(hvd_driver *d, int timeout_ms, char ***ifaces, hvd_err *err) {
    *ifaces = NULL;
    if (hvd_loop_on_thread(hvd_server_loop(d->srv)))
        return hvd_err_set(err, HVD_E_STATE,
                           "hvd_driver_common_interfaces blocks and must not run on the driver's "
                           "loop thread");
    int64_t start = hvd_now_ms();
    int64_t deadline = timeout_ms < 0 ? -1 : start + timeout_ms;

    /* A snapshot of every active registration: the workers send it without the lock. */
    hvd_task_info *infos = calloc(d->num_tasks, sizeof *infos);
    tell_plan tp = {0};
    drv_plan_stats st = {0};
    if (!infos) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_lock(&d->mu);
    drv_registry *r = &d->reg;
    uint32_t ntasks = r->nact; /* all tasks, or an elastic launch's */
    bool probe = d->nics == NULL && ntasks > 1;
    int rc = 0;
    uint32_t registered = 0;
    for (uint32_t k = 0; k < ntasks; k++)
        registered += r->tasks[r->act[k]].registered;
    if (registered < ntasks)
        rc = hvd_err_set(err, HVD_E_STATE,
                         "only %u of %u tasks registered: wait for registration before asking "
                         "for the common interfaces",
                         registered, ntasks);
    /* infos[i] is task i's (active tasks only); act: which tasks to tell. */
    uint32_t *act = malloc((ntasks ? ntasks : 1) * sizeof *act);
    if (rc == 0 && !act) rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    for (uint32_t k = 0; rc == 0 && k < ntasks; k++) {
        act[k] = r->act[k];
        if (drv_msg_clone(&hvd_task_info_desc, &r->tasks[act[k]].info, &infos[act[k]]) != 0)
            rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    /* The names a common interface can have; reports of an earlier round no longer count. */
    bool truncated = false;
    if (rc == 0 && probe && drv_reg_set_cand(r, &truncated) != 0)
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    bool none = rc == 0 && probe && r->ncand == 0;
    if (none) {
        no_candidates(r, err);
        probe = false; /* nothing to find: don't make the tasks probe */
    }
    char nics_warning[HVD_ERR_MAX] = "";
    if (rc == 0 && d->nics) nics_missing(r, d->nics, nics_warning, sizeof nics_warning);
    if (rc == 0 && probe && drv_reg_plan(r, &st) != 0)
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    if (rc == 0 && tell_build(r, probe, infos, &tp) != 0)
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_unlock(&d->mu);

    if (nics_warning[0]) drv_log(d, "%s", nics_warning);
    if (truncated)
        drv_log(d,
                "warning: the tasks share more than %d interface names; only the first %d "
                "are considered",
                DRV_MAX_CAND, DRV_MAX_CAND);
    if (rc == 0 && probe)
        drv_log(d, "probing %llu pair(s) of tasks for %u task(s) on %u host(s), %u network(s)",
                (unsigned long long)st.pairs, ntasks, st.hosts, st.networks);
    if (rc == 0) {
        hvd_err nerr;
        /* Tell the tasks even when the round cannot succeed, so none waits for nothing. */
        rc = notify_active(d, infos, tp.msgs, act, ntasks, deadline, &nerr);
        if (rc != 0 || none) {
            if (!none && err) *err = nerr;
            rc = -1;
        }
    }
    tell_free(&tp);
    free(act);
    for (uint32_t i = 0; i < d->num_tasks; i++)
        hvd_msg_free(&hvd_task_info_desc, &infos[i]);
    free(infos);
    if (rc != 0) return -1;

    if (d->nics) {
        *ifaces = hvd_strv_copy((const char *const *)d->nics);
        return *ifaces ? 0 : hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    pthread_mutex_lock(&d->mu);
    if (ntasks == 1)
        rc = own_interfaces(&r->tasks[r->act[0]], ifaces, err);
    else if ((rc = wait_reports(d, start, deadline, err)) == 0)
        rc = mesh(r, ifaces, err);
    pthread_mutex_unlock(&d->mu);
    if (rc == 0) {
        char line[512] = "";
        for (size_t k = 0; (*ifaces)[k]; k++)
            append(line, sizeof line, "%s%s", k ? "," : "", (*ifaces)[k]);
        drv_log(d, "interfaces that connect every pair of hosts: %s (in %lld ms)", line,
                (long long)(hvd_now_ms() - start));
    }
    return rc;
}
