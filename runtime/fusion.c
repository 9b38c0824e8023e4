/* Tensor fusion (HOROVOD_FUSION_THRESHOLD): many small allreduces cost one latency each, so
 * ready allreduces that can share one call (same type, op, scaling and device kind) are packed
 * into a fusion buffer and reduced together. Every rank plans from the same agreed entry order
 * with the same threshold (rank 0's, broadcast at init), so all ranks form identical groups. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Whether two allreduces can share one call. */
static bool fusable(const rt_params *a, const rt_params *b) {
    return a->dtype == b->dtype && a->op == b->op && a->on_device == b->on_device &&
           a->prescale == b->prescale && a->postscale == b->postscale;
}

static rt_group *new_group(rt_group_list *l, rt_entry *e) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = rt_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    rt_group *g = &l->v[l->n++];
    g->p = e->p;
    g->entries = rt_xmalloc(4 * sizeof *g->entries);
    g->entries[0] = e;
    g->n = 1;
    g->cap = 4;
    g->total_elems = e->p.count;
    return g;
}

void rt_fusion_plan(rt_entry **entries, size_t n, int64_t threshold, rt_group_list *out) {
    /* Open groups still accepting members, by index into out (a handful at most: one per
     * distinct type/op combination in this cycle). */
    size_t *open = NULL;
    size_t nopen = 0, capopen = 0;
    for (size_t i = 0; i < n; i++) {
        rt_entry *e = entries[i];
        int64_t bytes = e->p.count * (int64_t)rt_dtype_size(e->p.dtype);
        if (e->p.optype != RT_ALLREDUCE || threshold <= 0 || bytes > threshold) {
            new_group(out, e);
            continue;
        }
        size_t k = 0;
        for (; k < nopen; k++)
            if (fusable(&out->v[open[k]].p, &e->p)) break;
        if (k < nopen) {
            rt_group *g = &out->v[open[k]];
            int64_t esize = (int64_t)rt_dtype_size(g->p.dtype);
            if ((g->total_elems + e->p.count) * esize <= threshold) {
                if (g->n == g->cap) {
                    g->cap *= 2;
                    g->entries = rt_xrealloc(g->entries, g->cap * sizeof *g->entries);
                }
                g->entries[g->n++] = e;
                g->total_elems += e->p.count;
                continue;
            }
            /* Full: this group is done; the entry opens a new one in its place. */
            new_group(out, e);
            open[k] = out->n - 1;
            continue;
        }
        new_group(out, e);
        if (nopen == capopen) {
            capopen = capopen ? capopen * 2 : 8;
            open = rt_xrealloc(open, capopen * sizeof *open);
        }
        open[nopen++] = out->n - 1;
    }
    free(open);
}

void rt_group_list_free(rt_group_list *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].entries);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

void *rt_fusion_buffer_get(rt_fusion_buffer *fb, size_t n) {
    if (n <= fb->cap && fb->data) return fb->data;
    /* Grow geometrically so a slowly growing working set does not reallocate every cycle. */
    size_t cap = fb->cap ? fb->cap : 1u << 20;
    while (cap < n)
        cap *= 2;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0) return NULL;
    free(fb->data);
    fb->data = p;
    fb->cap = cap;
    return p;
}

void rt_fusion_buffer_free(rt_fusion_buffer *fb) {
    free(fb->data);
    fb->data = NULL;
    fb->cap = 0;
}
