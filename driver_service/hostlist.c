/* The -H host list for mpirun: host hashes sorted by name, rotated so the host of task 0 comes
 * first (Horovod's "barrel shift": with -map-by slot rank 0 then lands on task 0), each with its
 * number of tasks as slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

/* Formats the list; d->mu held, every task registered. NULL on out of memory. */
static char *format_hosts(const drv_registry *r) {
    size_t first = 0, len = 1;
    for (size_t h = 0; h < r->nhosts; h++) {
        if (r->hosts[h].n > 0 && r->hosts[h].idx[0] == 0) first = h; /* lists are sorted */
        len += strlen(r->hosts[h].host_hash) + 1 + 20 + 1;           /* "name:slots," */
    }
    char *out = malloc(len);
    if (!out) return NULL;
    size_t used = 0;
    out[0] = '\0';
    for (size_t k = 0; k < r->nhosts; k++) {
        const drv_host *h = &r->hosts[(first + k) % r->nhosts];
        used +=
            (size_t)snprintf(out + used, len - used, "%s%s:%zu", k ? "," : "", h->host_hash, h->n);
    }
    return out;
}

char *hvd_driver_host_list(hvd_driver *d, hvd_err *err) {
    char *out = NULL;
    pthread_mutex_lock(&d->mu);
    const drv_registry *r = &d->reg;
    if (r->nregistered < r->n)
        hvd_err_set(err, HVD_E_STATE,
                    "the host list needs every task registered, and only %u of %u are: wait "
                    "for registration first",
                    r->nregistered, r->n);
    else if (!(out = format_hosts(r)))
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    pthread_mutex_unlock(&d->mu);
    return out;
}
