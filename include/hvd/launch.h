/* Running the mpirun part of a job from a driver process (hvd-driver, a Spark driver JVM
 * through JNI, a Python driver through the hvd_bridge extension): DESIGN.md section 2, steps 3
 * to 8, in one call. Embeddable: it installs no signal handlers and never ends the process;
 * mpirun runs through the process runner (its own session, a lifeline to this process, only
 * async-signal-safe code after fork). */
#ifndef HVD_LAUNCH_H
#define HVD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

#include "hvd/defaults.h"
#include "hvd/driver.h"

/* Values of *hvd_launch_config.stop. */
enum {
    HVD_LAUNCH_STOP = 1,      /* stop the job */
    HVD_LAUNCH_STOP_LOST = 2, /* stop it, and a part of it is unreachable: do not wait on mpirun */
};

typedef struct hvd_launch_config {
    int np;                       /* ranks (= tasks) */
    const char *bin_dir;          /* where hvd-rsh is; NULL: hvd_launch_bin_dir() */
    const char *exec_bin_dir;     /* where hvd-exec is on the executors; NULL: bin_dir */
    const char *const *mpi_args;  /* extra mpirun arguments (NULL-terminated), or NULL */
    const char *const *extra_env; /* "NAME=VALUE" added to mpirun's environment (NULL-
                                     terminated), or NULL; the job's HVD_SECRET and
                                     HVD_DRIVER_ADDRS are always added and win */
    int timeout_s;                /* stop mpirun after this long; 0: never */
    int start_timeout_ms;         /* budget of registration, and of the interface probe; <= 0:
                                     HVD_START_TIMEOUT_DEFAULT_S */
    const int *output_fds;        /* {stdout, stderr} for mpirun's output (the ranks' output comes
                                     through it); NULL: this process's stdout and stderr */
    const int *stop;              /* or NULL: once *stop is non-zero (set with __atomic_store_n from
                                     any thread), the job is stopped as on timeout: a wait for the
                                     tasks fails at once, mpirun gets SIGTERM (its group and every
                                     descendant), SIGKILL HVD_MPIRUN_KILL_DELAY_MS later; or
                                     HVD_MPIRUN_LOST_KILL_DELAY_MS later once it is
                                     HVD_LAUNCH_STOP_LOST (also after an ordinary stop) */
    hvd_log_fn log;               /* the mpirun command line and progress; NULL: none */
    void *log_user;
} hvd_launch_config;

/* How the job's mpirun ended. */
typedef struct hvd_launch_outcome {
    int status;     /* mpirun's exit status (128+N for signal N) */
    int signal;     /* the signal that killed mpirun (0: it exited, maybe with 128+N after a
                       rank was killed by signal N); one we did not send means someone else
                       killed mpirun */
    bool timed_out; /* the timeout stopped it */
    bool stopped;   /* *stop stopped it */
} hvd_launch_outcome;

/* Runs the job on a started driver: waits for every task to register, has them find the
 * interfaces every pair shares, runs mpirun through hvd-rsh over them and waits for it (the
 * ranks' results are then in hvd_driver_results). Returns 0 with the outcome once mpirun
 * ran, or -1 with err if the job never got to mpirun (a task missing at the start timeout,
 * no common interface, *stop, mpirun not found: the message names which). */
int hvd_launch_job(hvd_driver *d, const hvd_launch_config *cfg, hvd_launch_outcome *out,
                   hvd_err *err);

/* The mpirun argv of the job over the registered tasks (host list from d) and the given
 * interfaces: NULL-terminated, malloc'd; free with hvd_launch_free_argv. NULL with err. */
char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err);
void hvd_launch_free_argv(char **argv);

/* The directory of hvd-rsh/hvd-exec: $HVD_BIN_DIR, else the directory of /proc/self/exe. */
const char *hvd_launch_bin_dir(void);

#endif
