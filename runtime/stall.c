/* The stall inspector (stall.h).
 *
 * A name that some ranks submitted and others did not blocks those ranks' handles forever,
 * which looks like a hang. The coordinator sees every pending name in its table, so it
 * periodically reports, per missing rank, which tensors that rank has not submitted, and
 * optionally fails names that wait too long. (Names waiting on the response cache path are
 * moved into the table by the engine before they can stall for long.) */
#include "stall.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* At most this many names are listed per rank, so one report stays readable. */
#define STALL_NAMES_PER_RANK 8

/* Appends e to the expired list; out of memory leaves it for the next check. */
static void push_expired(rt_table_entry ***v, size_t *n, size_t *cap, rt_table_entry *e) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        rt_table_entry **p = realloc(*v, c * sizeof *p);
        if (!p) return;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = e;
}

void rt_stall_check(rt_stall *st, const rt_strmap *table, int size, int64_t now,
                    rt_table_entry ***expired, size_t *nexpired) {
    *expired = NULL;
    *nexpired = 0;
    if (st->warn_ns <= 0 && st->shutdown_ns <= 0) return;
    int64_t period = st->warn_ns > 0 ? st->warn_ns : st->shutdown_ns;
    /* Checking costs a walk over the table: do it a few times per period, not every cycle. */
    if (now - st->last_check_ns < period / 4) return;
    st->last_check_ns = now;
    /* Reports go out at most once per warning period; expiries are checked every time. */
    bool report = st->warn_ns > 0 && now - st->last_warn_ns >= st->warn_ns;

    /* Per missing rank: the stalled names, and how many there are. */
    char **lines = NULL;
    int *counts = NULL;
    size_t *lens = NULL;
    bool any = false;
    size_t pos = 0, capexpired = 0;
    const char *key;
    void *value;
    while (rt_strmap_next(table, &pos, &key, &value) >= 0) {
        rt_table_entry *e = value;
        /* A joined rank waits, by design, for as long as the others still train. */
        if (e->optype == RT_JOIN) continue;
        int64_t age = now - e->first_ns;
        if (st->shutdown_ns > 0 && age > st->shutdown_ns)
            push_expired(expired, nexpired, &capexpired, e);
        if (!report || age <= st->warn_ns) continue;
        if (!any) {
            lines = calloc((size_t)size, sizeof *lines);
            counts = calloc((size_t)size, sizeof *counts);
            lens = calloc((size_t)size, sizeof *lens);
            if (!lines || !counts || !lens) {
                free(lines);
                free(counts);
                free(lens);
                rt_log("stall inspector: out of memory; the report is left for the next check");
                return;
            }
            any = true;
        }
        for (int r = 0; r < size; r++) {
            if (e->present[r]) continue;
            if (counts[r]++ >= STALL_NAMES_PER_RANK) continue;
            size_t add = strlen(e->name) + 4;
            char *line = realloc(lines[r], lens[r] + add + 1);
            if (!line) continue; /* the name is counted, not listed */
            lines[r] = line;
            lens[r] += (size_t)snprintf(lines[r] + lens[r], add + 1, "%s%s",
                                        lens[r] > 0 ? ", " : "", e->name);
        }
    }
    if (!any) return;
    st->warnings++;
    st->last_warn_ns = now;
    rt_log("stall inspector: one or more tensors were submitted by some ranks and have waited "
           "more than %.0f s for the others; this usually means ranks submit different names, "
           "or some ranks stopped submitting. Missing ranks (rank: tensors it has not "
           "submitted):",
           (double)st->warn_ns / 1e9);
    for (int r = 0; r < size; r++) {
        if (!counts[r]) continue;
        if (counts[r] > STALL_NAMES_PER_RANK)
            rt_log("  missing rank %d: [%s, ... %d more]", r, lines[r] ? lines[r] : "",
                   counts[r] - STALL_NAMES_PER_RANK);
        else
            rt_log("  missing rank %d: [%s]", r, lines[r] ? lines[r] : "");
        free(lines[r]);
    }
    free(lines);
    free(counts);
    free(lens);
}
