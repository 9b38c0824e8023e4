/* The runtime's knobs (docs/runtime.md, "Settings"), read from the HOROVOD_* environment
 * variables by hvd_init. Rank 0's values are broadcast to every rank at start-up, because
 * fusion groups, cache slots and the bit vector must be identical everywhere. */
#ifndef HVD_RUNTIME_CONFIG_H
#define HVD_RUNTIME_CONFIG_H

#include <stdint.h>

#include "hvd/error.h"

/* HVD_CHASE_TIME_MS's default (engine.c). */
#define RT_CHASE_MS_DEFAULT 5.0

typedef struct rt_config {
    int64_t cycle_ns;          /* HOROVOD_CYCLE_TIME: time between the starts of two cycles */
    int64_t fusion_threshold;  /* HOROVOD_FUSION_THRESHOLD: largest fused allreduce, bytes */
    int64_t cache_capacity;    /* HOROVOD_CACHE_CAPACITY: response cache slots */
    int64_t stall_warn_ns;     /* HOROVOD_STALL_CHECK_TIME_SECONDS (0: no reports) */
    int64_t stall_shutdown_ns; /* HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (0: never fail) */
    int64_t chase_ns;          /* HVD_CHASE_TIME_MS: how long a rank holding entries its peers
                                  have not submitted starts cycles back to back (0: never);
                                  this rank's own, not broadcast (engine.c) */
    char timeline_path[1024];  /* HOROVOD_TIMELINE, "" when unset */
} rt_config;

/* Fills c from the environment, with defaults for what is unset or malformed. Returns 0, or
 * -1 with the first malformed variable in err (hvd_init still takes part in the start-up
 * collectives then, and fails on every rank together instead of leaving the others waiting). */
int rt_config_read(rt_config *c, hvd_err *err);

#endif
