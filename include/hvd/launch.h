/* Running the mpirun part of a job from a driver process (hvd-driver, a Spark driver JVM
 * through JNI, a Python driver through the hvd_bridge extension): DESIGN.md section 2, steps 3
 * to 8, in one call. Embeddable: it installs no signal handlers and never ends the process;
 * mpirun runs through the process runner (its own session, a lifeline to this process, only
 * async-signal-safe code after fork). */
#ifndef HVD_LAUNCH_H
#define HVD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/defaults.h"
#include "hvd/driver.h"

/* Values of *hvd_launch_config.stop. */
enum {
    HVD_LAUNCH_STOP = 1,      /* stop the job */
    HVD_LAUNCH_STOP_LOST = 2, /* stop it, and a part of it is unreachable: do not wait on mpirun */
};

/* The MPI implementations whose launchers hvd-bridge drives (docs/launcher.md): each starts its
 * per-host daemon through an ssh-like agent, and hvd-rsh is that agent for all of them. */
typedef enum hvd_mpi_impl {
    HVD_MPI_AUTO = 0, /* ask the launcher: `mpirun --version` (hvd_mpi_detect) */
    HVD_MPI_OPENMPI4, /* Open MPI up to 4.1: ORTE's mpirun, orted, -mca plm_rsh_agent */
    HVD_MPI_OPENMPI5, /* Open MPI 5: PRRTE's prterun, prted, --prtemca plm_ssh_agent */
    HVD_MPI_MPICH,    /* MPICH and Intel MPI: Hydra's mpiexec, hydra_pmi_proxy, -launcher-exec */
} hvd_mpi_impl;

/* "openmpi4", "openmpi5", "mpich" or "auto". */
const char *hvd_mpi_impl_name(hvd_mpi_impl mpi);

/* The implementation named by one of those words. Returns 0, or -1 for another word. */
int hvd_mpi_impl_parse(const char *name, hvd_mpi_impl *out);

/* The per-host daemon an implementation's launcher starts through the agent on every host:
 * "orted", "prted" or "hydra_pmi_proxy" (HVD_MPI_AUTO: "orted", the default MPI's). */
const char *hvd_mpi_daemon(hvd_mpi_impl mpi);

/* Which implementation a launcher's `--version` text describes ("mpirun (Open MPI) 5.0.11",
 * Hydra's "HYDRA build details: ... Version: 4.2.1", Intel MPI's "Intel(R) MPI Library ...").
 * Returns 0 with *out (never HVD_MPI_AUTO) and the version (e.g. "Open MPI 5.0.11") in
 * version, or -1 when the text names none of them. */
int hvd_mpi_parse_version(const char *text, hvd_mpi_impl *out, char *version, size_t cap);

/* Runs `mpirun --version` (mpirun: a path, or a name looked up in PATH; NULL: "mpirun") and
 * parses it. Returns 0 with *out and version, or -1 with err (not found, failed, silent for
 * 10 s, or an implementation hvd-bridge does not know). */
int hvd_mpi_detect(const char *mpirun, hvd_mpi_impl *out, char *version, size_t cap, hvd_err *err);

/* For an MPI named by the user (mpi not HVD_MPI_AUTO), the launcher this process will run
 * (mpirun, as hvd_mpi_detect takes it): -1 with err saying what to give when `mpirun
 * --version` names another implementation (its options would go to the wrong launcher:
 * Open MPI 5's prterun, given Open MPI 4's agent option, falls back to ssh) or when it cannot
 * be run at all; 0 when it names the same one, or none hvd-bridge knows (an explicit --mpi is
 * how such a launcher is used). */
int hvd_mpi_check_named(hvd_mpi_impl mpi, const char *mpirun, hvd_err *err);

