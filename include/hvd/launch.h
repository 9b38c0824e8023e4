/* Running the mpirun part of a job from a driver process (hvd-driver, or a Spark driver JVM
 * through JNI): the mpirun command line of DESIGN.md section 2 step 4, run and waited for. */
#ifndef HVD_LAUNCH_H
#define HVD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

#include "hvd/driver.h"

typedef struct hvd_launch_config {
    int np;                       /* ranks (= tasks) */
    const char *bin_dir;          /* where hvd-rsh and hvd-exec are; NULL: next to this
                                     executable, or $HVD_BIN_DIR */
    const char *const *mpi_args;  /* extra mpirun arguments (NULL-terminated), or NULL */
    int timeout_s;                /* stop mpirun after this long; 0: never */
    bool verbose;                 /* print the command line to stderr */
    bool forward_signals;         /* install SIGINT/SIGTERM/SIGHUP handlers that pass the signal
                                     to mpirun (a CLI); false inside a JVM */
    const char *const *extra_env; /* "NAME=VALUE" entries added to mpirun's environment
                                     (NULL-terminated), e.g. HVD_SECRET and HVD_DRIVER_ADDRS
                                     from a process that cannot setenv safely; or NULL */
    const int *stop; /* or NULL: once *stop is non-zero (set with __atomic_store_n from any
                        thread), hvd_launch_run stops mpirun as on timeout (SIGTERM to its
                        group, SIGKILL 10 s later); e.g. a JVM that closes the job */
} hvd_launch_config;

/* Builds the mpirun argv for the registered job (host list from d, interfaces as given):
 * NULL-terminated, malloc'd; free with hvd_launch_free_argv. NULL with err. */
char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err);
void hvd_launch_free_argv(char **argv);

/* Runs argv (mpirun) in its own process group with stdin from /dev/null, stdout and stderr
 * inherited; its environment (this process's plus cfg->extra_env) must hold HVD_SECRET and
 * HVD_DRIVER_ADDRS. Kills it after
 * timeout_s. Returns its exit status (128+N for signal N), or -1 with err if it could not be
 * started; *timed_out tells whether the timeout struck. */
int hvd_launch_run(char **argv, const hvd_launch_config *cfg, bool *timed_out, hvd_err *err);

/* The directory of hvd-rsh/hvd-exec: $HVD_BIN_DIR, else the directory of /proc/self/exe. */
const char *hvd_launch_bin_dir(void);

#endif
