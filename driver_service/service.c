/* The driver's life cycle: start, addresses, waiting for registration, task lookups, shutting
 * the tasks down, abort and stop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <openssl/crypto.h>

#include "common/loop.h"
#include "common/strv.h"
#include "driver_internal.h"
#include "hvd/defaults.h"

/* Largest number of tasks a driver accepts (tables are sized by it up front). */
#define DRV_MAX_TASKS (1u << 20)

static void driver_free(hvd_driver *d) {
    hvd_server_destroy(d->srv);
    /* Nothing can be held any more: stop cancelled what was left. */
    drv_reg_free(&d->reg);
    hvd_msg_free(&hvd_code_desc, &d->code);
    hvd_strv_free(d->nics);
    hvd_secret_wipe(&d->secret);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* About how many bytes c takes on the wire (the CODE reply): its parts and HVD_CODE_SLACK. */
static size_t code_size(const hvd_code_msg *c) {
    size_t n = HVD_CODE_SLACK + c->object.len + c->arg.len + (c->symbol ? strlen(c->symbol) : 0);
    for (size_t i = 0; i < c->argv.n && c->argv.v; i++)
        n += c->argv.v[i] ? strlen(c->argv.v[i]) + 8 : 0;
    return n;
}

static int check_config(const hvd_driver_config *cfg, hvd_err *err) {
    if (cfg->num_tasks == 0 || cfg->num_tasks > DRV_MAX_TASKS)
        return hvd_err_set(err, HVD_E_INVALID, "the number of tasks must be 1..%u, not %u",
                           DRV_MAX_TASKS, cfg->num_tasks);
    const hvd_code_msg *c = cfg->code;
    if (c && c->kind != HVD_CODE_ARGV && c->kind != HVD_CODE_SHARED_OBJECT &&
        c->kind != HVD_CODE_ARGV_IO)
        return hvd_err_set(err, HVD_E_INVALID, "unknown entry point kind %u", c->kind);
    if (c && c->kind != HVD_CODE_SHARED_OBJECT &&
        (c->argv.n == 0 || !c->argv.v || !c->argv.v[0] || !*c->argv.v[0]))
        return hvd_err_set(err, HVD_E_INVALID, "the entry point command is empty");
    if (c && c->kind == HVD_CODE_SHARED_OBJECT && (c->object.len == 0 || !c->symbol || !*c->symbol))
        return hvd_err_set(err, HVD_E_INVALID,
                           "a shared-object entry point needs the object's bytes and a symbol");
    if (c && c->kind == HVD_CODE_SHARED_OBJECT && drv_check_entry(&c->object, c->symbol, err) != 0)
        return -1;
    if (c && code_size(c) > HVD_CODE_MAX_FRAME)
        return hvd_err_set(err, HVD_E_INVALID,
                           "the entry point is %zu bytes, more than the %zu the ranks can fetch "
                           "(%s): ship less with it (load large data inside the function, from a "
                           "file or a dataset)",
                           code_size(c), (size_t)HVD_CODE_MAX_FRAME - HVD_CODE_SLACK,
                           c->kind == HVD_CODE_ARGV_IO ? "the payload: a pickled function with its "
                                                         "arguments"
                                                       : "the command and its object");
    if (cfg->nics && !cfg->nics[0])
        return hvd_err_set(err, HVD_E_INVALID,
                           "the list of network interfaces is empty: give at least one, or "
                           "none at all to have the tasks probe");
    return 0;
}

/* Warns when this process may not open as many descriptors as the job may need: past the
 * limit the service stops accepting for a moment at a time, and tasks and ranks time out. */
static void check_nofile(hvd_driver *d) {
    long want = (long)d->num_tasks * HVD_DRIVER_FDS_PER_TASK + HVD_DRIVER_FDS_BASE;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        (long)rl.rlim_cur >= want)
        return;
    drv_log(d,
            "warning: this process may open %ld files (ulimit -n) and a driver of %u tasks may "
            "need up to %ld at once (a long-poll per task, the ranks' calls, the agents): raise "
            "the limit, or tasks and ranks will time out connecting while it is reached",
            (long)rl.rlim_cur, d->num_tasks, want);
}

