/* What launch.c shares with the elastic launches (elastic_*.c) of libhvd_launch; private to
 * driver_service/. */
#ifndef HVD_LAUNCH_INTERNAL_H
#define HVD_LAUNCH_INTERNAL_H

#include <sys/types.h>

#include "common/strv.h"
#include "hvd/launch.h"

/* mpirun's environment: this process's, with what the launcher needs (parts), cfg->extra_env
 * and then the job's variables (which win). Free with hvd_env_free. Returns NULL with err. */
char **mpirun_env(hvd_driver *d, const hvd_launch_config *cfg, const hvd_launch_parts *parts,
                  hvd_err *err);

/* The command line of the job from its parts (hvd_launch_argv without detecting the MPI
 * again). Free with hvd_launch_free_argv. NULL with err. */
char **launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                   const hvd_launch_parts *parts, hvd_err *err);

/* An environment variable for the ranks, in the launcher's words: Open MPI's -x NAME=VALUE,
 * Hydra's -genv NAME VALUE. */
void launch_rank_env(hvd_strb *a, hvd_mpi_impl mpi, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One line to cfg->log, if any. */
void launch_log(const hvd_launch_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Called after every mpirun (pid) has ended: removes its Open MPI 4 session directory
 * ($TMPDIR/ompi.<node>.<uid>/pid.<pid>), and the parent if empty, when mpirun could not (it
 * was killed: SIGKILL after its grace period, or a signal from Spark's stage cancel); does
 * nothing when mpirun removed it itself. */
void launch_remove_session_dir(pid_t pid);

#endif
