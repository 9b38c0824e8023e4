/* The driver's tables: task index -> registration, host hash -> sorted indices, rank -> index,
 * reachability reports and results. Pure data structures; the caller holds hvd_driver.mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

int drv_reg_init(drv_registry *r, uint32_t n) {
    memset(r, 0, sizeof *r);
    r->n = n;
    r->tasks = calloc(n, sizeof *r->tasks);
    r->rank_index = malloc(n * sizeof *r->rank_index);
    r->results = calloc(n, sizeof *r->results);
    r->result_order = calloc(n, sizeof *r->result_order);
    r->gone_order = calloc(n, sizeof *r->gone_order);
    r->act = malloc(n * sizeof *r->act);
    if (!r->tasks || !r->rank_index || !r->results || !r->result_order || !r->gone_order ||
        !r->act) {
        drv_reg_free(r);
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        r->tasks[i].rank = -1;
        r->tasks[i].active = true;
        r->rank_index[i] = -1;
        r->act[i] = i;
    }
    r->nact = n;
    return 0;
}

void drv_reg_free(drv_registry *r) {
    for (uint32_t i = 0; r->tasks && i < r->n; i++) {
        hvd_msg_free(&hvd_task_info_desc, &r->tasks[i].info);
        free(r->tasks[i].reach);
        free(r->tasks[i].probe_to);
    }
    for (uint32_t i = 0; r->results && i < r->n; i++)
        hvd_msg_free(&hvd_result_desc, &r->results[i]);
    for (size_t h = 0; h < r->nhosts; h++) {
        free(r->hosts[h].host_hash);
        free(r->hosts[h].idx);
    }
    free(r->hosts);
    free(r->cand);
    free(r->tasks);
    free(r->rank_index);
    free(r->results);
    free(r->result_order);
    free(r->gone_order);
    free(r->act);
    memset(r, 0, sizeof *r);
}

/* Binary search: the position of host_hash, or where it would be inserted (*found false). */
static size_t host_pos(const drv_registry *r, const char *host_hash, bool *found) {
    size_t lo = 0, hi = r->nhosts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->hosts[mid].host_hash, host_hash);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

drv_host *drv_reg_host(drv_registry *r, const char *host_hash) {
    bool found;
    size_t pos = host_pos(r, host_hash, &found);
    return found ? &r->hosts[pos] : NULL;
}

/* Adds index to host_hash's sorted list (creating the host). No-op if already there.
 * Returns 0, or -1 on out of memory (nothing changed). */
static int host_add(drv_registry *r, const char *host_hash, uint32_t index) {
    bool found;
    size_t pos = host_pos(r, host_hash, &found);
    if (!found) {
        if (r->nhosts == r->caphosts) {
            size_t cap = r->caphosts ? r->caphosts * 2 : 16;
            drv_host *h = realloc(r->hosts, cap * sizeof *h);
            if (!h) return -1;
            r->hosts = h;
            r->caphosts = cap;
        }
        char *name = strdup(host_hash);
        if (!name) return -1;
        memmove(&r->hosts[pos + 1], &r->hosts[pos], (r->nhosts - pos) * sizeof *r->hosts);
        r->hosts[pos] = (drv_host){.host_hash = name};
        r->nhosts++;
    }
    drv_host *h = &r->hosts[pos];
    size_t at = 0;
    while (at < h->n && h->idx[at] < index)
        at++;
    if (at < h->n && h->idx[at] == index) return 0;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 4;
        uint32_t *v = realloc(h->idx, cap * sizeof *v);
        if (!v) {
            if (h->n == 0) { /* undo the host we just created */
                free(h->host_hash);
                memmove(&r->hosts[pos], &r->hosts[pos + 1],
                        (r->nhosts - pos - 1) * sizeof *r->hosts);
                r->nhosts--;
            }
            return -1;
        }
        h->idx = v;
        h->cap = cap;
    }
    memmove(&h->idx[at + 1], &h->idx[at], (h->n - at) * sizeof *h->idx);
    h->idx[at] = index;
    h->n++;
    return 0;
}

