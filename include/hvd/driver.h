/* libhvd_driver: the driver service (Horovod's SparkDriverService, its defects fixed).
 *
 * It keeps the registry of task services (index -> host hash, addresses, GPUs, work dir;
 * host hash -> sorted indices; rank -> index), hands out the job's entry point, waits for
 * registration, has the tasks probe each other and computes the interfaces every pair of
 * tasks can use, builds the host list for mpirun, and collects every rank's result.
 * Requests are served on the service's loop thread; the functions below may be called from
 * any one other thread (the launcher's). */
#ifndef HVD_DRIVER_H
#define HVD_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/defaults.h"
#include "hvd/error.h"
#include "hvd/net.h"
#include "hvd/proto.h"

typedef struct hvd_driver hvd_driver;

/* Receives one progress or diagnostic line (no newline). May be called from the loop thread. */
typedef void (*hvd_log_fn)(void *user, const char *line);

typedef struct hvd_driver_config {
    uint32_t num_tasks;       /* N: tasks 0..N-1 must register */
    hvd_secret secret;        /* the job secret */
    const hvd_code_msg *code; /* the entry point handed to ranks (deep-copied) */
    const char *const *nics;  /* NULL-terminated interface names the user fixed (skips
                                 probing), or NULL */
    const char *bind_host;    /* where to listen: a numeric address or an interface name
                                 (hvd_bind_resolve); NULL: all interfaces */
    uint16_t port;            /* 0: ephemeral */
    hvd_log_fn log;           /* progress lines; NULL: none */
    void *log_user;
    int net_timeout_ms; /* a task service whose connection hears nothing for about this long
                           (TCP keepalive and TCP_USER_TIMEOUT) counts as lost, e.g. behind a
                           network partition; <= 0: HVD_NET_TIMEOUT_DEFAULT_S */
} hvd_driver_config;

/* Starts the driver service. Returns NULL with err. */
hvd_driver *hvd_driver_start(const hvd_driver_config *cfg, hvd_err *err);

/* The addresses tasks and agents can reach the driver at (malloc'd array): every interface's,
 * or only bind_host's when one was given. Returns 0, or -1. */
int hvd_driver_addrs(hvd_driver *d, hvd_addr **out, size_t *n, hvd_err *err);

/* The environment a process of the job needs to reach the driver: "HVD_SECRET=<base64>" and
 * "HVD_DRIVER_ADDRS=<addresses>" (mpirun passes them on to hvd-rsh; never put them on a
 * command line). NULL-terminated and malloc'd: wipe and free each string, then the array.
 * NULL with err. */
char **hvd_driver_job_env(hvd_driver *d, hvd_err *err);

/* Waits until all N tasks registered, logging "k/N tasks registered" as they come (at most
 * once a second, and always the final count). timeout_ms < 0 waits without limit. On timeout
 * returns -1 (HVD_E_TIMEOUT) with an error that says how many registered, lists the missing
 * indices ("3-7,9") and says what to check; after hvd_driver_abort returns -1 (HVD_E_STATE)
 * with the abort reason. Returns 0 when all are in. */
int hvd_driver_wait_registration(hvd_driver *d, int timeout_ms, hvd_err *err);

/* Tells every task that registration is complete (REGISTRATION_DONE, sent from a pool of up
 * to 16 threads, carrying the tasks each is to probe), waits for the report of every task that
 * probes, and returns the interface names usable between every ordered pair of hosts, in the
 * order task 0 declared them, as a malloc'd NULL-terminated array (free each string, then the
 * array). The probe plan: the lowest task of each host probes other hosts' lowest tasks;
 * hosts that declared the same addresses probe each other in a ring (which proves they share
 * a network stack) and the first of each such network every other first; hosts with their own
 * addresses therefore probe every ordered pair (docs/launcher.md, "Which interfaces"). With
 * one host nothing is probed and every candidate is returned. Only names with an IPv4 address
 * that every task declared can be returned (an interface MPI uses must exist on every host):
 * a reached address counts for the name it carries if that is one of them. If there is none,
 * the tasks are told without probing and the call fails naming, for each of task 0's names, a
 * task without it. REGISTRATION_DONE.probe is true only for the tasks that must probe: never
 * with user-fixed nics (returned as given) and not with one task (its own interface names are
 * returned). timeout_ms (< 0: no limit) bounds the whole exchange. Must not be called on the
 * loop thread (it blocks) nor before registration is complete (HVD_E_STATE). Returns -1 with
 * an error naming the tasks that could not be told (HVD_E_IO), the tasks that did not report
 * in time (HVD_E_TIMEOUT), or the probed pairs that share no interface (HVD_E_NOT_FOUND; at
 * most 10 named, then "and N more"). */
