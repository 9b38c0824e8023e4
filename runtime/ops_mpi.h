/* Collectives on host buffers with MPI, on the runtime's own communicator. */
#ifndef HVD_RUNTIME_OPS_MPI_H
#define HVD_RUNTIME_OPS_MPI_H

#include "hvd/error.h"
#include "ops.h"

typedef struct rt_mpi_types rt_mpi_types;

/* Creates the MPI datatypes and ops for f16/bf16. Returns NULL with err on failure. */
rt_mpi_types *rt_mpi_types_create(hvd_err *err);
void rt_mpi_types_free(rt_mpi_types *t);

/* Runs one group on host buffers. Returns 0, or -1 with err (every entry of the group fails
 * with it; the failure is the same on every rank). */
int rt_mpi_execute(rt_exec *x, rt_group *g, hvd_err *err);

#endif
