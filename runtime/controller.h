/* Negotiation (Horovod's controller): which named tensors are ready on every rank, in one
 * order for all ranks. The coordinator is rank 0. */
#ifndef HVD_RUNTIME_CONTROLLER_H
#define HVD_RUNTIME_CONTROLLER_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "hvd/error.h"
#include "params.h"
#include "stall.h"
#include "strmap.h"
#include "timeline.h"

/* Flags carried in the bit vector and the request message. */
enum {
    RT_FLAG_SHUTDOWN = 1u << 0,   /* this rank called hvd_shutdown */
    RT_FLAG_UNCACHED = 1u << 1,   /* this rank has requests the coordinator has not seen */
    RT_FLAG_COORD_WORK = 1u << 2, /* the coordinator has responses to send (stall errors) */
    RT_FLAG_NO_FUSION = 1u << 3,  /* this rank could not reserve its fusion buffer: every rank
                                     runs this cycle's allreduces unfused */
    RT_FLAG_BROKEN = 1u << 4      /* this rank ran out of memory for its bookkeeping: every rank
                                     fails everything and stops (rt_controller_share_failure) */
};

typedef struct rt_controller {
    MPI_Comm comm;
    int rank, size;
    rt_timeline *tl; /* rank 0 only, may be NULL */
    rt_stall stall;
    /* coordinator state (rank 0) */
    rt_strmap table;          /* name -> rt_table_entry* */
    rt_response_list backlog; /* stall errors waiting for the next full negotiation */
    uint8_t *joined;          /* size entries: rank r has joined (hvd_join) and not all have */
    uint8_t *join_device;     /* size entries: ... and gave a CUDA device for its zeros */
    int njoined;              /* ranks joined */
    int last_joined;          /* the rank that joined last */
    /* scratch, allocated at init */
    uint64_t *bits; /* 2 x (1 + 3 x words): the bit vector sent and received */
    size_t words;
    int *lens, *displs; /* size entries each: gathered message lengths (rank 0) */
    int *ranks;         /* size entries: rank lists for messages */
    /* scratch, grown as needed */
    hvd_buf sendbuf;
    uint8_t *recvbuf;
    size_t recvcap;
} rt_controller;

/* Prepares a controller for bit vectors of `words` 64-bit words. Returns 0, or -1 with err on
 * out of memory (rt_controller_free is still safe). */
int rt_controller_init(rt_controller *c, MPI_Comm comm, int rank, int size, size_t words,
                       rt_timeline *tl, hvd_err *err);
void rt_controller_free(rt_controller *c);

/* Result of the bit-vector agreement. Vectors have `words` 64-bit words. */
typedef struct rt_bits_result {
    uint32_t flags_or;       /* RT_FLAG_* set on any rank */
    const uint64_t *and_hit; /* cache slots pending (and matching) on every rank */
    const uint64_t *or_hit;  /* ... on at least one rank */
    const uint64_t *or_bad;  /* slots some rank asks to invalidate */
    size_t words;
} rt_bits_result;

/* One allreduce(BAND) over [~flags, hit, ~hit, ~bad]; hit and bad have the init's `words`.
 * Returns 0, or -1 with err on an MPI error. */
int rt_controller_sync_bits(rt_controller *c, uint32_t flags, const uint64_t *hit,
                            const uint64_t *bad, rt_bits_result *out, hvd_err *err);

/* What rt_controller_negotiate returns. */
enum {
    RT_NEG_OK = 0,
    RT_NEG_FAILED = -1, /* the negotiation failed on every rank alike, with the same err */
    RT_NEG_ALONE = -2   /* this rank alone could not go on (out of memory receiving the
                           coordinator's list, or at the coordinator gathering the requests);
                           the others carry on with the cycle without it */
};

/* Full negotiation: gathers every rank's new requests at the coordinator, which matches them
 * by name, checks that all ranks agree, and broadcasts the responses for names now ready on
 * every rank (in one order) plus error responses. On shutdown (flag set on any rank) every
 * name left pending fails. Appends to out. A failure the coordinator learns of (a malformed or
 * oversized message, a rank out of memory building its message, the coordinator out of memory
 * deciding) is broadcast as a sentence, so every rank fails with the same err.
 *
 * Join: a rank that sent a RT_JOIN request counts as present for every name until all ranks
 * have joined, so an allreduce is ready once every rank that has not joined asked for it (the
 * joined ones run it with zeros; any other collective fails then). The join's own response
 * comes last in its list, with the last rank to join as its root. */
int rt_controller_negotiate(rt_controller *c, uint32_t my_flags, const rt_request *reqs, size_t n,
                            rt_response_list *out, hvd_err *err);

/* After a bit vector with RT_FLAG_BROKEN: every rank calls this together; mine is this rank's
 * failure (code 0 if none). Fills out with the failure of the lowest failed rank, on every
 * rank. Returns 0, or -1 with out describing the MPI error. */
int rt_controller_share_failure(rt_controller *c, const hvd_err *mine, hvd_err *out);

/* Coordinator housekeeping every cycle: the stall inspector, which may queue error responses
 * for names that waited past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS. No-op on other ranks. */
void rt_controller_tick(rt_controller *c, int64_t now);

/* True on the coordinator if it holds responses for the next full negotiation. */
bool rt_controller_has_backlog(const rt_controller *c);

#endif
