/* The runtime's view of one submitted tensor, from hvd_*_async to its handle's completion. */
#ifndef HVD_RUNTIME_ENTRY_H
#define HVD_RUNTIME_ENTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "hvd/runtime.h"
#include "params.h"

enum rt_entry_state {
    RT_E_NEW = 0, /* just drained from the queue */
    RT_E_CACHED,  /* waiting on a response cache slot (bit vector) */
    RT_E_UNSENT,  /* must be sent to the coordinator in the next full negotiation */
    RT_E_SENT,    /* the coordinator has it */
};

typedef struct rt_entry {
    char *name;
    rt_params p;
    const void *in;     /* send buffer */
    void *out;          /* receive buffer (allreduce, reducescatter), buf (broadcast) */
    int device;         /* HVD_DEVICE_CPU or CUDA ordinal */
    int64_t rows;       /* allgather/alltoall: this rank's first dim */
    int64_t *splits;    /* alltoall: rows sent to each rank (size entries, owned) */
    hvd_output *result; /* allgather/alltoall */
    int64_t handle;
    int state;                /* rt_entry_state */
    int cache_slot;           /* when RT_E_CACHED */
    int64_t partial_since_ns; /* first cycle its cache slot was pending on only some ranks */
    struct rt_entry *next;    /* submission queue link */
    bool stand_in;            /* this joined rank's zeros for another rank's allreduce (cycle.c):
                                 no handle, not pending, freed at the end of its cycle */
    /* result */
    int status; /* 0 ok, else hvd_status */
    char *error;
} rt_entry;

/* A new entry for optype (parameters defaulted: one element per row, no scaling). Returns
 * NULL on out of memory. */
rt_entry *rt_entry_new(int optype, hvd_dtype dtype, int device);
void rt_entry_free(rt_entry *e);

/* Records a failure (the first one wins). The message is copied; if that copy cannot be made,
 * the handle reports the status with a generic sentence. */
void rt_entry_fail(rt_entry *e, int code, const char *msg);

/* Host allreduces of at least this many bytes run alone, in place: copying them into the
 * fusion buffer and out again costs the CPU more than the call it saves (about 0.1 ms; at
 * memory speed 2 x 1 MiB take longer), and on a CPU job that CPU is the training's. Measured:
 * a 5.8M-parameter MLP's step on 2 ranks, 41.7 ms fused, 33.7 ms unfused (docs/runtime.md).
 * Device tensors are copied by the GPU and still fused. */
#define RT_FUSION_HOST_ALONE_BYTES ((int64_t)1 << 20)

/* Whether e is an allreduce that fusion may pack into a group of at most threshold bytes
 * (threshold <= 0: fusion is off). */
bool rt_entry_fusable(const rt_entry *e, int64_t threshold);

/* Bytes of e's data when rt_entry_fusable (host or device, by on_device), else 0. */
int64_t rt_entry_fusable_bytes(const rt_entry *e, int64_t threshold);

#endif
