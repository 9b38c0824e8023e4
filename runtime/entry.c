/* Submitted tensors (entry.h). */
#include "entry.h"

#include <stdlib.h>
#include <string.h>

#include "types.h"

rt_entry *rt_entry_new(int optype, hvd_dtype dtype, int device) {
    rt_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->p.optype = (uint8_t)optype;
    e->p.dtype = (uint8_t)dtype;
    e->p.on_device = device >= 0;
    e->p.row_elems = 1;
    e->p.prescale = 1.0;
    e->p.postscale = 1.0;
    e->device = device;
    e->cache_slot = -1;
    return e;
}

void rt_entry_free(rt_entry *e) {
    if (!e) return;
    free(e->name);
    free(e->splits);
    free(e->error);
    free(e);
}

void rt_entry_fail(rt_entry *e, int code, const char *msg) {
    if (e->status) return; /* keep the first reason */
    e->status = code ? code : HVD_E_INTERNAL;
    e->error = strdup(msg);
}

bool rt_entry_fusable(const rt_entry *e, int64_t threshold) {
    if (e->p.optype != RT_ALLREDUCE || threshold <= 0) return false;
    int64_t bytes = e->p.count * (int64_t)rt_dtype_size(e->p.dtype);
    if (!e->p.on_device && bytes >= RT_FUSION_HOST_ALONE_BYTES) return false;
    return bytes <= threshold;
}

int64_t rt_entry_fusable_bytes(const rt_entry *e, int64_t threshold) {
    return rt_entry_fusable(e, threshold) ? e->p.count * (int64_t)rt_dtype_size(e->p.dtype) : 0;
}