typedef struct hvd_launch_config {
    int np;                       /* ranks (= tasks) */
    hvd_mpi_impl mpi;             /* whose command line to write; HVD_MPI_AUTO: hvd_mpi_detect */
    const char *mpirun;           /* the launcher: a path, or a name in PATH; NULL: "mpirun" */
    const char *bin_dir;          /* where hvd-rsh is; NULL: hvd_launch_bin_dir() */
    const char *exec_bin_dir;     /* where hvd-exec is on the executors; NULL: bin_dir */
    const char *const *mpi_args;  /* extra mpirun arguments (NULL-terminated), or NULL */
    const char *const *rank_env;  /* "NAME=VALUE" for every rank (NULL-terminated), or NULL:
                                     Open MPI's -x, Hydra's -genv, in the parts' args */
    const char *const *extra_env; /* "NAME=VALUE" added to mpirun's environment (NULL-
                                     terminated), or NULL; the job's HVD_SECRET and
                                     HVD_DRIVER_ADDRS are always added and win */
    const char *output_dir;       /* or NULL: each rank's stdout and stderr also go to files
                                     under this absolute path, in the launcher's own way:
                                     Open MPI 4 DIR/1/rank.R/stdout (and stderr), Open MPI 5
                                     DIR/rank.<its job id>.R.out (and .err), MPICH
                                     DIR/1/rank.R/stdout (and stderr); the directories are
                                     made by launch_argv. Open MPI 5 and Hydra write the files
                                     instead of the terminal */
    int timeout_s;                /* stop mpirun after this long; 0: never */
    int start_timeout_ms;         /* budget of registration, of the interface probe, and of the
                                     ranks' start once mpirun runs; <= 0:
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
    bool forward_env; /* pass this process's environment on to the ranks, as
                         horovodrun does (Open MPI's -x NAME for each variable but
                         hvd-bridge's, MPI's, TMPDIR and a few of the shell's;
                         Hydra forwards it by itself): for task services that do
                         not inherit it (ssh hosts) */
} hvd_launch_config;

/* How the job's mpirun ended. */
typedef struct hvd_launch_outcome {
    int status;       /* mpirun's exit status (128+N for signal N) */
    int signal;       /* the signal that killed mpirun (0: it exited, maybe with 128+N after a
                         rank was killed by signal N); one we did not send means someone else
                         killed mpirun */
    bool timed_out;   /* the timeout stopped it */
    bool stopped;     /* *stop stopped it */
    bool late;        /* stopped because not every rank had started within the start timeout of
                         mpirun's start (hvd_driver_failure says so: HVD_FAILURE_LAUNCH) */
    bool rank_failed; /* stopped because a rank failed and the launcher kept the others
                         running (Hydra: a rank that exits non-zero ends nothing); the rank is
                         the failure (hvd_driver_failure) */
} hvd_launch_outcome;

/* Runs the job on a started driver: waits for every task to register, has them find the
 * interfaces every pair shares, runs mpirun through hvd-rsh over them and waits for it (the
 * ranks' results are then in hvd_driver_results). Returns 0 with the outcome once mpirun
 * ran, or -1 with err if the job never got to mpirun (a task missing at the start timeout,
 * no common interface, *stop, mpirun not found: the message names which). */
int hvd_launch_job(hvd_driver *d, const hvd_launch_config *cfg, hvd_launch_outcome *out,
                   hvd_err *err);

/* The mpirun argv of the job over the registered tasks (host list from d) and the given
 * interfaces, in the dialect of cfg->mpi (HVD_MPI_AUTO: detected first): NULL-terminated,
 * malloc'd; free with hvd_launch_free_argv. NULL with err. */
char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err);
void hvd_launch_free_argv(char **argv);

/* The pieces of hvd_launch_argv's command line that a command typed by hand needs as well
 * (hvd-driver serve writes them into its env file; docs/launcher.md shows them per
 * implementation), each a NULL-terminated vector. */
typedef struct hvd_launch_parts {
    hvd_mpi_impl mpi; /* the dialect: cfg->mpi, or what the launcher said (never AUTO) */
    char version[64]; /* the launcher's own word when detected ("Open MPI 5.0.11"), or "" */
    char **args;      /* what every job wants: no name resolution, no stdin, no environment
                         forwarded but what is named */
    char **agent;     /* hvd-rsh as the launcher's remote-shell agent */
    char **ifaces;    /* the interfaces for MPI traffic, the daemons and NCCL (empty if none) */
    char **env;       /* NAME=VALUE the launcher itself needs in its environment */
} hvd_launch_parts;

/* Fills out for the job of d over ifaces (cfg->mpi, detected when HVD_MPI_AUTO), and tells d
 * which MPI its jobs use (hvd_driver_set_mpi). Returns 0, or -1 with err (nothing to free
 * then). */
int hvd_launch_parts_make(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                          hvd_launch_parts *out, hvd_err *err);
void hvd_launch_parts_free(hvd_launch_parts *p);

/* Which MPI the driver's jobs use, for its failure sentences (which daemon, what to install
 * where it is missing: hvd_driver_failure). hvd_launch_parts_make sets it, so every launcher
 * does (hvd_launch_job, the elastic launcher, hvd-driver serve); HVD_MPI_AUTO until then (the
 * sentences then name orted). Any thread. */
