/* The driver's side of elastic jobs (include/hvd/driver.h, "Elastic jobs"): the tasks as the
 * elastic launcher sees them, the active set of a launch, forgetting lost tasks, what
 * ELASTIC_STATE tells the ranks, and stopping the tasks' commands between launches. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "driver_internal.h"

int hvd_driver_tasks(hvd_driver *d, hvd_task_brief **out, size_t *n, hvd_err *err) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&d->mu);
    const drv_registry *r = &d->reg;
    hvd_task_brief *v = r->nregistered ? calloc(r->nregistered, sizeof *v) : NULL;
    if (r->nregistered && !v) {
        pthread_mutex_unlock(&d->mu);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    size_t k = 0;
    for (uint32_t i = 0; i < r->n && k < r->nregistered; i++) {
        const drv_task *t = &r->tasks[i];
        if (!t->registered) continue;
        v[k].index = i;
        v[k].lost = t->lost;
        v[k].active = t->active;
        snprintf(v[k].host_hash, sizeof v[k].host_hash, "%s", t->info.host_hash);
        k++;
    }
    pthread_mutex_unlock(&d->mu);
    *out = v;
    *n = k;
    return 0;
}

int hvd_driver_set_active(hvd_driver *d, const uint32_t *idx, size_t n, hvd_err *err) {
    pthread_mutex_lock(&d->mu);
    int rc = drv_reg_set_active(&d->reg, idx, n, err);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int64_t hvd_driver_first_active(hvd_driver *d) {
    pthread_mutex_lock(&d->mu);
    const drv_registry *r = &d->reg;
    int64_t first = r->nact > 0 && r->tasks[r->act[0]].registered ? (int64_t)r->act[0] : -1;
    pthread_mutex_unlock(&d->mu);
    return first;
}

void hvd_driver_forget_task(hvd_driver *d, uint32_t index) {
    if (index >= d->num_tasks) return;
    pthread_mutex_lock(&d->mu);
    drv_task *t = &d->reg.tasks[index];
    if (t->lost) { /* not a task that registered again meanwhile */
        drv_reg_forget(&d->reg, index);
        t->lost = false;
        atomic_fetch_sub(&d->nlost, 1);
    }
    pthread_mutex_unlock(&d->mu);
}

void hvd_driver_set_elastic(hvd_driver *d, uint64_t epoch, bool hosts_updated) {
    pthread_mutex_lock(&d->mu);
    d->elastic.epoch = epoch;
    d->elastic.hosts_updated = hosts_updated;
    pthread_mutex_unlock(&d->mu);
}

/* ---- Stopping the tasks' commands between launches -------------------------------------- */

#define STOP_THREADS    16   /* tasks stopped at once */
#define STOP_CONNECT_MS 2000 /* a task that does not answer this fast is taken for lost */

typedef struct stop_job {
    hvd_driver *d;
    const hvd_task_info *tasks; /* snapshot of the tasks to stop */
    size_t n;
    int timeout_ms;
    pthread_mutex_t mu;
    size_t next;     /* next task to stop (under mu) */
    size_t failed;   /* tasks that could not be stopped (under mu) */
    uint64_t newest; /* the newest commit seen (under mu) */
    size_t holders;  /* tasks holding it (under mu) */
} stop_job;

/* Stops one task's command and asks for its newest commit. Returns its commit id, or -1. */
static int64_t stop_one(stop_job *j, const hvd_task_info *t) {
    char name[HVD_SERVICE_NAME_MAX];
    hvd_task_service_name(t->index, name);
    hvd_client_config cc = {.service = name,
                            .secret = j->d->secret,
                            .addrs = t->addrs.v,
                            .naddrs = t->addrs.n,
                            .probe_timeout_ms = STOP_CONNECT_MS,
                            .io_timeout_ms = j->timeout_ms};
    hvd_err err;
    hvd_status_msg st;
    hvd_commit_msg c = {0};
    hvd_client *cl = hvd_client_connect(&cc, &err);
    hvd_secret_wipe(&cc.secret);
    int64_t id = -1;
    if (cl &&
        hvd_client_call(cl, &hvd_stop_command_desc, NULL, &hvd_status_desc, &st, 0, HVD_CALL_RETRY,
                        &err) == 0 &&
        hvd_client_call(cl, &hvd_latest_commit_desc, NULL, &hvd_commit_desc, &c, 0, HVD_CALL_RETRY,
                        &err) == 0)
        id = (int64_t)c.id;
    else
        drv_log(j->d, "task %u: cannot stop its command: %s", t->index, err.msg);
    hvd_msg_free(&hvd_commit_desc, &c);
    hvd_client_close(cl);
    return id;
}

static void *stop_worker(void *arg) {
    stop_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t i = j->next < j->n ? j->next++ : j->n;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->n) return NULL;
        int64_t id = stop_one(j, &j->tasks[i]);
        pthread_mutex_lock(&j->mu);
        if (id < 0) {
            j->failed++;
        } else if ((uint64_t)id > j->newest) {
            j->newest = (uint64_t)id;
            j->holders = 1;
        } else if ((uint64_t)id == j->newest && id > 0) {
            j->holders++;
        }
        pthread_mutex_unlock(&j->mu);
    }
}

/* Copies the registered entries of idx[0..n) into out (unregistered ones are left out).
 * Returns how many, or -1 on out of memory. */
static ssize_t snapshot(hvd_driver *d, const uint32_t *idx, size_t n, hvd_task_info *out) {
    ssize_t k = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < n && k >= 0; i++) {
        if (idx[i] >= d->reg.n || !d->reg.tasks[idx[i]].registered) continue;
        if (drv_msg_clone(&hvd_task_info_desc, &d->reg.tasks[idx[i]].info, &out[k]) != 0)
            k = -1;
        else
            k++;
    }
    pthread_mutex_unlock(&d->mu);
    return k;
}

size_t hvd_driver_stop_commands(hvd_driver *d, const uint32_t *idx, size_t n, int timeout_ms,
                                uint64_t *newest, size_t *holders) {
    *newest = 0;
    *holders = 0;
    hvd_task_info *tasks = calloc(n ? n : 1, sizeof *tasks);
    ssize_t k = tasks ? snapshot(d, idx, n, tasks) : -1;
    if (k < 0) {
        free(tasks);
        return n;
    }
    stop_job j = {.d = d, .tasks = tasks, .n = (size_t)k, .timeout_ms = timeout_ms};
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[STOP_THREADS];
    size_t nth = 0;
    while (nth + 1 < STOP_THREADS && nth + 1 < j.n &&
           pthread_create(&th[nth], NULL, stop_worker, &j) == 0)
        nth++;
    stop_worker(&j); /* this thread is one of the workers */
    for (size_t i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
    for (size_t i = 0; i < j.n; i++)
        hvd_msg_free(&hvd_task_info_desc, &tasks[i]);
    free(tasks);
    *newest = j.newest;
    *holders = j.holders;
    return j.failed + (n - (size_t)k);
}
