/* Every rank's result, in rank order, for the launcher. */
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

static char *dup_or_null(const char *s, bool *oom) {
    if (!s) return NULL;
    char *c = strdup(s);
    if (!c) *oom = true;
    return c;
}

int hvd_driver_results(hvd_driver *d, hvd_rank_result **out, size_t *n, hvd_err *err) {
    *out = NULL;
    *n = 0;
    hvd_rank_result *v = calloc(d->num_tasks, sizeof *v);
    if (!v) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    bool oom = false;
    pthread_mutex_lock(&d->mu);
    const drv_registry *r = &d->reg;
    uint32_t nranks = r->nact; /* the job's size: all tasks, or an elastic launch's */
    for (uint32_t rank = 0; rank < nranks; rank++) {
        hvd_rank_result *o = &v[rank];
        const hvd_result_msg *m = &r->results[rank];
        o->rank = (int)rank;
        /* The task the rank represents: from SET_LOCAL_RANK, else what the rank reported. */
        int64_t index = r->rank_index[rank];
        if (index < 0 && m->present) index = m->index;
        o->index = index < 0 ? UINT32_MAX : (uint32_t)index;
        if (index >= 0 && r->tasks[index].registered)
            o->host_hash = dup_or_null(r->tasks[index].info.host_hash, &oom);
        if (!m->present) {
            o->gone = r->gone_order[rank];
            continue;
        }
        o->present = true;
        o->order = r->result_order[rank];
        o->status = m->status;
        o->stopped = m->stopped;
        o->error = dup_or_null(m->error, &oom);
        if (m->result.len > 0) {
            o->data = malloc(m->result.len);
            if (o->data) {
                memcpy(o->data, m->result.data, m->result.len);
                o->len = m->result.len;
            } else {
                oom = true;
            }
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (oom) {
        hvd_driver_results_free(v, d->num_tasks);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory copying the results");
    }
    *out = v;
    *n = nranks;
    return 0;
}

/* How a rank failed, for hvd_first_failed_rank: lower tiers were the cause more likely; -1:
 * not a failure of its own. What reached the driver from `limit` on (in the order of
 * hvd_rank_result.order) followed from the launcher's own stop and is not one either. */
static int failure_tier(const hvd_rank_result *r, bool any_reported, uint64_t limit) {
    if (!r->present)
        return any_reported && (limit == UINT64_MAX || (r->gone && r->gone < limit)) ? 2 : -1;
    if (r->status == 0 || r->stopped || r->order >= limit) return -1;
    return r->status > 0 && r->status < 128 ? 0 : 1;
}

/* Whether a failed before b, both of tier t: by the order their results arrived, or for
 * silent ranks when their connections closed (one never seen closing counts as later). */
static bool earlier(const hvd_rank_result *a, const hvd_rank_result *b, int t) {
    if (t < 2) return a->order < b->order;
    return a->gone && (!b->gone || a->gone < b->gone);
}

int drv_first_failed_before(const hvd_rank_result *r, size_t n, uint64_t limit) {
    bool any_reported = false;
    for (size_t i = 0; i < n; i++)
        any_reported |= r[i].present;
    int best = -1, best_tier = 3;
    for (size_t i = 0; i < n; i++) {
        int t = failure_tier(&r[i], any_reported, limit);
        if (t < 0) continue;
        if (t < best_tier || (t == best_tier && earlier(&r[i], &r[best], t))) {
            best = (int)i;
            best_tier = t;
        }
    }
    return best;
}

int hvd_first_failed_rank(const hvd_rank_result *r, size_t n) {
    return drv_first_failed_before(r, n, UINT64_MAX);
}

int hvd_driver_first_failed_rank(hvd_driver *d, const hvd_rank_result *r, size_t n) {
    pthread_mutex_lock(&d->mu);
    uint64_t limit = d->stopping_seq ? d->stopping_seq : UINT64_MAX;
    pthread_mutex_unlock(&d->mu);
    return drv_first_failed_before(r, n, limit);
}

/* Ranks that started (SET_LOCAL_RANK) and have not reported (d->mu held). */
static uint32_t started_unreported(const hvd_driver *d) {
    uint32_t k = 0;
    for (uint32_t rank = 0; rank < d->reg.n; rank++)
        k += d->reg.rank_index[rank] >= 0 && !d->reg.results[rank].present;
    return k;
}

size_t hvd_driver_ranks_started(hvd_driver *d, size_t *np) {
    size_t k = 0;
    pthread_mutex_lock(&d->mu);
    for (uint32_t rank = 0; rank < d->reg.nact; rank++)
        k += d->reg.rank_index[rank] >= 0;
    *np = d->reg.nact;
    pthread_mutex_unlock(&d->mu);
    return k;
}

size_t hvd_driver_ranks_failed(hvd_driver *d) {
    size_t k = 0;
    pthread_mutex_lock(&d->mu);
    for (uint32_t rank = 0; rank < d->reg.nact; rank++) {
        const hvd_result_msg *m = &d->reg.results[rank];
        k += m->present && m->status != 0 && !m->stopped;
    }
    pthread_mutex_unlock(&d->mu);
    return k;
}

bool hvd_driver_wait_results(hvd_driver *d, int timeout_ms) {
    int64_t deadline = hvd_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&d->mu);
    while (started_unreported(d) > 0 && drv_cond_wait(d, deadline)) {
    }
    bool all = d->reg.nresults >= d->num_tasks;
    pthread_mutex_unlock(&d->mu);
    return all;
}

void hvd_driver_results_free(hvd_rank_result *r, size_t n) {
    for (size_t i = 0; r && i < n; i++) {
        free(r[i].host_hash);
        free(r[i].data);
        free(r[i].error);
    }
    free(r);
}