void hvd_driver_set_mpi(hvd_driver *d, hvd_mpi_impl mpi);
hvd_mpi_impl hvd_driver_mpi(hvd_driver *d);

/* The directory of hvd-rsh/hvd-exec: $HVD_BIN_DIR, else the directory of /proc/self/exe. */
const char *hvd_launch_bin_dir(void);

/* ---- Elastic jobs (docs/elastic.md) --------------------------------------------------------
 * Open MPI cannot grow or shrink a running job, so an elastic job is a series of launches:
 * whenever the usable hosts change, the driver ends the current mpirun and starts a new one
 * over the hosts it has now, between min_np and max_np ranks (a reset). The ranks restart at
 * every reset and resume from the newest state they committed to their task services (which
 * outlive them: hvd-task --elastic). Hosts are those of the registered task services, grouped
 * by host hash, in the order they first appeared (older hosts get the lower ranks); with a
 * discovery script only the hosts it lists. */

/* One host a discovery script listed ("host" or "host:slots" per line). */
typedef struct hvd_elastic_host {
    char name[256];
    int slots;
} hvd_elastic_host;

typedef struct hvd_elastic_config {
    int min_np; /* fewest ranks a launch may have (>= 1) */
    int max_np; /* most ranks a launch may have; 0: every usable slot */
    int np;     /* ranks the first launch waits for (within the start timeout); 0: min_np */
    const char *discovery_script; /* run every HVD_DISCOVERY_INTERVAL_MS with /bin/sh -c; its
                                     lines "host[:slots]" are the usable hosts (a task is on
                                     host H if its host hash is H, or H's first label and
                                     "-<md5>"); NULL: every registered task's host */
    int slots;                    /* slots of a listed host that names none; 0: 1 */
    const char *output_dir;       /* or NULL: launch E's output in output_dir/launch.E
                                     (hvd_launch_config.output_dir of that launch: each mpirun
                                     would overwrite the files of the launch before) */
    int reset_limit;              /* most resets; < 0: no limit */
    int elastic_timeout_s;        /* fewer than min_np usable slots for this long ends the job;
                                     0: HVD_ELASTIC_TIMEOUT_DEFAULT_S */
    int cooldown_min_s, cooldown_max_s; /* a host whose rank failed is blacklisted for
                                           min * 2^k + U(0,1) * min seconds (k: its k-th time),
                                           at most max; 0, 0: for the rest of the job */
    /* Receives each answer of the discovery script (the launching thread): hvd-driver --local
     * starts task services for new hosts there. NULL: none. */
    void (*on_hosts)(void *user, const hvd_elastic_host *hosts, size_t n);
    void *on_hosts_user;
    hvd_log_fn progress; /* one line per launch and reset (who left or came, why, the new
                            size, the commit it resumes from); NULL: cfg->log */
    void *progress_user;
} hvd_elastic_config;

/* What an elastic job did. */
typedef struct hvd_elastic_outcome {
    int resets;      /* launches after the first */
    uint64_t commit; /* the newest commit the last launch resumed from (0: none) */
    int ranks;       /* the last launch's size */
} hvd_elastic_outcome;

/* Runs an elastic job on a started driver (num_tasks: the most task indices that may
 * register): launches mpirun over the usable tasks, and resets (ends it and launches again)
 * when an active task is lost (at once), when a rank fails on its own (its host is
 * blacklisted), or when the ranks end with HVD_ELASTIC_EXIT_RESET (the hosts changed: the
 * driver's ELASTIC_STATE told them, they committed and ended). cfg->np is ignored (each
 * launch's size is chosen), cfg->timeout_s bounds the whole job. Returns 0 once the last
 * launch's mpirun ended, out telling how (the ranks' results are in hvd_driver_results: every
 * rank succeeded, or every rank failed on its own, or it was stopped); -1 with err when the
 * job cannot go on: more than reset_limit resets, fewer than min_np usable slots for longer
 * than the elastic timeout (or np within the start timeout at first), the discovery script
 * failing at its first run, no interface every task can use, or *cfg->stop. */
int hvd_launch_elastic(hvd_driver *d, const hvd_launch_config *cfg, const hvd_elastic_config *ec,
                       hvd_launch_outcome *out, hvd_elastic_outcome *eout, hvd_err *err);

#endif