hvd_driver *hvd_driver_start(const hvd_driver_config *cfg, hvd_err *err) {
    if (check_config(cfg, err) != 0) return NULL;
    hvd_driver *d = calloc(1, sizeof *d);
    if (!d) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&d->nheld, 0);
    atomic_init(&d->nlost, 0);
    d->num_tasks = cfg->num_tasks;
    d->secret = cfg->secret;
    d->log = cfg->log;
    d->log_user = cfg->log_user;
    d->net_timeout_ms =
        cfg->net_timeout_ms > 0 ? cfg->net_timeout_ms : HVD_NET_TIMEOUT_DEFAULT_S * 1000;
    bool oom = drv_reg_init(&d->reg, cfg->num_tasks) != 0;
    if (cfg->code) {
        d->has_code = true;
        oom |= drv_msg_clone(&hvd_code_desc, cfg->code, &d->code) != 0;
    }
    if (cfg->nics) oom |= !(d->nics = hvd_strv_copy(cfg->nics));
    if (oom) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory starting the driver");
        driver_free(d);
        return NULL;
    }
    hvd_server_config sc = {
        .name = HVD_DRIVER_SERVICE,
        .secret = cfg->secret,
        .bind_host = cfg->bind_host,
        .port = cfg->port,
        .net_timeout_ms = d->net_timeout_ms,
    };
    d->srv = hvd_server_create(&sc, err);
    if (!d->srv) {
        driver_free(d);
        return NULL;
    }
    if (drv_install_handlers(d) != 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot register the driver's handlers");
        driver_free(d);
        return NULL;
    }
    if (hvd_server_start(d->srv, err) != 0) {
        driver_free(d);
        return NULL;
    }
    check_nofile(d);
    return d;
}

int hvd_driver_addrs(hvd_driver *d, hvd_addr **out, size_t *n, hvd_err *err) {
    return hvd_server_addrs(d->srv, NULL, out, n, err);
}

char **hvd_driver_job_env(hvd_driver *d, hvd_err *err) {
    hvd_addr *addrs;
    size_t n;
    if (hvd_driver_addrs(d, &addrs, &n, err) != 0) return NULL;
    char *text = hvd_addrs_format(addrs, n);
    free(addrs);
    char b64[45];
    hvd_secret_to_base64(&d->secret, b64);
    hvd_strb b = {0};
    hvd_strb_addf(&b, "%s=%s", HVD_SECRET_ENV, b64);
    if (text) hvd_strb_addf(&b, "%s=%s", HVD_DRIVER_ADDRS_ENV, text);
    OPENSSL_cleanse(b64, sizeof b64);
    free(text);
    char **env = text ? hvd_strb_finish(&b) : NULL;
    if (!text) hvd_strb_free(&b);
    if (!env) hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    return env;
}

/* Missing indices as "3-7,9" into buf. d->mu held. */
static void missing_tasks(hvd_driver *d, char *buf, size_t len) {
    uint32_t *v = malloc(d->num_tasks * sizeof *v);
    size_t n = 0;
    if (!v) {
        snprintf(buf, len, "?");
        return;
    }
    for (uint32_t i = 0; i < d->num_tasks; i++)
        if (!d->reg.tasks[i].registered) v[n++] = i;
    drv_format_ranges(v, n, buf, len);
    free(v);
}

