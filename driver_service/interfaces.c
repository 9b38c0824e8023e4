/* Registration complete -> every task is told (with the table of all tasks), the tasks probe
 * each other and report what they reached, and the driver computes the interface names that
 * work between every ordered pair of tasks (a full mesh; Horovod only probes a ring). Runs on
 * the launcher's thread, never on the loop thread: it makes blocking calls to the tasks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/loop.h"
#include "common/strv.h"
#include "driver_internal.h"

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
    const hvd_peers_msg *peers; /* read-only, shared by the workers */
    int64_t deadline;           /* hvd_now_ms() time, < 0: none */
    pthread_mutex_t mu;
    uint32_t next; /* next task to tell (under mu) */
    char **errors; /* [n]: why task i could not be told, or NULL */
} notify_job;

static int min_ms(int64_t a, int64_t b) {
    return (int)(a < b ? a : b);
}

static void *notify_worker(void *arg) {
    notify_job *j = arg;
    const hvd_task_info *tasks = j->peers->tasks.v;
    uint32_t n = (uint32_t)j->peers->tasks.n;
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
        };
        hvd_err err = {0};
        hvd_client *c = hvd_client_connect(&cc, &err);
        if (!c || hvd_client_call(c, &hvd_registration_done_desc, j->peers, &hvd_ack_desc, NULL, 0,
                                  0, &err) != 0)
            j->errors[i] = strdup(err.msg[0] ? err.msg : "failed");
        hvd_client_close(c);
    }
    return NULL;
}

/* Sends REGISTRATION_DONE to every task from a pool of threads. Returns 0, or -1 with err
 * naming the tasks that could not be told. */
static int notify_all(hvd_driver *d, const hvd_peers_msg *peers, int64_t deadline, hvd_err *err) {
    uint32_t n = (uint32_t)peers->tasks.n;
    notify_job j = {.d = d, .peers = peers, .deadline = deadline};
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
            append(msg, sizeof msg, "%stask %u: %s", named ? "; " : "", i, j.errors[i]);
            named++;
        }
        hvd_err_set(err, HVD_E_IO, "%s", msg);
    }
    for (uint32_t i = 0; i < n; i++)
        free(j.errors[i]);
    free(j.errors);
    return failed ? -1 : 0;
}

/* ---- The full mesh ------------------------------------------------------------------------ */