int hvd_driver_common_interfaces(hvd_driver *d, int timeout_ms, char ***ifaces, hvd_err *err);

/* The -H host list for mpirun: "<host hash>:<slots>,..." with hosts sorted by name and then
 * rotated so that the host of task 0 comes first (so rank 0 lands on task 0). malloc'd;
 * NULL with err before registration is complete. */
char *hvd_driver_host_list(hvd_driver *d, hvd_err *err);

/* One rank's outcome. */
typedef struct hvd_rank_result {
    int rank;
    uint32_t index; /* the task the rank represents */
    char *host_hash;
    bool present;  /* false: the rank never reported (it died, or never started) */
    int status;    /* the entry point's status */
    uint8_t *data; /* result bytes */
    size_t len;
    char *error;    /* error text or NULL */
    uint64_t order; /* 1, 2, ...: the order in which the ranks' results (and the job's other
                       events, hvd_driver_failure) reached the driver (a rank that fails on its
                       own reports before mpirun stops the others); 0: never reported */
    bool stopped;   /* a signal from outside stopped it (mpirun ending the job): not a failure
                       of its own */
    uint64_t gone;  /* a rank that never reported: when its connection to the driver closed,
                       in the order above (it died then); 0: not seen */
} hvd_rank_result;

/* The rank that failed first on its own, or -1 if none did: among the ranks that exited with a
 * status of their own (1-127), the first whose result arrived; else among those whose program
 * was killed by a signal (128+); else, among the ranks that reported nothing while others did
 * (a rank killed outright, say by SIGKILL, reports nothing), the first whose connection to the
 * driver closed (RANK_WATCH), failing that the lowest. Ranks stopped from outside never
 * count, nor do silent ranks when no rank reported at all (the job never got to them). */
int hvd_first_failed_rank(const hvd_rank_result *r, size_t n);

/* hvd_first_failed_rank, leaving out what reached the driver after the launcher began to stop
 * the job (hvd_driver_stopping_job): the rank hvd_driver_failure names. Any thread. */
int hvd_driver_first_failed_rank(hvd_driver *d, const hvd_rank_result *r, size_t n);

/* What failed first in a job, as far as the driver saw (hvd_driver_failure). */
typedef enum hvd_failure_kind {
    HVD_FAILURE_NONE = 0,    /* nothing the driver saw failed on its own */
    HVD_FAILURE_RANK,        /* a rank failed on its own (hvd_first_failed_rank) */
    HVD_FAILURE_SILENT_RANK, /* a rank ended without a result while the others reported */
    HVD_FAILURE_TASK,        /* a task service went away */
    HVD_FAILURE_AGENT,       /* an agent (hvd-rsh) died, could not start orted or lost its
                                task service, or orted was killed */
    HVD_FAILURE_LAUNCH,      /* the launch stalled: hvd_driver_launch_failed */
} hvd_failure_kind;

/* One rank's failure in a sentence: "rank 3 (task 3 on h) exited with status 1: <error>", or,
 * for a rank that never reported, that it ended without a result. */
void hvd_rank_failure_text(const hvd_rank_result *r, char *buf, size_t cap);

/* Names the part of the job that failed first on its own, in one sentence (no "job failed:"
 * prefix) into buf: "rank 3 (task 3 on h) exited with status 1: ...", "task 2 (host h at a)
 * went away while the job ran (...)", "orted of host h (task 2) was killed by signal 9
 * (Killed)", ... It is the earliest, in the order they reached the driver, of a rank's own
 * failure, a lost task service and an agent's report or death; failing those, a rank that
 * reported nothing while others did; never what came after hvd_driver_stopping_job. r and n
 * are hvd_driver_results'. Returns the kind
 * (buf is "" for HVD_FAILURE_NONE). Any thread. */
