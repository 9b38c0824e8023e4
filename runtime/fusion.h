/* Tensor fusion (HOROVOD_FUSION_THRESHOLD): grouping of ready allreduces into one call, and
 * the host fusion buffer they are packed into. */
#ifndef HVD_RUNTIME_FUSION_H
#define HVD_RUNTIME_FUSION_H

#include <stddef.h>
#include <stdint.h>

#include "entry.h"
#include "params.h"

/* A unit of execution: one collective call for one or more (fused) entries. */
typedef struct rt_group {
    rt_params p;         /* agreed parameters (count is the first entry's; see total_elems) */
    rt_entry **entries;  /* n members in agreed order (points into the list's storage) */
    size_t n;            /* members */
    int64_t total_elems; /* sum of the members' counts (allreduce) */
} rt_group;

typedef struct rt_group_list {
    rt_group *v; /* n groups, in execution order */
    size_t n;
    /* planning storage, `cap` entries each */
    rt_entry **members;
    size_t *group_of;
    size_t *open;
    size_t cap;
} rt_group_list;

/* Makes room to plan n entries, so that rt_fusion_plan of up to n entries cannot fail.
 * Returns 0, or -1 on out of memory. */
int rt_fusion_reserve(rt_group_list *l, size_t n);

/* Turns an agreed list of entries (same order on all ranks) into execution groups: ready
 * allreduces with the same type, op, scaling and device kind are packed together up to
 * threshold bytes; everything else runs alone. Deterministic, so all ranks form the same
 * groups. Replaces out's groups. Returns 0, or -1 if more than the reserved room was needed
 * and memory ran out. */
int rt_fusion_plan(rt_entry **entries, size_t n, int64_t threshold, rt_group_list *out);
void rt_group_list_free(rt_group_list *l);

/* A growable, 64-byte aligned host buffer. */
typedef struct rt_fusion_buffer {
    void *data;
    size_t cap;
} rt_fusion_buffer;

/* Makes the buffer hold at least n bytes. Returns 0, or -1 on out of memory (the buffer keeps
 * what it had). */
int rt_fusion_buffer_reserve(rt_fusion_buffer *fb, size_t n);
void rt_fusion_buffer_free(rt_fusion_buffer *fb);

#endif
