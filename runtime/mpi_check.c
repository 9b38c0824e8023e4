/* Which MPI the runtime was built against (mpi.h), and whether the launcher that started the
 * ranks belongs to it. Ranks started by another implementation's launcher do not fail in
 * MPI_Init: each one comes up as a singleton (size 1) or hangs in the wire-up, so hvd_init
 * looks at the variables each launcher sets first (docs/launcher.md). */
#include "mpi_check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(OPEN_MPI) && OMPI_MAJOR_VERSION >= 5
#define BUILT_FAMILY RT_MPI_OPENMPI5
#define BUILT_NAME   "Open MPI"
#elif defined(OPEN_MPI)
#define BUILT_FAMILY RT_MPI_OPENMPI4
#define BUILT_NAME   "Open MPI"
#elif defined(MPICH_VERSION)
#define BUILT_FAMILY RT_MPI_MPICH
#else
#define BUILT_FAMILY RT_MPI_UNKNOWN
#endif

#define STR_(x) #x
#define STR(x)  STR_(x)

const char *rt_mpi_built_for(void) {
#if defined(OPEN_MPI)
    return BUILT_NAME
        " " STR(OMPI_MAJOR_VERSION) "." STR(OMPI_MINOR_VERSION) "." STR(OMPI_RELEASE_VERSION);
#elif defined(I_MPI_VERSION)
    return "Intel MPI " I_MPI_VERSION;
#elif defined(MPICH_VERSION)
    return "MPICH " MPICH_VERSION;
#else
    return "an unknown MPI";
#endif
}

static int set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

/* The launcher family the environment shows, with the variable that shows it. */
static rt_mpi_family launched_by(const char **why) {
    if (set("PRTE_LAUNCHED")) { /* prted, Open MPI 5's daemon */
        *why = "PRTE_LAUNCHED";
        return RT_MPI_OPENMPI5;
    }
    if (set("OMPI_MCA_orte_hnp_uri") || set("OMPI_MCA_orte_launch")) { /* orted, up to 4.1 */
        *why = set("OMPI_MCA_orte_hnp_uri") ? "OMPI_MCA_orte_hnp_uri" : "OMPI_MCA_orte_launch";
        return RT_MPI_OPENMPI4;
    }
    if (set("PMI_RANK") && (set("PMI_FD") || set("PMI_PORT")) && !set("OMPI_COMM_WORLD_RANK")) {
        *why = set("PMI_FD") ? "PMI_RANK and PMI_FD" : "PMI_RANK and PMI_PORT"; /* Hydra */
        return RT_MPI_MPICH;
    }
    *why = NULL;
    return RT_MPI_UNKNOWN; /* no launcher (a singleton), or one that says nothing we know */
}

static const char *family_name(rt_mpi_family f) {
    switch (f) {
    case RT_MPI_OPENMPI4:
        return "Open MPI 4's orted";
    case RT_MPI_OPENMPI5:
        return "Open MPI 5's prted (PRRTE)";
    case RT_MPI_MPICH:
        return "Hydra's proxy (MPICH, Intel MPI)";
    default:
        return "an unknown launcher";
    }
}

static const char *family_word(rt_mpi_family f) {
    return f == RT_MPI_OPENMPI4 ? "openmpi4" : f == RT_MPI_OPENMPI5 ? "openmpi5" : "mpich";
}

int rt_mpi_check_launcher(hvd_err *err) {
    const char *why;
    rt_mpi_family by = launched_by(&why);
    if (by == RT_MPI_UNKNOWN || BUILT_FAMILY == RT_MPI_UNKNOWN || by == BUILT_FAMILY) return 0;
    return hvd_err_set(err, HVD_E_STATE,
                       "this rank was started by %s (it set %s), but the runtime was built "
                       "against %s (its mpi.h) and cannot join that job (each rank would come "
                       "up alone, or hang): build the runtime and the entry point against the "
                       "launcher's MPI (cmake -DHVD_MPI=<its prefix>), or start the job with "
                       "the launcher of %s (hvd-driver --mpi %s)",
                       family_name(by), why, rt_mpi_built_for(), rt_mpi_built_for(),
                       family_word(BUILT_FAMILY));
}