hvd_failure_kind hvd_driver_failure(hvd_driver *d, const hvd_rank_result *r, size_t n, char *buf,
                                    size_t cap);

/* Whether a task service was lost before the last of the ranks' results in r reached the
 * driver: the executor died while the job ran, even if every rank then reported (a rank lives
 * on in another task's orted, or its result went to the driver directly). A job that ends so
 * has failed; hvd_driver_failure names the task. Any thread. */
bool hvd_driver_lost_during_job(hvd_driver *d, const hvd_rank_result *r, size_t n);

/* How many hosts' agents (hvd-rsh) reached the driver in this job (launch); *hosts is how
 * many hosts have tasks in it. An agent killed before it reached the driver leaves no other trace
 * here: when none came, this says at which step a launch that ended before its ranks stopped. Any
 * thread. */
size_t hvd_driver_agents_seen(hvd_driver *d, size_t *hosts);

/* How many ranks of the job have reported a failure of their own so far (a status other
 * than 0, not stopped from outside). Any thread. */
size_t hvd_driver_ranks_failed(hvd_driver *d);

/* How many ranks of the job have told the driver where they run (SET_LOCAL_RANK: hvd-exec's
 * first call) so far; *np is how many the job has. Any thread. */
size_t hvd_driver_ranks_started(hvd_driver *d, size_t *np);

/* Records that the launch failed on its own, in one sentence (a launcher that never started
 * every rank): hvd_driver_failure names it (HVD_FAILURE_LAUNCH) unless something failed
 * before. Any thread. */
void hvd_driver_launch_failed(hvd_driver *d, const char *text);

/* Records that the launcher is stopping the job by itself (its timeout, a stop request, a
 * stalled start): what fails after this (a rank or an agent killed by the stop, a host whose
 * agent never came) followed from the stop, so hvd_driver_failure leaves it out and the
 * launcher's own reason stands. What failed before still counts. Until hvd_driver_next_job.
 * Any thread. */
void hvd_driver_stopping_job(hvd_driver *d);

/* Every rank's result in rank order, for ranks 0..N-1 (N = num_tasks): a rank that never
 * reported has present = false. index is the task mapped to the rank by SET_LOCAL_RANK (else
 * the one the result named; UINT32_MAX if neither), host_hash that task's (NULL if unknown).
 * Returns 0 with a malloc'd array, or -1. */
int hvd_driver_results(hvd_driver *d, hvd_rank_result **out, size_t *n, hvd_err *err);
void hvd_driver_results_free(hvd_rank_result *r, size_t n);

/* Waits up to timeout_ms until every rank that started (told the driver where it runs) has
 * reported. Returns whether every rank has. Ranks that are stopped as mpirun ends report while
 * it exits, so a launcher gives them a moment (HVD_LATE_RESULTS_MS) before it reads the results
 * of a job that failed. */
bool hvd_driver_wait_results(hvd_driver *d, int timeout_ms);

/* A copy of a registered task's entry (free with hvd_msg_free(&hvd_task_info_desc, out)).
 * Returns 0, or -1 if the index is not registered. */
int hvd_driver_task(hvd_driver *d, uint32_t index, hvd_task_info *out, hvd_err *err);

/* Answers every WAIT_SHUTDOWN long-poll (and later ones at once): tasks end. Returns once the
 * answers are queued on the loop thread (a stop right after still delivers them). */
void hvd_driver_shutdown_tasks(hvd_driver *d);

/* Makes hvd_driver_wait_registration and hvd_driver_common_interfaces (now or later) fail
 * with this reason, e.g. when the cluster job that runs the tasks failed (Horovod's
 * notify_spark_job_failed). Any thread. */
void hvd_driver_abort(hvd_driver *d, const char *reason);

/* How many registered task services are lost: each holds a WAIT_SHUTDOWN long-poll naming its
 * index for the whole job, and a task is lost when the last long-poll held for its index
 * breaks before hvd_driver_shutdown_tasks (the task service died or lost the network). One of
 * several held for an index (a task re-issuing its long-poll, another holder of the key), or
 * one of an index nobody registered, breaking means nothing; a new long-poll makes a lost task
 * count again.
 * A task whose command ended also drops it when it exits, so callers should allow the job a
 * moment to end by itself before treating a loss as a failure. Any thread. */
