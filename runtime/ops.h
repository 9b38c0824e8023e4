/* What the backends (ops_mpi.c, ops_nccl.c) share: the execution context the cycle hands
 * them, and helpers every backend uses. Every backend function is entered by all ranks for
 * the same group in the same order, and every decision that could make one rank skip a call
 * is taken from agreed data only, so a rank never waits in a collective the others do not
 * enter. */
#ifndef HVD_RUNTIME_OPS_H
#define HVD_RUNTIME_OPS_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "fusion.h"
#include "hvd/error.h"
#include "timeline.h"

struct rt_mpi_types;
struct rt_nccl;

typedef struct rt_exec {
    MPI_Comm comm; /* the runtime's communicator */
    int rank, size;
    rt_timeline *tl;          /* rank 0 only, may be NULL */
    rt_fusion_buffer fusion;  /* host fusion buffer (reserved by the cycle before agreeing) */
    struct rt_mpi_types *mpi; /* MPI datatypes and ops for f16/bf16 (ops_mpi.h) */
    struct rt_nccl *nccl;     /* NCCL state (ops_nccl.h), NULL without NCCL */
    int *counts, *displs;     /* size entries each: scratch for v-collectives */
    int *rcounts, *rdispls;   /* size entries each: the receive side */
    int64_t *rows;            /* size entries: row counts when no output array exists */
} rt_exec;

/* Sets the communicator and allocates the scratch arrays. Returns 0, or -1 with err. */
int rt_exec_init(rt_exec *x, MPI_Comm comm, int rank, int size, hvd_err *err);
/* Frees the scratch arrays and the fusion buffer (not mpi, nccl or tl). */
void rt_exec_free(rt_exec *x);

/* Starts (what != NULL) or ends (NULL) a timeline activity on every tensor of the group. */
void rt_ops_activity(rt_exec *x, const rt_group *g, const char *what);

/* Agrees, before any data moves, on whether every rank could allocate what a collective needs
 * (alloc_ok) and, if checks_ok is not NULL, on a check each rank made alone (it becomes true
 * only if it held on every rank): one MPI_Allreduce over the runtime's communicator. Returns
 * MPI_SUCCESS and sets *failed_rank to the lowest rank that could not allocate, or to -1 if
 * all could. */
int rt_ops_agree(rt_exec *x, bool alloc_ok, int *failed_rank, bool *checks_ok);

#endif
