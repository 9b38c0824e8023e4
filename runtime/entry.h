/* The runtime's view of one submitted tensor, from hvd_*_async to its handle's completion. */
#ifndef HVD_RUNTIME_ENTRY_H
#define HVD_RUNTIME_ENTRY_H

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

/* Bytes of e's data when it is an allreduce that fusion could pack (host or device, by
 * on_device), else 0. */
int64_t rt_entry_fusable_bytes(const rt_entry *e, int64_t threshold);

#endif