/* Removes index from host_hash's list; a host left with no task disappears, so the host list
 * never names a host with zero slots. */
static void host_remove(drv_registry *r, const char *host_hash, uint32_t index) {
    bool found;
    size_t pos = host_pos(r, host_hash, &found);
    if (!found) return;
    drv_host *h = &r->hosts[pos];
    for (size_t i = 0; i < h->n; i++) {
        if (h->idx[i] != index) continue;
        memmove(&h->idx[i], &h->idx[i + 1], (h->n - i - 1) * sizeof *h->idx);
        h->n--;
        break;
    }
    if (h->n == 0) {
        free(h->host_hash);
        free(h->idx);
        memmove(&r->hosts[pos], &r->hosts[pos + 1], (r->nhosts - pos - 1) * sizeof *r->hosts);
        r->nhosts--;
    }
}

static void drop_reach(drv_registry *r, drv_task *t) {
    if (!t->reported) return;
    free(t->reach);
    t->reach = NULL;
    t->reported = false;
    r->nreported--;
}

/* The candidate number of an interface name, or -1. */
static int cand_find(const drv_registry *r, const char *name) {
    for (size_t k = 0; k < r->ncand; k++)
        if (strcmp(r->cand[k], name) == 0) return (int)k;
    return -1;
}

/* Only IPv4 addresses make an interface usable: Open MPI's TCP transports (btl and oob, as
 * configured by the launcher) and Horovod work over IPv4, and an interface that has only an
 * IPv6 link-local address (bridges, veths) reaches every peer on one machine yet carries no
 * MPI traffic. */
static bool is_ipv4(const hvd_addr *a) {
    return strchr(a->host, ':') == NULL;
}

static bool declares(const hvd_task_info *t, const char *ifname) {
    const hvd_addr *a = t->addrs.v;
    for (size_t x = 0; x < t->addrs.n; x++)
        if (is_ipv4(&a[x]) && strcmp(a[x].ifname, ifname) == 0) return true;
    return false;
}

int drv_reg_put(drv_registry *r, hvd_task_info *info, const char *peer, drv_put_outcome *out) {
    drv_task *t = &r->tasks[info->index];
    memset(out, 0, sizeof *out);
    out->replaced = t->registered;
    out->moved = t->registered && strcmp(t->info.host_hash, info->host_hash) != 0;
    /* Add to the new host first: if that fails nothing has changed yet. */
    if (host_add(r, info->host_hash, info->index) != 0) return -1;
    if (out->moved) {
        snprintf(out->old_host, sizeof out->old_host, "%s", t->info.host_hash);
        host_remove(r, t->info.host_hash, info->index);
    }
    if (t->registered)
        hvd_msg_free(&hvd_task_info_desc, &t->info);
    else
        r->nregistered++;
    drop_reach(r, t);
    t->info = *info;
    memset(info, 0, sizeof *info);
    snprintf(t->peer, sizeof t->peer, "%s", peer ? peer : "");
    t->registered = true;
    t->done = false;
    t->used = false;
    return 0;
}

size_t drv_host_active(const drv_registry *r, const drv_host *h, uint32_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < h->n; i++)
        if (r->tasks[h->idx[i]].active) out[k++] = h->idx[i];
    return k;
}

bool drv_host_in_job(const drv_registry *r, const drv_host *h) {
    for (size_t i = 0; i < h->n; i++)
        if (r->tasks[h->idx[i]].active) return true;
    return false;
}

/* The local_rank-th active index of host h, or -1 (*nact: how many it has). */
static int64_t host_local_index(const drv_registry *r, const drv_host *h, uint32_t local_rank,
                                size_t *nact) {
    int64_t found = -1;
    *nact = 0;
    for (size_t i = 0; i < h->n; i++) {
        if (!r->tasks[h->idx[i]].active) continue;
        if (*nact == local_rank) found = h->idx[i];
        (*nact)++;
    }
    return found;
}

