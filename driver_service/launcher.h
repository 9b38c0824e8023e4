/* hvd-driver, the launcher: command line, local task services, the mpirun command, and the
 * report of results. Built on libhvd_driver (include/hvd/driver.h). */
#ifndef HVD_LAUNCHER_H
#define HVD_LAUNCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "hvd/driver.h"
#include "hvd/launch.h"

typedef struct launch_opts {
    bool serve;               /* `serve` instead of `run` */
    int np;                   /* number of tasks = ranks */
    int local_hosts;          /* --local H: start N local tasks on H fake hosts; 0: none */
    int timeout_s;            /* --timeout: whole job (0: none) */
    int start_timeout_s;      /* --start-timeout: registration and command start */
    const char *results_json; /* --results-json FILE */
    const char *env_file;     /* serve: --env-file FILE */
    const char **mpi_args;    /* --mpi-arg, in order */
    size_t n_mpi_args;
    const char *nics;      /* --nics a,b: fixed interfaces (no probing) */
    const char *entry;     /* --entry LIB.so:SYMBOL */
    const char *entry_arg; /* --entry-arg STR */
    char **command;        /* -- COMMAND ARGS... (NULL-terminated) */
    bool verbose;
} launch_opts;

/* Where the launcher keeps its files: a private 0700 directory with the secret file and, in
 * local mode, a work and temp dir per task and fake host. Removed at the end. */
typedef struct launch_dir {
    char path[256];
    char secret_file[300];
} launch_dir;

/* Local task services (--local). */
typedef struct local_tasks {
    pid_t *pids;
    int n;
} local_tasks;

/* Starts np hvd-task processes grouped into `hosts` fake hosts (distinct host hashes,
 * separate temp dirs). The environment must already hold HVD_SECRET and HVD_DRIVER_ADDRS.
 * Returns 0, or -1 with err (tasks already started are stopped). */
int local_tasks_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir, hvd_err *err);

/* Waits up to grace_ms for the tasks to exit, then kills what is left; reaps everything. */
void local_tasks_stop(local_tasks *lt, int grace_ms);

/* Prints the summary table and writes the JSON file if asked. Returns the process exit
 * status: 0 if mpirun and every rank succeeded, else non-zero with a line naming the first
 * failed rank. */
int report_results(hvd_driver *d, const launch_opts *o, int mpirun_status, bool timed_out);

#endif