int hvd_driver_wait_registration(hvd_driver *d, int timeout_ms, hvd_err *err) {
    int64_t start = hvd_now_ms();
    int64_t deadline = timeout_ms < 0 ? -1 : start + timeout_ms;
    int64_t last_log = 0;
    uint32_t logged = UINT32_MAX;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        uint32_t k = d->reg.nregistered;
        /* Progress: every change, at most once a second, and always the final count. */
        if (k != logged && (k == d->num_tasks || hvd_now_ms() - last_log >= 1000)) {
            logged = k;
            last_log = hvd_now_ms();
            pthread_mutex_unlock(&d->mu);
            drv_log(d, "%u/%u tasks registered", k, d->num_tasks);
            pthread_mutex_lock(&d->mu);
            continue; /* the count may have moved while the log ran */
        }
        if (k == d->num_tasks) break;
        if (d->aborted) {
            hvd_err_set(err, HVD_E_STATE, "stopped waiting for tasks to register: %s",
                        d->abort_reason);
            pthread_mutex_unlock(&d->mu);
            return -1;
        }
        int64_t wake = deadline;
        if (k != logged && (wake < 0 || last_log + 1000 < wake)) wake = last_log + 1000;
        if (!drv_cond_wait(d, wake) && wake == deadline) {
            k = d->reg.nregistered;
            if (k == d->num_tasks) continue;
            char missing[256];
            missing_tasks(d, missing, sizeof missing);
            hvd_err_set(err, HVD_E_TIMEOUT,
                        "timed out after %lld ms waiting for tasks to register: %u of %u "
                        "registered, missing task(s) %s: are the executors running hvd-task "
                        "with the right --driver address and secret?",
                        (long long)(hvd_now_ms() - start), k, d->num_tasks, missing);
            pthread_mutex_unlock(&d->mu);
            return -1;
        }
    }
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int hvd_driver_task(hvd_driver *d, uint32_t index, hvd_task_info *out, hvd_err *err) {
    memset(out, 0, sizeof *out);
    if (index >= d->num_tasks)
        return hvd_err_set(err, HVD_E_INVALID, "task index %u is outside 0..%u", index,
                           d->num_tasks - 1);
    pthread_mutex_lock(&d->mu);
    int rc = -1;
    if (!d->reg.tasks[index].registered)
        hvd_err_set(err, HVD_E_NOT_FOUND, "task %u has not registered", index);
    else if (drv_msg_clone(&hvd_task_info_desc, &d->reg.tasks[index].info, out) != 0)
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    else
        rc = 0;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

size_t hvd_driver_lost_tasks(hvd_driver *d) {
    return atomic_load(&d->nlost);
}

int hvd_driver_lost_reason(hvd_driver *d, char *buf, size_t cap) {
    if (cap == 0) return 0;
    buf[0] = '\0';
    uint64_t seq;
    pthread_mutex_lock(&d->mu);
    int timed_out = drv_lost_text(d, buf, cap, &seq);
    pthread_mutex_unlock(&d->mu);
    return timed_out > 0;
}

size_t drv_held_count(hvd_driver *d) {
    return atomic_load(&d->nheld);
}

/* Loop thread: answer every held WAIT_SHUTDOWN and tell the caller of shutdown_tasks. */
static void answer_held_post(void *arg) {
    hvd_driver *d = arg;
    drv_answer_held(d);
    pthread_mutex_lock(&d->mu);
    d->shutdown_flushed = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void hvd_driver_shutdown_tasks(hvd_driver *d) {
    pthread_mutex_lock(&d->mu);
    bool first = !d->tasks_shutdown;
    d->tasks_shutdown = true;
    pthread_mutex_unlock(&d->mu);
    if (!first) return;
    if (hvd_loop_on_thread(hvd_server_loop(d->srv))) {
        answer_held_post(d);
        return;
    }
    if (hvd_loop_post(hvd_server_loop(d->srv), answer_held_post, d) != 0)
        return; /* stopped: nothing held */
    /* Wait until the answers are queued, so a stop that follows flushes them. The loop runs
     * the post soon; hvd_server_stop would run it too. */
    pthread_mutex_lock(&d->mu);
    while (!d->shutdown_flushed)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

typedef struct release_job {
    hvd_driver *d;
    bool *which;
    uint32_t n;
    bool done;
} release_job;

/* Loop thread, where registrations are handled too (so none slips in between): marks the
 * spent one-shot tasks, answers their long-polls, then forgets them. */
static void release_post(void *arg) {
    release_job *j = arg;
    hvd_driver *d = j->d;
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < d->num_tasks; i++) {
        const drv_task *t = &d->reg.tasks[i];
        j->which[i] = t->registered && !t->info.elastic && t->used;
        j->n += j->which[i];
    }
    pthread_mutex_unlock(&d->mu);
    drv_answer_held_of(d, j->which);
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < d->num_tasks; i++) {
        if (!j->which[i]) continue;
        drv_task *t = &d->reg.tasks[i];
        drv_reg_forget(&d->reg, i);
        if (t->lost) { /* its answered call's connection closing cancelled a sibling call */
            t->lost = false;
            atomic_fetch_sub(&d->nlost, 1);
        }
        t->done = false;
        t->watches = 0; /* answered: none held */
    }
    j->done = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

uint32_t drv_release_one_shot(hvd_driver *d) {
    release_job j = {.d = d, .which = calloc(d->num_tasks, sizeof *j.which)};
    if (!j.which) return 0;
    if (hvd_loop_post(hvd_server_loop(d->srv), release_post, &j) == 0) {
        pthread_mutex_lock(&d->mu);
        while (!j.done)
            pthread_cond_wait(&d->cv, &d->mu);
        pthread_mutex_unlock(&d->mu);
    }
    free(j.which);
    return j.n;
}

uint32_t hvd_driver_registered(hvd_driver *d) {
    pthread_mutex_lock(&d->mu);
    uint32_t n = d->reg.nregistered;
    pthread_mutex_unlock(&d->mu);
    return n;
}

void hvd_driver_abort(hvd_driver *d, const char *reason) {
    pthread_mutex_lock(&d->mu);
    if (!d->aborted)
        snprintf(d->abort_reason, sizeof d->abort_reason, "%s",
                 reason && *reason ? reason : "aborted");
    d->aborted = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void hvd_driver_stop(hvd_driver *d) {
    if (!d) return;
    hvd_driver_shutdown_tasks(d);
    driver_free(d);
}
