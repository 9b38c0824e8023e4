/* The -H host list for mpirun: host hashes sorted by name, rotated so the host of task 0 (the
 * first active task) comes first (Horovod's "barrel shift": with -map-by slot rank 0 then lands
 * on task 0), each with its number of (active) tasks as slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

/* Active tasks of host h (its slots). */
static size_t active_on(const drv_registry *r, const drv_host *h) {
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++)
        n += r->tasks[h->idx[i]].active;
    return n;
}

/* Formats the list over the active tasks (in a static job: all); d->mu held, every active
 * task registered. The host of the first active task comes first. NULL on out of memory. */
static char *format_hosts(const drv_registry *r) {
    size_t first = 0, len = 1;
    for (size_t h = 0; h < r->nhosts; h++) {
        for (size_t i = 0; i < r->hosts[h].n; i++)
            if (r->hosts[h].idx[i] == r->act[0]) first = h;
        len += strlen(r->hosts[h].host_hash) + 1 + 20 + 1; /* "name:slots," */
    }
    char *out = malloc(len);
    if (!out) return NULL;
    size_t used = 0;
    out[0] = '\0';
    for (size_t k = 0; k < r->nhosts; k++) {
        const drv_host *h = &r->hosts[(first + k) % r->nhosts];
        size_t slots = active_on(r, h);
        if (slots == 0) continue;
        used += (size_t)snprintf(out + used, len - used, "%s%s:%zu", used ? "," : "", h->host_hash,
                                 slots);
    }
    return out;
}

/* How many active tasks have not registered. d->mu held. */
static uint32_t active_missing(const drv_registry *r) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < r->nact; k++)
        n += !r->tasks[r->act[k]].registered;
    return n;
}

char *hvd_driver_host_list(hvd_driver *d, hvd_err *err) {
    char *out = NULL;
    pthread_mutex_lock(&d->mu);
    const drv_registry *r = &d->reg;
    uint32_t missing = active_missing(r);
    if (missing > 0)
        hvd_err_set(err, HVD_E_STATE,
                    "the host list needs every task registered, and only %u of %u are: wait "
                    "for registration first",
                    r->nact - missing, r->nact);
    else if (!(out = format_hosts(r)))
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_unlock(&d->mu);
    return out;
}
