/* The background thread's state and one cycle of its loop (Horovod's RunLoopOnce): drain the
 * submission queue, agree on the bit vector, negotiate what the cache cannot decide, fuse and
 * execute the agreed collectives in the agreed order, update the response cache, complete the
 * handles. Everything here runs on the background thread. */
#ifndef HVD_RUNTIME_CYCLE_H
#define HVD_RUNTIME_CYCLE_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "controller.h"
#include "entry.h"
#include "fusion.h"
#include "hvd/runtime.h"
#include "ops.h"
#include "response_cache.h"
#include "strmap.h"
#include "timeline.h"

/* A list of entries, in an order every rank agrees on where it matters. */
typedef struct rt_entry_vec {
    rt_entry **v;
    size_t n, cap;
} rt_entry_vec;

typedef struct rt_cycle {
    rt_config cfg; /* rank 0's knobs */
    int rank, size;
    rt_timeline *tl; /* rank 0 only, may be NULL */
    rt_controller ctl;
    rt_cache cache;
    rt_exec exec;         /* the backends' context: communicator, fusion buffer, scratch */
    rt_strmap pending;    /* name -> rt_entry*: everything this rank has not completed */
    rt_entry_vec unsent;  /* entries to send in the next full negotiation, in order */
    rt_entry_vec run;     /* this cycle's agreed entries, in the agreed order */
    rt_entry_vec failed;  /* this cycle's entries failed by the coordinator */
    rt_request *reqs;     /* this cycle's requests to the coordinator */
    size_t reqs_cap;      /* room in reqs */
    rt_group_list groups; /* this cycle's fusion plan */
    uint64_t *hit, *bad;  /* bit vector scratch, `words` words each */
    size_t words;
    int64_t evict_ns;       /* partial cache hits older than this go to the coordinator */
    int64_t fusable_host;   /* bytes of pending host allreduces that fusion could pack */
    int64_t fusable_device; /* the same on the device */
    int64_t nfusable_host;  /* how many allreduces those are */
    int64_t nfusable_device;
    int device;                /* CUDA device of this rank's device tensors, -1 before one */
    bool fusion_short;         /* the last fusion buffer reservation failed (logged once) */
    bool cache_small;          /* the response cache was found too small for a step (logged once) */
    int64_t cache_window_back; /* rt_cache_returned when the current window began */
    uint64_t cache_window_hits; /* stats.cached_responses then */
    rt_entry *orphans;          /* drained entries that could not be recorded (out of memory) */
    hvd_err broken;             /* this rank's bookkeeping failure (code 0 if none) */
    bool alone;      /* this rank left the collective sequence its peers are in (see cycle.c) */
    bool joined;     /* this rank's join was sent and has not completed */
    int join_device; /* the CUDA device its join gave for zeros, or HVD_DEVICE_CPU */
    rt_entry_vec standins; /* this cycle's stand-ins (owned), also listed in run */
    void *zeros, *sink;    /* host stand-ins' input (zeros) and output, standin_cap bytes each */
    size_t standin_cap;
    bool standin_short; /* a stand-in could not be made this cycle: this rank is alone */
    hvd_stats stats;
} rt_cycle;

/* Prepares everything this rank needs locally: the timeline (rank 0, when configured), the
 * backends, the controller, the cache and the scratch. comm is the runtime's communicator
 * (borrowed). Returns 0, or -1 with err; rt_cycle_free is safe either way. */
int rt_cycle_init(rt_cycle *b, const rt_config *cfg, MPI_Comm comm, int rank, int size,
                  hvd_err *err);
/* Releases it all (closing the timeline). */
void rt_cycle_free(rt_cycle *b);

/* Runs one cycle. Returns true when the loop must stop: every handle of this rank has then
 * failed with the reason, and the shared state says the runtime ended. */
bool rt_cycle_run(rt_cycle *b);

#endif