int drv_reg_set_rank(drv_registry *r, const char *host_hash, uint32_t local_rank, uint32_t rank,
                     uint32_t *index, hvd_err *err) {
    if (rank >= r->nact)
        return hvd_err_set(err, HVD_E_INVALID,
                           "rank %u is outside 0..%u: does mpirun start as many ranks as there "
                           "are tasks (-np)?",
                           rank, r->nact - 1);
    drv_host *h = drv_reg_host(r, host_hash);
    size_t nact = 0;
    int64_t found = h ? host_local_index(r, h, local_rank, &nact) : -1;
    if (!h || nact == 0)
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "no task registered with host hash %s: does the rank's "
                           "HOROVOD_HOSTNAME name the host hash its task registered with?",
                           host_hash);
    if (found < 0)
        return hvd_err_set(err, HVD_E_INVALID,
                           "local rank %u is outside 0..%zu: only %zu task(s) registered with "
                           "host hash %s, so mpirun should start no more ranks there",
                           local_rank, nact - 1, nact, host_hash);
    uint32_t idx = (uint32_t)found;
    drv_task *t = &r->tasks[idx];
    /* Idempotent: unmap whatever rank pointed at this task, and wherever this rank pointed. */
    if (t->rank >= 0) r->rank_index[t->rank] = -1;
    if (r->rank_index[rank] >= 0) r->tasks[r->rank_index[rank]].rank = -1;
    r->rank_index[rank] = idx;
    t->rank = rank;
    t->used = true;
    *index = idx;
    return 0;
}

/* Forgets the probe plan and every report of the last round. */
static void drop_plan(drv_registry *r) {
    for (uint32_t i = 0; i < r->n; i++) {
        drv_task *t = &r->tasks[i];
        drop_reach(r, t);
        free(t->probe_to);
        t->probe_to = NULL;
        t->nprobe = 0;
    }
    r->nprobers = 0;
}

int drv_reg_set_cand(drv_registry *r, bool *truncated) {
    *truncated = false;
    drop_plan(r);
    free(r->cand);
    r->cand = NULL;
    r->ncand = 0;
    const hvd_task_info *t0 = &r->tasks[r->act[0]].info;
    r->cand = calloc(DRV_MAX_CAND, sizeof *r->cand);
    if (!r->cand) return -1;
    const hvd_addr *a = t0->addrs.v;
    for (size_t x = 0; x < t0->addrs.n; x++) {
        const char *name = a[x].ifname;
        if (!name[0] || !is_ipv4(&a[x]) || cand_find(r, name) >= 0) continue;
        bool everywhere = true;
        for (uint32_t k = 1; k < r->nact && everywhere; k++)
            everywhere = declares(&r->tasks[r->act[k]].info, name);
        if (!everywhere) continue;
        if (r->ncand == DRV_MAX_CAND) {
            *truncated = true;
            break;
        }
        snprintf(r->cand[r->ncand++], HVD_IFNAME_MAX, "%s", name);
    }
    return 0;
}

bool drv_reg_is_cand(const drv_registry *r, const hvd_addr *a) {
    return is_ipv4(a) && cand_find(r, a->ifname) >= 0;
}

/* ---- The probe plan ------------------------------------------------------------------------ */