size_t hvd_driver_lost_tasks(hvd_driver *d);

/* One line about the task service lost first (see hvd_driver_lost_tasks) into buf: which task
 * and host, with the other lost tasks of that host, and how (its connection timed out: contact
 * lost, e.g. a network partition; or it broke: the task service died). Empty if none.
 * Returns 1 if that connection timed out (a task that ends normally never drops it that way,
 * so there is nothing to wait for), else 0. */
int hvd_driver_lost_reason(hvd_driver *d, char *buf, size_t cap);

/* ---- Elastic jobs (docs/elastic.md; hvd_launch_elastic drives these) -------------------- *
 * An elastic driver is started with num_tasks = the most task indices that may register
 * (tasks come and go); each launch runs mpirun over a chosen set of registered tasks, the
 * active set. A static job never calls these: every task is active. */

/* A registered task as an elastic launcher sees it. */
typedef struct hvd_task_brief {
    uint32_t index;
    bool lost;   /* its WAIT_SHUTDOWN long-poll broke and none came since */
    bool active; /* in the active set */
    char host_hash[HVD_HOST_HASH_MAX];
} hvd_task_brief;

/* The registered tasks, by index (malloc'd array of *n; *n may be 0). Returns 0, or -1. */
int hvd_driver_tasks(hvd_driver *d, hvd_task_brief **out, size_t *n, hvd_err *err);

/* Makes the registered tasks idx[0..n) the job's (the next mpirun's): the host list (their
 * hosts, with their count as slots), HOST_INDICES and SET_LOCAL_RANK (ranks 0..n-1), the
 * interface probe and the results then cover them only; the ranks, results and reachability
 * reports of the set before are forgotten. Returns 0, or -1 with err (HVD_E_INVALID: an index
 * not registered, or given twice). */
int hvd_driver_set_active(hvd_driver *d, const uint32_t *idx, size_t n, hvd_err *err);

/* Readies the driver for another job (mpirun run; hvd-driver serve --jobs): the last job's
 * ranks, results and what the driver noted of its agents and failures are forgotten. Task
 * services that run one command after another (registered with elastic:
 * hvd_task_config.elastic) stay, with any lost one; the others that ran their one command (a
 * rank ran in them since they registered) are let go (their
 * WAIT_SHUTDOWN answered, so they end now) and forgotten: the next job waits for new task
 * services at their indices (hvd_driver_wait_registration, then the interface probe). A new
 * task service that registered at such an index already stays. Returns 0, or -1 with err once
 * the tasks were shut down. */
int hvd_driver_next_job(hvd_driver *d, hvd_err *err);

/* How many task indices are registered now. */
uint32_t hvd_driver_registered(hvd_driver *d);

/* The lowest active index (the task of rank 0), or -1 if none is registered. */
int64_t hvd_driver_first_active(hvd_driver *d);

/* Forgets the registration of task `index` if it is lost (its index may register again, as a
 * replacement; registering again also ends the loss). */
void hvd_driver_forget_task(hvd_driver *d, uint32_t index);

/* What ELASTIC_STATE answers the ranks: the launch they are in, and whether the hosts changed
 * since it started (they should then commit and end for a reset). Any thread. */
void hvd_driver_set_elastic(hvd_driver *d, uint64_t epoch, bool hosts_updated);

/* Stops the commands of tasks idx[0..n) between two launches (STOP_COMMAND: abort the command
 * and answer once it has ended; from a pool of threads), each bounded by timeout_ms, and asks
 * each for the newest state committed to it (LATEST_COMMIT): *newest gets the newest id (0:
 * none) and *holders how many of them hold it. Returns how many tasks could not be stopped
 * (not registered, unreachable: lost). Not on the loop thread. */
size_t hvd_driver_stop_commands(hvd_driver *d, const uint32_t *idx, size_t n, int timeout_ms,
                                uint64_t *newest, size_t *holders);

/* Shuts tasks down, stops the service and frees everything. NULL is ignored. */
void hvd_driver_stop(hvd_driver *d);

#endif
