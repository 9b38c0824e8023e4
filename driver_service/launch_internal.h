/* What launch.c shares with the elastic launches (elastic_*.c) of libhvd_launch; private to
 * driver_service/. */
#ifndef HVD_LAUNCH_INTERNAL_H
#define HVD_LAUNCH_INTERNAL_H

#include <sys/types.h>

#include "common/strv.h"
#include "hvd/launch.h"

/* mpirun's environment: this process's, with what the launcher needs (parts), cfg->extra_env,
 * the job's variables and TMPDIR=tmpdir (which win). Free with hvd_env_free. Returns NULL with
 * err. */
char **mpirun_env(hvd_driver *d, const hvd_launch_config *cfg, const hvd_launch_parts *parts,
                  const char *tmpdir, hvd_err *err);

/* A private directory for one mpirun, its TMPDIR ($TMPDIR, else /tmp, "/hvd-mpirun.XXXXXX"):
 * mpirun and its launcher (Open MPI's, PRRTE's or PMIx's session directories and rendezvous
 * files) write there, and mpirun's keeper removes it once mpirun has ended, even when this
 * process was killed. Returns the path (free with launch_tmpdir_remove), or NULL with err. */
char *launch_tmpdir_make(hvd_err *err);

/* Removes the directory from launch_tmpdir_make and what is left in it, and frees the path
 * (normally the keeper has removed it already). NULL is ignored. */
void launch_tmpdir_remove(char *dir);

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

#endif
