/* hvd-driver, the launcher: command line (launcher_opts.c), the job's private directory and
 * the run and serve flows (launcher_main.c), the watcher of signals and lost tasks
 * (launcher_watch.c), local task services (launcher_local.c), task services over ssh
 * (launcher_ssh.c), and the report of results (launcher_report.c). Built on libhvd_driver
 * and libhvd_launch (include/hvd/driver.h, launch.h). */
#ifndef HVD_LAUNCHER_H
#define HVD_LAUNCHER_H

#include <stdbool.h>
#include <getopt.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/strv.h"
#include "hvd/driver.h"
#include "hvd/launch.h"

/* horovodrun's tunable flags hvd-driver takes (launcher_elastic_opts.c). */
#define LAUNCH_TUNABLES 8

typedef struct launch_opts {
    bool serve;                  /* `serve` instead of `run` */
    int np;                      /* number of tasks = ranks */
    int local_hosts;             /* --local H: start N local tasks on H fake hosts; 0: none */
    bool fake_hostnames;         /* --local: each fake host's tasks in a UTS namespace named after
                                    it (Open MPI 5 over several fake hosts; needs root) */
    int timeout_s;               /* --timeout: whole job (0: none) */
    int start_timeout_s;         /* --start-timeout: registration and command start */
    int net_timeout_s;           /* --net-timeout (HVD_NET_TIMEOUT): a task service silent this
                                    long is lost (network partition) */
    const char *results_json;    /* --results-json FILE */
    const char *env_file;        /* serve: --env-file FILE */
    int jobs;                    /* serve: --jobs N, jobs one after another over the same tasks
                                    (0: until interrupted; default 1) */
    bool many_commands;          /* the task services run one command after another (hvd-task
                                    --elastic): an elastic job, or serve with --jobs other than 1 */
    hvd_mpi_impl mpi;            /* --mpi: whose launcher (HVD_MPI_AUTO: ask it) */
    const char *mpirun;          /* --mpirun PATH: the launcher (NULL: mpirun in PATH) */
    hvd_strb mpi_argb;           /* mpirun's extra words: --mpi-arg, --mpi-args, --output-filename,
                                    in order (owned) */
    const char *const *mpi_args; /* mpi_argb's words, NULL-terminated, once parsed */
    hvd_strb rank_envb;          /* "NAME=VALUE" for every rank: horovodrun's tunables such as
                                    --fusion-threshold-mb (owned) */
    const char *const *rank_env; /* rank_envb's strings, NULL-terminated, once parsed */
    const char *nics;            /* --nics a,b: fixed interfaces (no probing) */
    const char *bind;            /* --bind ADDR|IFACE: where the driver and local tasks listen */
    const char *entry;           /* --entry LIB.so:SYMBOL */
    const char *entry_arg;       /* --entry-arg STR */
    char **command;              /* -- COMMAND ARGS... (NULL-terminated) */
    const char *payload;      /* --payload FILE: the command's payload (an ARGV_IO entry point) */
    int lifeline_fd;          /* --lifeline-fd N: the read end of the starter's pipe, or -1 */
    const char *lifeline_dir; /* --lifeline-dir DIR: the starter's, removed when it is gone */
    bool verbose;
    bool quiet;                  /* --quiet: no results table, only a failure line */
    bool timestamp_output;       /* --prefix-output-with-timestamp (horovodrun_timestamps) */
    const char *ssh_hosts;       /* --ssh-hosts h1:slots,...: start the tasks there over ssh */
    int ssh_port;                /* --ssh-port (0: 22) */
    const char *ssh_user;        /* --ssh-user (NULL: this user, or user@ in the host list) */
    const char *ssh_identity;    /* --ssh-identity FILE (NULL: ssh-agent, ~/.ssh/id_*) */
    const char *ssh_known_hosts; /* --ssh-known-hosts FILE (NULL: ~/.ssh/known_hosts) */
    bool ssh_accept_new;         /* --ssh-accept-new: add unknown host keys (never changed ones) */
    const char *ssh_bin_dir;     /* --ssh-bin-dir DIR: hvd-task/hvd-exec there (NULL: ours) */
    bool ssh_fake_hosts;         /* --ssh-fake-hosts (tests): the hosts are all this machine */

    /* ---- elastic jobs and horovodrun's host flags (launcher_elastic_opts.c) ---- */
    bool elastic;                       /* --min-np, --max-np or --host-discovery-script given */
    int min_np, max_np;                 /* --min-np (default -np), --max-np (0: no limit) */
    const char *discovery_script;       /* --host-discovery-script */
    bool ssh_discovered;                /* --ssh: task services over ssh on the hosts the
                                           discovery script names */
    int slots;                          /* --slots: of a discovered host that names none (0: 1) */
    int reset_limit;                    /* --reset-limit (-1: none) */
    int elastic_timeout_s;              /* --elastic-timeout */
    int cooldown_min_s, cooldown_max_s; /* --blacklist-cooldown-range */
    const char *hosts;                  /* -H/--hosts (becomes ssh_hosts, or --local 1) */
    const char *hostfile;               /* --hostfile */
    char *hosts_buf;                    /* the -H list read from --hostfile (owned) */
    const char *output_dir;             /* --output-filename DIR */
    char *output_arg;                   /* ... absolute, for mpirun (owned) */
    char *tunables[LAUNCH_TUNABLES];    /* horovodrun's tunables given (--fusion-threshold-mb,
                                           ...), each "HOROVOD_X=VALUE" (owned), for rank_env */
} launch_opts;

