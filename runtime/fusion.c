/* Tensor fusion (fusion.h): many small allreduces cost one latency each, so ready allreduces
 * that can share one call (same type, op, scaling and device kind) are packed into a fusion
 * buffer and reduced together. Every rank plans from the same agreed entry order with the same
 * threshold (rank 0's, broadcast at init), so all ranks form identical groups. */
#include "fusion.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "types.h"

/* Whether two allreduces can share one call. */
static bool fusable(const rt_params *a, const rt_params *b) {
    return a->dtype == b->dtype && a->op == b->op && a->on_device == b->on_device &&
           a->prescale == b->prescale && a->postscale == b->postscale;
}

int rt_fusion_reserve(rt_group_list *l, size_t n) {
    if (n <= l->cap) return 0;
    size_t cap = l->cap ? l->cap : 64;
    while (cap < n)
        cap *= 2;
    /* Grow each array separately; a failure leaves the list usable at its old capacity. */
    rt_group *v = realloc(l->v, cap * sizeof *v);
    if (!v) return -1;
    l->v = v;
    rt_entry **members = realloc(l->members, cap * sizeof *members);
    if (!members) return -1;
    l->members = members;
    size_t *group_of = realloc(l->group_of, cap * sizeof *group_of);
    if (!group_of) return -1;
    l->group_of = group_of;
    size_t *open = realloc(l->open, cap * sizeof *open);
    if (!open) return -1;
    l->open = open;
    l->cap = cap;
    return 0;
}

static size_t new_group(rt_group_list *l, const rt_entry *e) {
    rt_group *g = &l->v[l->n];
    g->p = e->p;
    g->entries = NULL;
    g->n = 1;
    g->total_elems = e->p.count;
    return l->n++;
}

int rt_fusion_plan(rt_entry **entries, size_t n, int64_t threshold, rt_group_list *out) {
    if (rt_fusion_reserve(out, n) != 0) return -1;
    out->n = 0;
    /* Pass 1: which group each entry joins. Open groups still accept members (a handful at
     * most: one per distinct type/op combination in this cycle). */
    size_t nopen = 0;
    for (size_t i = 0; i < n; i++) {
        rt_entry *e = entries[i];
        if (!rt_entry_fusable(e, threshold)) {
            out->group_of[i] = new_group(out, e);
            continue;
        }
        size_t k = 0;
        for (; k < nopen; k++)
            if (fusable(&out->v[out->open[k]].p, &e->p)) break;
        if (k == nopen) {
            out->group_of[i] = out->open[nopen++] = new_group(out, e);
            continue;
        }
        rt_group *g = &out->v[out->open[k]];
        int64_t esize = (int64_t)rt_dtype_size(g->p.dtype);
        if ((g->total_elems + e->p.count) * esize <= threshold) {
            g->n++;
            g->total_elems += e->p.count;
            out->group_of[i] = out->open[k];
            continue;
        }
        /* Full: this group is done; the entry opens a new one in its place. */
        out->group_of[i] = out->open[k] = new_group(out, e);
    }
    /* Pass 2: lay the members out group after group, each group in agreed order. */
    size_t off = 0;
    for (size_t g = 0; g < out->n; g++) {
        out->v[g].entries = out->members + off;
        off += out->v[g].n;
        out->v[g].n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        rt_group *g = &out->v[out->group_of[i]];
        g->entries[g->n++] = entries[i];
    }
    return 0;
}

void rt_group_list_free(rt_group_list *l) {
    free(l->v);
    free(l->members);
    free(l->group_of);
    free(l->open);
    memset(l, 0, sizeof *l);
}

int rt_fusion_buffer_reserve(rt_fusion_buffer *fb, size_t n) {
    if (n <= fb->cap && fb->data) return 0;
    if (rt_fault_hit(RT_FAULT_FUSION)) return -1;
    /* Grow geometrically so a slowly growing working set does not reallocate every cycle. */
    size_t cap = fb->cap ? fb->cap : 1u << 20;
    while (cap < n)
        cap *= 2;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0) return -1;
    free(fb->data);
    fb->data = p;
    fb->cap = cap;
    return 0;
}

void rt_fusion_buffer_free(rt_fusion_buffer *fb) {
    free(fb->data);
    fb->data = NULL;
    fb->cap = 0;
}
