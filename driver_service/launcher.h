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
    int net_timeout_s;        /* --net-timeout (HVD_NET_TIMEOUT): a task service silent this
                                 long is lost (network partition) */
    const char *results_json; /* --results-json FILE */
    const char *env_file;     /* serve: --env-file FILE */
    const char **mpi_args;    /* --mpi-arg, in order */
    size_t n_mpi_args;
    const char *nics;      /* --nics a,b: fixed interfaces (no probing) */
    const char *entry;     /* --entry LIB.so:SYMBOL */
    const char *entry_arg; /* --entry-arg STR */
    char **command;        /* -- COMMAND ARGS... (NULL-terminated) */
    bool verbose;
    const char *ssh_hosts;       /* --ssh-hosts h1:slots,...: start the tasks there over ssh */
    int ssh_port;                /* --ssh-port (0: 22) */
    const char *ssh_user;        /* --ssh-user (NULL: this user, or user@ in the host list) */
    const char *ssh_identity;    /* --ssh-identity FILE (NULL: ssh-agent, ~/.ssh/id_*) */
    const char *ssh_known_hosts; /* --ssh-known-hosts FILE (NULL: ~/.ssh/known_hosts) */
    bool ssh_accept_new;         /* --ssh-accept-new: add unknown host keys (never changed ones) */
    const char *ssh_bin_dir;     /* --ssh-bin-dir DIR: hvd-task/hvd-exec there (NULL: ours) */
    bool ssh_fake_hosts;         /* --ssh-fake-hosts (tests): the hosts are all this machine */
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

/* Task services started over ssh (--ssh-hosts): one session per host, run by a thread each
 * (launcher_ssh.c). */
typedef struct ssh_tasks ssh_tasks;

/* Checks --ssh-hosts against -np without connecting anywhere; -np 0 (not given) becomes the
 * number of slots. Returns 0, or -1 with err. */
int ssh_hosts_check(launch_opts *o, hvd_err *err);

/* Starts the np hvd-task processes on the --ssh-hosts hosts, one session per host, tasks
 * numbered host by host in order. The job secret (HVD_SECRET in this process's environment)
 * goes through each session's stdin, the driver's addresses on its command line. A session
 * that fails or ends early makes hvd_driver_wait_registration fail with its reason, and so
 * does SIGINT/SIGTERM/SIGHUP (handled from now until ssh_tasks_stop). Returns the handle, or
 * NULL with err (nothing left started). */
ssh_tasks *ssh_tasks_start(const launch_opts *o, hvd_driver *d, const char *driver_addrs,
                           hvd_err *err);

/* After hvd_driver_shutdown_tasks: waits up to grace_ms for the sessions to end, ends the
 * rest (SIGTERM to the remote tasks' process group), closes every session, then kills what
 * is left of the job on each host and removes its files there. NULL is ignored. */
void ssh_tasks_stop(ssh_tasks *st, int grace_ms);

/* With --ssh-bin-dir: points mpirun's hvd-exec (the last word of argv) at that directory. */
int ssh_tasks_fix_argv(const launch_opts *o, char **mpi_argv, hvd_err *err);

/* Prints the summary table and writes the JSON file if asked. Returns the process exit
 * status: 0 if mpirun and every rank succeeded, else non-zero with a line naming the first
 * failed rank. */
int report_results(hvd_driver *d, const launch_opts *o, int mpirun_status, bool timed_out);

#endif