/* ---- launcher_opts.c ---- */

/* Parses the command line into o (strings point into argv). Returns 0; or prints one line to
 * stderr and returns the exit status: 2 for a usage error; for --help prints the usage to
 * stdout and returns -1 (exit 0). */
int launch_opts_parse(int argc, char **argv, launch_opts *o);
void launch_opts_free(launch_opts *o);

/* For launcher_elastic_opts.c: a usage error (prints it, returns 2); a validated number. */
int launch_opts_usage_error(const char *what);
int launch_opts_number(const char *opt, const char *text, int min, int max, int *out);

/* ---- launcher_horovodrun.c: horovodrun's flags not taken as such ---- */

enum { OPT_HOROVODRUN_FLAG = 3000, OPT_HOROVODRUN_VERSION = 3999 };
/* Their long options (codes OPT_HOROVODRUN_FLAG + i), and -v/--version. */
const struct option *horovodrun_flag_options(void);
/* One of them: taken, said to be ignored (returns 0), or refused with why (returns 2). */
int horovodrun_flag_take(int c, launch_opts *o);
void horovodrun_print_version(void);
/* --prefix-output-with-timestamp, once o->mpi is known: Open MPI's --timestamp-output added to
 * the mpirun words (MPICH: said to be ignored). Returns 0, or the exit status. */
int horovodrun_timestamps(launch_opts *o);

/* ---- launcher_elastic_opts.c: elastic jobs and horovodrun's host flags ---- */

extern const char ELASTIC_USAGE[];
extern const struct option ELASTIC_LONG_OPTS[];
/* Defaults of the options below (before parsing), $HOROVOD_ELASTIC_TIMEOUT first. Returns 0, or
 * the exit status when that is no number of seconds. */
int elastic_opts_defaults(launch_opts *o);
/* One option of ELASTIC_LONG_OPTS (its second value, if any, is taken from argv[optind]).
 * Returns 0, or the exit status. */
int elastic_opts_take(int c, const char *v, int argc, char **argv, launch_opts *o);
/* After parsing: -H/--hostfile into ssh hosts or --local, --output-filename into mpirun's
 * arguments, the elastic options checked. Returns 0, or the exit status. */
int elastic_opts_finish(launch_opts *o);
void elastic_opts_free(launch_opts *o);
/* How many task indices the driver takes: -np in a static job; in an elastic one
 * max(-np, --max-np), or HVD_ELASTIC_LOCAL_TASKS_MAX for --local with a discovery script. */
int launch_task_slots(const launch_opts *o);

/* ---- launcher_main.c: the job's private directory ---- */

/* Progress lines with --verbose, warnings always (an hvd_log_fn; user: the launch_opts). */
void launcher_log(void *user, const char *line);

/* Where the launcher keeps its files: a private 0700 directory with the secret file and, in
 * local mode, a work and temp dir per task and fake host. Removed at the end, however the
 * launcher ends (a small process waits for it to end). */
typedef struct launch_dir {
    char path[256];
    char secret_file[300];
} launch_dir;

/* ---- launcher_watch.c: signals and lost tasks end the job through one path ---- */

typedef struct ssh_tasks ssh_tasks;
typedef struct local_tasks local_tasks;

/* Starts the watcher thread over this process's signal pipe (common/sig.h). A signal, or a
 * task service lost while the job runs, stops the job: the driver is aborted (waits for
 * registration or interfaces return at once), the launch's stop flag is raised (mpirun
 * stops), the ssh sessions are interrupted. Returns 0, or -1 with err. */
int watch_start(int signal_fd, int lifeline_fd, hvd_err *err);

/* Whether the lifeline (--lifeline-fd) is cut: the program that started hvd-driver is gone
 * (the watcher saw it and stopped the job, or it went after the watcher ended). Call after
 * watch_end. */
bool watch_orphaned(void);
/* From now on the watcher acts on this driver, these ssh sessions (either may be NULL). */
void watch_set_driver(hvd_driver *d);
void watch_set_ssh(ssh_tasks *st);
/* And over these local task services (--local, task i = lt->procs[i]; they must stay until
 * watch_end): one that exits before the job ended stops it, naming it; before it registered,
 * that is the only sign of it. */
void watch_set_local(const local_tasks *lt);
/* Lost tasks stop mattering (the job's part of the tasks is over). */
void watch_ignore_lost(void);
/* The stop flag for hvd_launch_config.stop. */
const int *watch_stop_flag(void);
/* Stops the job from any thread with a reason (the first reason wins). */
void watch_stop_job(const char *why);
/* Copies why the job was stopped ("" if it was not). */
void watch_stop_reason(char *out, size_t cap);
/* Stops the watcher thread. */
void watch_end(void);

