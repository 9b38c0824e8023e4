/* The MPI the runtime was built against, and the launcher that started the ranks. */
#ifndef HVD_RT_MPI_CHECK_H
#define HVD_RT_MPI_CHECK_H

#include "hvd/error.h"

/* Launcher families: the one that started the ranks must be the runtime's own. */
typedef enum rt_mpi_family {
    RT_MPI_UNKNOWN = 0,
    RT_MPI_OPENMPI4, /* ORTE: mpirun and orted of Open MPI <= 4.1 */
    RT_MPI_OPENMPI5, /* PRRTE: prterun and prted of Open MPI 5 */
    RT_MPI_MPICH,    /* Hydra: mpiexec and hydra_pmi_proxy of MPICH, Intel MPI */
} rt_mpi_family;

/* "Open MPI 5.0.11", "MPICH 5.0.2": from the mpi.h the runtime was compiled with. */
const char *rt_mpi_built_for(void);

/* Returns 0 when the ranks' launcher is unknown (no launcher: a singleton) or the runtime's
 * own family; else -1 with err naming both and what to do. Reads only the environment. */
int rt_mpi_check_launcher(hvd_err *err);

#endif