/* Builds the error that says why no candidate interface serves every pair. d->mu held. */
static void mesh_error(const drv_registry *r, hvd_err *err) {
    uint64_t empty = 0, fails[DRV_MAX_CAND] = {0};
    uint32_t listed = 0, first[DRV_MAX_CAND][2];
    char pairs[HVD_ERR_MAX] = "", msg[HVD_ERR_MAX] = "";
    for (uint32_t a = 0; a < r->nact; a++) {
        for (uint32_t b = 0; b < r->nact; b++) {
            uint32_t i = r->act[a], j = r->act[b];
            if (j == i) continue;
            uint64_t m = r->tasks[i].reach[j];
            for (size_t k = 0; k < r->ncand; k++) {
                if ((m >> k) & 1) continue;
                if (fails[k]++ == 0) {
                    first[k][0] = i;
                    first[k][1] = j;
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
               "no network interface connects every pair of tasks: in %llu pair(s) the first "
               "task reached none of the second's addresses",
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
               "no single network interface connects every pair of tasks, though each pair "
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

/* Intersects the reached candidate interfaces over every ordered pair of active tasks. d->mu
 * held; every active task registered and reported. Returns 0 with a NULL-terminated list
 * (candidate order, which is the first task's), or -1 with err. */
static int mesh(const drv_registry *r, char ***out, hvd_err *err) {
    uint64_t common = r->ncand == 64 ? UINT64_MAX : ((uint64_t)1 << r->ncand) - 1;
    for (uint32_t a = 0; a < r->nact && common; a++)
        for (uint32_t b = 0; b < r->nact; b++)
            if (a != b) common &= r->tasks[r->act[a]].reach[r->act[b]];
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

/* The error when no interface name is declared by every task: for each of task 0's names,
 * the first task without it. d->mu held. */
static int no_candidates(const drv_registry *r, hvd_err *err) {
    char msg[HVD_ERR_MAX] = "";
    append(msg, sizeof msg, "the tasks have no network interface name in common:");
    const hvd_task_info *t0 = &r->tasks[r->act[0]].info;
    const hvd_addr *a = t0->addrs.v;
    size_t shown = 0;
    for (size_t x = 0; x < t0->addrs.n && shown < LIST_NAMES_MAX; x++) {
        const char *name = a[x].ifname;
        bool seen = false;
        for (size_t y = 0; y < x && !seen; y++)
            seen = strcmp(a[y].ifname, name) == 0;
        if (!name[0] || seen) continue;
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

/* The distinct interface names of one task's addresses, in its order. d->mu held. */
static int own_interfaces(const drv_task *t, char ***out, hvd_err *err) {
    const hvd_addr *a = t->info.addrs.v;
    hvd_strb b = {0};
    for (size_t x = 0; x < t->info.addrs.n; x++)
        if (a[x].ifname[0] && !hvd_strv_has((const char *const *)b.v, a[x].ifname))
            hvd_strb_add(&b, a[x].ifname);
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

/* How many active tasks have reported. d->mu held. */
static uint32_t active_reported(const drv_registry *r) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < r->nact; k++)
        n += r->tasks[r->act[k]].reported;
    return n;
}

/* Waits for every active task's reachability report. d->mu held. Returns 0, or -1 with err. */
static int wait_reports(hvd_driver *d, int64_t start, int64_t deadline, hvd_err *err) {
    drv_registry *r = &d->reg;
    while (active_reported(r) < r->nact) {
        if (d->aborted)
            return hvd_err_set(err, HVD_E_STATE,
                               "stopped waiting for the tasks' reachability reports: %s",
                               d->abort_reason);
        if (!drv_cond_wait(d, deadline) && active_reported(r) < r->nact) {
            uint32_t *v = malloc(r->n * sizeof *v);
            size_t n = 0;
            for (uint32_t k = 0; v && k < r->nact; k++)
                if (!r->tasks[r->act[k]].reported) v[n++] = r->act[k];
            char missing[256] = "?";
            if (v) drv_format_ranges(v, n, missing, sizeof missing);
            free(v);
            return hvd_err_set(err, HVD_E_TIMEOUT,
                               "timed out after %lld ms waiting for the tasks to report which "
                               "peers they reached: %u of %u reported, missing task(s) %s: can "
                               "those executors connect to the other tasks (firewalls, routes)? "
                               "Or name the interfaces to use (--nics)",
                               (long long)(hvd_now_ms() - start), active_reported(r), r->nact,
                               missing);
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
    if (!infos) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_lock(&d->mu);
    drv_registry *r = &d->reg;
    uint32_t ntasks = r->nact; /* all tasks, or an elastic launch's */
    bool probe = d->nics == NULL && ntasks > 1;
    hvd_peers_msg peers = {.probe = probe};
    int rc = 0;
    uint32_t registered = 0;
    for (uint32_t k = 0; k < ntasks; k++)
        registered += r->tasks[r->act[k]].registered;
    if (registered < ntasks)
        rc = hvd_err_set(err, HVD_E_STATE,
                         "only %u of %u tasks registered: wait for registration before asking "
                         "for the common interfaces",
                         registered, ntasks);
    for (uint32_t k = 0; rc == 0 && k < ntasks; k++)
        if (drv_msg_clone(&hvd_task_info_desc, &r->tasks[r->act[k]].info, &infos[k]) != 0)
            rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    /* The names a common interface can have; reports of an earlier round no longer count. */
    bool truncated = false;
    if (rc == 0 && probe && drv_reg_set_cand(r, &truncated) != 0)
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    bool none = rc == 0 && probe && r->ncand == 0;
    if (none) {
        no_candidates(r, err);
        peers.probe = false; /* nothing to find: don't make the tasks probe */
    }
    pthread_mutex_unlock(&d->mu);
    peers.tasks.v = infos;
    peers.tasks.n = ntasks;

    if (truncated)
        drv_log(d,
                "warning: the tasks share more than %d interface names; only the first %d "
                "are considered",
                DRV_MAX_CAND, DRV_MAX_CAND);
    if (rc == 0) {
        hvd_err nerr;
        /* Tell the tasks even when the round cannot succeed, so none waits for nothing. */
        rc = notify_all(d, &peers, deadline, &nerr);
        if (rc != 0 || none) {
            if (!none && err) *err = nerr;
            rc = -1;
        }
    }
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
        drv_log(d, "interfaces that connect every pair of tasks: %s", line);
    }
    return rc;
}