/* ---- launcher_local.c ---- */

/* Local task services (--local): hvd-task processes run through the process runner. */
struct local_tasks {
    struct hvd_proc **procs;
    int n;
    int cap; /* room in procs */
};

/* Starts np hvd-task processes grouped into `hosts` fake hosts (distinct host hashes,
 * separate temp dirs), with `job_env` (the driver's hvd_driver_job_env) in their environment.
 * Returns 0, or -1 with err (tasks already started are stopped). */
int local_tasks_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir,
                      char *const *job_env, hvd_err *err);

/* Waits up to grace_ms for the tasks to exit, then stops what is left (SIGTERM, SIGKILL). */
void local_tasks_stop(local_tasks *lt, int grace_ms);

/* ---- launcher_ssh.c: task services started over ssh, one session per host ---- */

/* Checks --ssh-hosts against -np without connecting anywhere; -np 0 (not given) becomes the
 * number of slots. Returns 0, or -1 with err. */
int ssh_hosts_check(launch_opts *o, hvd_err *err);

/* Starts the np hvd-task processes on the --ssh-hosts hosts, one session per host, tasks
 * numbered host by host in order. The job secret (from job_env) goes through each session's
 * stdin, the driver's addresses on its command line. A session that fails or ends early makes
 * hvd_driver_wait_registration fail with its reason. Returns the handle, or NULL with err
 * (nothing left started). */
ssh_tasks *ssh_tasks_start(const launch_opts *o, hvd_driver *d, char *const *job_env, hvd_err *err);

/* Elastic, with a discovery script and --ssh: the handle without hosts (ssh_tasks_add_host
 * starts them). Returns it, or NULL with err. */
ssh_tasks *ssh_tasks_open(const launch_opts *o, hvd_driver *d, char *const *job_env, hvd_err *err);
/* Starts a session on host name ([user@]host) for n tasks, indices first..first+n-1, with the
 * host hash of the name (every character but [A-Za-z0-9_-] made '-'). Returns the host's
 * number for ssh_tasks_host_ended, or -1 with err. The launching thread only. */
int ssh_tasks_add_host(ssh_tasks *st, const char *name, int first, int n, hvd_err *err);
/* Whether that host's session ended (its tasks are gone). */
bool ssh_tasks_host_ended(ssh_tasks *st, int host);

/* Writes the hosts whose session has not started its tasks yet ("h1 (tasks 2-3), ...") into
 * buf; returns how many. NULL gives 0. Any thread. */
size_t ssh_tasks_starting(ssh_tasks *st, char *buf, size_t cap);

/* Interrupts every session (the remote tasks are ended). Any thread. */
void ssh_tasks_interrupt(ssh_tasks *st);

/* After hvd_driver_shutdown_tasks: waits up to grace_ms for the sessions to end, ends the
 * rest (SIGTERM to the remote tasks' process group), closes every session, then kills what
 * is left of the job on each host and removes its files there. NULL is ignored. */
void ssh_tasks_stop(ssh_tasks *st, int grace_ms);

/* Elastic, --local with a discovery script: starts n more hvd-task processes, indices first..
 * first+n-1, on the fake host whose host hash is host_hash. Returns 0, or -1 with err. */
int local_host_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir,
                     char *const *job_env, const char *host_hash, int first, int n, hvd_err *err);

/* ---- launcher_elastic.c: an elastic run ---- */

/* Runs the elastic job on the started driver; with a discovery script, starts the task
 * services of the hosts it names: into lt with --local, over ssh (ssh, from ssh_tasks_open)
 * with --ssh. Returns the process exit status. */
int elastic_run(hvd_driver *d, const launch_opts *o, local_tasks *lt, ssh_tasks *ssh,
                const launch_dir *dir, char *const *job_env);

/* ---- launcher_report.c ---- */

/* How the job's mpirun ended, for the report: its outcome (NULL with serve, where mpirun is
 * not ours) and why the job was stopped ("" if it was not: an interrupt, a lost task service,
 * --timeout). */
typedef struct job_end_info {
    const hvd_launch_outcome *mpirun;
    const char *stopped;
} job_end_info;

/* How the launcher itself ended the job, if it did: prints it (--timeout; a stop and its
 * reason) and puts the reason for the last line into why (cap bytes; "" if it did not). */
void job_stop_reason(const launch_opts *o, const hvd_launch_outcome *out, char *why, size_t cap);

/* Prints the summary table and writes the JSON file if asked. Returns the process exit
 * status: 0 if mpirun and every rank succeeded, else non-zero with a last line naming the part
 * of the job that failed first: why it was stopped; else mpirun killed from outside; else the
 * first failure the driver saw (hvd_driver_failure: a rank, a task service, an agent, orted);
 * else what is left to say (every rank stopped, none reported). */
int report_results(hvd_driver *d, const launch_opts *o, const job_end_info *end);

#endif