/* One host in planning: its lowest task and what identifies its network. */
typedef struct plan_host {
    uint32_t rep;
    char *key; /* its candidate IPv4 addresses, "ifname host" sorted, '\n'-joined */
} plan_host;

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_plan_host(const void *a, const void *b) {
    const plan_host *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    return x->rep < y->rep ? -1 : x->rep > y->rep;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The network key of a task: NULL on out of memory. */
static char *host_key(const drv_registry *r, const hvd_task_info *t) {
    const hvd_addr *a = t->addrs.v;
    char **v = calloc(t->addrs.n + 1, sizeof *v);
    if (!v) return NULL;
    size_t n = 0, len = 1;
    bool ok = true;
    for (size_t x = 0; x < t->addrs.n && ok; x++) {
        if (!is_ipv4(&a[x]) || cand_find(r, a[x].ifname) < 0) continue;
        size_t l = strlen(a[x].ifname) + strlen(a[x].host) + 2;
        ok = (v[n] = malloc(l)) != NULL;
        if (ok) snprintf(v[n++], l, "%s %s", a[x].ifname, a[x].host);
        len += l;
    }
    qsort(v, n, sizeof *v, cmp_str);
    char *key = ok ? malloc(len) : NULL;
    if (key) {
        key[0] = '\0';
        for (size_t k = 0; k < n; k++) {
            strcat(key, v[k]);
            strcat(key, "\n");
        }
    }
    for (size_t k = 0; k < n; k++)
        free(v[k]);
    free(v);
    return key;
}

/* Gives task `rep` room for `count` targets. */
static int plan_alloc(drv_registry *r, uint32_t rep, uint32_t count) {
    if (count == 0) return 0;
    drv_task *t = &r->tasks[rep];
    if (!(t->probe_to = malloc(count * sizeof *t->probe_to))) return -1;
    r->nprobers++;
    return 0;
}

int drv_reg_plan(drv_registry *r, drv_plan_stats *st) {
    memset(st, 0, sizeof *st);
    drop_plan(r);
    size_t nh = 0, cap = r->nhosts;
    plan_host *ph = calloc(cap ? cap : 1, sizeof *ph);
    uint32_t *lead = calloc(cap ? cap : 1, sizeof *lead);   /* first host of each network */
    uint32_t *gsize = calloc(cap ? cap : 1, sizeof *gsize); /* hosts in it */
    int rc = ph && lead && gsize ? 0 : -1;
    /* The hosts with active tasks, each stood for by its lowest active task. */
    for (size_t h = 0; rc == 0 && h < cap; h++) {
        int64_t rep = -1;
        for (size_t i = 0; i < r->hosts[h].n && rep < 0; i++)
            if (r->tasks[r->hosts[h].idx[i]].active) rep = r->hosts[h].idx[i];
        if (rep < 0) continue;
        ph[nh].rep = (uint32_t)rep;
        if (!(ph[nh++].key = host_key(r, &r->tasks[rep].info))) rc = -1;
    }
    size_t ng = 0;
    if (rc == 0) {
        qsort(ph, nh, sizeof *ph, cmp_plan_host);
        for (size_t h = 0; h < nh; h++) {
            if (h == 0 || strcmp(ph[h].key, ph[h - 1].key) != 0) lead[ng++] = (uint32_t)h;
            gsize[ng - 1]++;
        }
    }
    /* Room: one ring target in a network of two or more, and every other leader. */
    for (size_t g = 0; rc == 0 && g < ng; g++)
        for (uint32_t k = 0; rc == 0 && k < gsize[g]; k++)
            rc = plan_alloc(r, ph[lead[g] + k].rep,
                            (gsize[g] > 1 ? 1 : 0) + (k == 0 ? (uint32_t)ng - 1 : 0));
    for (size_t g = 0; rc == 0 && g < ng; g++) {
        for (uint32_t k = 0; k < gsize[g]; k++) {
            drv_task *t = &r->tasks[ph[lead[g] + k].rep];
            if (gsize[g] > 1) t->probe_to[t->nprobe++] = ph[lead[g] + (k + 1) % gsize[g]].rep;
            for (size_t o = 0; k == 0 && o < ng; o++)
                if (o != g) t->probe_to[t->nprobe++] = ph[lead[o]].rep;
            if (t->nprobe > 1) qsort(t->probe_to, t->nprobe, sizeof *t->probe_to, cmp_u32);
            st->pairs += t->nprobe;
        }
    }
    for (size_t h = 0; ph && h < nh; h++)
        free(ph[h].key);
    free(ph);
    free(lead);
    free(gsize);
    if (rc != 0) {
        drop_plan(r);
        memset(st, 0, sizeof *st);
        return -1;
    }
    st->hosts = (uint32_t)nh;
    st->networks = (uint32_t)ng;
    return 0;
}

int drv_reg_put_reach(drv_registry *r, const hvd_reachable_msg *m) {
    drv_task *t = &r->tasks[m->from];
    if (t->nprobe == 0) return 0; /* asked to probe nothing this round */
    uint64_t *row = calloc(t->nprobe, sizeof *row);
    if (!row) return -1;
    const hvd_reach *e = m->reach.v;
    for (size_t k = 0; k < m->reach.n; k++) {
        const uint32_t *at = bsearch(&e[k].to, t->probe_to, t->nprobe, sizeof *at, cmp_u32);
        if (!at) continue;
        const hvd_addr *a = e[k].addrs.v;
        for (size_t x = 0; x < e[k].addrs.n; x++) {
            if (!is_ipv4(&a[x])) continue;
            int c = cand_find(r, a[x].ifname);
            if (c >= 0) row[at - t->probe_to] |= (uint64_t)1 << c;
        }
    }
    drop_reach(r, t);
    t->reach = row;
    t->reported = true;
    r->nreported++;
    return 0;
}

void drv_reg_put_result(drv_registry *r, hvd_result_msg *m) {
    hvd_result_msg *slot = &r->results[m->rank];
    if (!r->result_order[m->rank]) {
        r->result_order[m->rank] = ++r->seq; /* a retry keeps it */
        r->nresults++;
    }
    hvd_msg_free(&hvd_result_desc, slot);
    *slot = *m;
    slot->present = true;
    memset(m, 0, sizeof *m);
}

void drv_reg_new_job(drv_registry *r) {
    for (uint32_t i = 0; i < r->n; i++) {
        drv_task *t = &r->tasks[i];
        t->rank = -1;
        drop_reach(r, t);
        r->rank_index[i] = -1;
        hvd_msg_free(&hvd_result_desc, &r->results[i]);
        r->result_order[i] = 0;
        r->gone_order[i] = 0;
    }
    for (size_t i = 0; i < r->nhosts; i++)
        r->hosts[i].agent_seen = false;
    r->nresults = 0;
    r->job++;
}

int drv_reg_set_active(drv_registry *r, const uint32_t *idx, size_t n, hvd_err *err) {
    if (n == 0 || n > r->n) return hvd_err_set(err, HVD_E_INVALID, "no task, or too many, given");
    for (size_t k = 0; k < n; k++) {
        if (idx[k] >= r->n || !r->tasks[idx[k]].registered)
            return hvd_err_set(err, HVD_E_INVALID, "task %u is not registered", idx[k]);
        for (size_t j = 0; j < k; j++)
            if (idx[j] == idx[k]) return hvd_err_set(err, HVD_E_INVALID, "task %u twice", idx[k]);
    }
    drv_reg_new_job(r);
    for (uint32_t i = 0; i < r->n; i++)
        r->tasks[i].active = false;
    for (size_t k = 0; k < n; k++)
        r->tasks[idx[k]].active = true;
    r->nact = 0;
    for (uint32_t i = 0; i < r->n; i++) /* ascending */
        if (r->tasks[i].active) r->act[r->nact++] = i;
    return 0;
}

void drv_reg_forget(drv_registry *r, uint32_t index) {
    drv_task *t = &r->tasks[index];
    if (!t->registered) return;
    host_remove(r, t->info.host_hash, index);
    hvd_msg_free(&hvd_task_info_desc, &t->info);
    drop_reach(r, t);
    t->registered = false;
    r->nregistered--;
}
