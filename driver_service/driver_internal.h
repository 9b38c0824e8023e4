/* Internals of libhvd_driver, shared by its files (not installed).
 *
 * Who touches what:
 *  - the registry (drv_registry) is changed only by request handlers on the server's loop
 *    thread, always with `mu` held; the launcher thread reads it with `mu` held. Handlers
 *    also hold `mu` while they read, so every access is under `mu` and there is one rule.
 *  - `mu` is never held across a blocking call (connects, RPCs, waits other than cv).
 *  - the held WAIT_SHUTDOWN calls (`held`) belong to the loop thread (and to the thread that
 *    stops the server, once the loop has ended).
 *  - `code`, `nics`, `num_tasks` are fixed at start and read without a lock. */
#ifndef HVD_DRIVER_INTERNAL_H
#define HVD_DRIVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/strv.h"
#include "hvd/driver.h"
#include "hvd/launch.h"
#include "hvd/rpc.h"

/* ---- Registry (registry.c): the tables; callers hold hvd_driver.mu ---------------------- */

/* One task slot, indexed by task index. */
typedef struct drv_task {
    bool registered;
    hvd_task_info info;      /* owned: the last registration */
    char peer[HVD_HOST_MAX]; /* the address the last registration came from */
    int64_t rank;            /* the rank mapped to this task by SET_LOCAL_RANK; -1: none */
    bool reported;           /* this task's reachability report is in `reach` */
    uint32_t watches;        /* WAIT_SHUTDOWN long-polls of this index held now */
    bool lost;               /* its last one broke before shutdown and none came since */
    bool done;               /* it said TASK_EV_DONE: its watch closing is a normal end */
    bool used;               /* a rank ran in it since it registered (SET_LOCAL_RANK), or it
                                said its command started (TASK_EV_COMMAND_STARTED): a
                                one-shot task (not info.elastic) is spent after the job. Not
                                the agent's late report of its daemon: it may come after a
                                new task service registered at the index */
    char lost_why[256];      /* what it said when it ended early (TASK_EV_ENDING), or "" */
    int lost_err;            /* the errno that broke it (ETIMEDOUT: partition) */
    uint64_t lost_seq;       /* when it was lost, in drv_registry.seq */
    uint32_t *probe_to;      /* the tasks this one probes in the current round, ascending */
    uint32_t nprobe;         /* how many (0: it does not probe) */
    uint64_t *reach;         /* [nprobe] when reported: reach[k] = the candidate interfaces
                                (bits over drv_registry.cand) it reached probe_to[k] on */
    bool active;             /* one of the job's tasks (the next mpirun's): all of them in a
                                static job, the set hvd_driver_set_active chose in an elastic
                                one */
} drv_task;

/* One host hash and the tasks registered under it. */
typedef struct drv_host {
    char *host_hash; /* owned */
    uint32_t *idx;   /* sorted ascending, no duplicates */
    size_t n, cap;
    bool agent_seen; /* an agent (hvd-rsh) for it reached the driver (AGENT_WATCH) */
} drv_host;

typedef struct drv_registry {
    uint32_t n;           /* num_tasks */
    drv_task *tasks;      /* [n] */
    uint32_t nregistered; /* tasks with registered = true */
    uint32_t nreported;   /* tasks with reported = true */
    uint32_t nprobers;    /* tasks with nprobe > 0 in the current round */
    drv_host *hosts;      /* sorted by host_hash (strcmp) */
    size_t nhosts, caphosts;
    int64_t *rank_index; /* [n] rank -> task index; -1: unmapped */
    /* The interface names every task declared, in task 0's order: only these can connect
     * every pair, so reports are kept as bitsets over them (a report as sent is O(n) addresses;
     * 1024 of them decoded would take hundreds of MiB). Set for each probing round. */
    char (*cand)[HVD_IFNAME_MAX];
    size_t ncand;            /* <= DRV_MAX_CAND */
    hvd_result_msg *results; /* [n] by rank; .present says whether one was reported */
    uint64_t *result_order;  /* [n] by rank: 1, 2, ... in the order results arrived; 0: none */
    uint64_t *gone_order;    /* [n] by rank: when its RANK_WATCH closed before it reported (in
                                seq's order); 0: not seen go */
    uint64_t job;            /* the active set's number: a watch of an earlier one is stale */
    uint32_t nresults;       /* ranks with a result */
    uint64_t seq;  /* the last order given: results, lost tasks and agent events share it, so
                      that the first part of a job to fail can be told (failure.c) */
    uint32_t *act; /* [nact] the active task indices, ascending (0..n-1 at first): the
                      host list, SET_LOCAL_RANK, HOST_INDICES, the interface probe and
                      the results (ranks 0..nact-1) cover them only */
    uint32_t nact;
} drv_registry;

/* What drv_reg_put did, for log lines. */
typedef struct drv_put_outcome {
    bool replaced;                    /* the index was registered before */
    bool moved;                       /* ... under another host hash */
    char old_host[HVD_HOST_HASH_MAX]; /* that host hash */
} drv_put_outcome;

int drv_reg_init(drv_registry *r, uint32_t n);
void drv_reg_free(drv_registry *r);

/* The host entry for a host hash, or NULL. */
drv_host *drv_reg_host(drv_registry *r, const char *host_hash);

/* Stores a registration (already validated: index < n, valid host hash, addresses). On
 * success takes ownership of *info's contents (and zeroes *info); a re-registration replaces
 * the entry, moves the index between host lists if its host hash changed, and drops the
 * task's reachability report (its addresses may have changed). Returns 0, or -1 on out of
 * memory (then nothing changed and *info still owns its contents). */
int drv_reg_put(drv_registry *r, hvd_task_info *info, const char *peer, drv_put_outcome *out);

/* Maps rank -> indices_of[host_hash][local_rank]; any rank mapped to that index before is
 * unmapped. Returns 0 with *index, or -1 with err (HVD_E_NOT_FOUND, HVD_E_INVALID). */
int drv_reg_set_rank(drv_registry *r, const char *host_hash, uint32_t local_rank, uint32_t rank,
                     uint32_t *index, hvd_err *err);

/* Forgets the ranks, results and reachability reports of the last job (the active set
 * stays). */
void drv_reg_new_job(drv_registry *r);
/* Makes idx[0..n) (registered, distinct, < r->n) the active tasks and forgets the ranks,
 * results and reachability reports of the last set. Returns 0, or -1 with err. */
int drv_reg_set_active(drv_registry *r, const uint32_t *idx, size_t n, hvd_err *err);

/* Forgets task `index`'s registration (its index may register again). */
void drv_reg_forget(drv_registry *r, uint32_t index);

/* The active indices of host h, ascending, into out (room for h->n); returns how many. */
size_t drv_host_active(const drv_registry *r, const drv_host *h, uint32_t *out);
/* Whether host h has a task in the job (an active one). */
bool drv_host_in_job(const drv_registry *r, const drv_host *h);

#define DRV_MAX_CAND 64

/* Sets the candidate interfaces for a probing round: the names (non-empty) that every
 * active task declared, in the first active task's order, at most DRV_MAX_CAND (*truncated
 * tells if more were left out). Forgets every reachability report. Returns 0, or -1 on out
 * of memory. Every active task must be registered. */
int drv_reg_set_cand(drv_registry *r, bool *truncated);

/* True if a is an IPv4 address on one of the round's candidate interfaces: the only kind a
 * report can count. */
bool drv_reg_is_cand(const drv_registry *r, const hvd_addr *a);

/* What drv_reg_plan decided, for log lines. */
typedef struct drv_plan_stats {
    uint32_t hosts;    /* host hashes */
    uint32_t networks; /* groups of hosts that declared the same candidate addresses */
    uint64_t pairs;    /* ordered pairs of tasks to probe */
} drv_plan_stats;

/* Plans a probing round (after drv_reg_set_cand): only the lowest task of each host hash
 * probes (the one that runs the host's orted, whose network every rank there uses), and only
 * other hosts. Hosts whose lowest tasks declared the same candidate addresses (ifname and
 * IPv4 address, ports aside) form a network: a ring of probes inside it proves its members
 * share one network stack (reaching a peer at an address that is also one's own stays on the
 * machine), so one member's reach stands for all; the first host of each network probes the
 * first host of every other. Hosts with their own addresses (a real cluster) are each their
 * own network: every ordered pair of hosts is probed. Sets probe_to/nprobe and nprobers.
 * Returns 0, or -1 on out of memory (the plan is then empty). */
int drv_reg_plan(drv_registry *r, drv_plan_stats *st);

/* Stores task m->from's reachability report as bitsets over the candidates for the tasks it
 * was asked to probe, replacing any earlier one; entries for other tasks are ignored, and a
 * report from a task that was asked to probe nothing is ignored as a whole (a late report of
 * an earlier round). The caller checked that m->from is registered and every `to` is < n.
 * Returns 0, or -1 on out of memory. */
int drv_reg_put_reach(drv_registry *r, const hvd_reachable_msg *m);

/* Stores rank m->rank's result (0 <= rank < n, checked by the caller), replacing any earlier
 * one; takes ownership of *m's contents. */
void drv_reg_put_result(drv_registry *r, hvd_result_msg *m);

/* ---- The driver ---------------------------------------------------------------------------- */

/* Something that went wrong in a part of the job other than a rank or a task service, as an
 * agent (hvd-rsh) told it or its death showed (failure.c). */
typedef struct drv_event {
    uint64_t seq;   /* drv_registry.seq */
    uint32_t agent; /* the process id of the agent it is about; 0: none */
    bool launch;    /* the launch itself stalled (hvd_driver_launch_failed), not an agent */
    bool weak;      /* maybe only an echo of something else: an agent's death (mpirun kills
                       its agents when it gives up), orted's exit status (it exits 1 when
                       mpirun is stopped while it starts): named only when nothing else
                       explains the failure */
    char text[HVD_ERR_MAX];
} drv_event;

#define DRV_EVENTS_MAX 32 /* the first ones are kept: the cause comes before its echoes */

/* An agent (hvd-rsh) whose AGENT_WATCH is held (loop thread only). */
typedef struct drv_agent {
    hvd_driver *d;
    hvd_call *call;
    char host_hash[HVD_HOST_HASH_MAX];
    uint32_t pid;
    bool reported; /* its AGENT_REPORT came */
    struct drv_agent *prev, *next;
} drv_agent;

/* A rank whose RANK_WATCH is held (loop thread only). */
typedef struct drv_rank_watch {
    hvd_driver *d;
    uint32_t rank;
    uint64_t job; /* drv_registry.job when it came */
} drv_rank_watch;

/* A held WAIT_SHUTDOWN call (loop thread only). */
typedef struct drv_held {
    hvd_driver *d;
    hvd_call *call;
    uint32_t index; /* the task the long-poll is for */
    struct drv_held *prev, *next;
} drv_held;

struct hvd_driver {
    uint32_t num_tasks;
    hvd_secret secret;
    hvd_code_msg code; /* deep copy; kind == 0: none configured */
    bool has_code;
    char **nics; /* NULL-terminated deep copy, or NULL */
    hvd_log_fn log;
    void *log_user;
    hvd_server *srv;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* registrations, reports, shutdown progress, abort */
    drv_registry reg;
    bool tasks_shutdown;   /* hvd_driver_shutdown_tasks was called: answer WAIT_SHUTDOWN */
    bool shutdown_flushed; /* the loop answered every held WAIT_SHUTDOWN after that */
    bool aborted;          /* hvd_driver_abort was called: waits fail with abort_reason */
    char abort_reason[HVD_ERR_MAX];

    drv_held *held;      /* loop thread */
    atomic_size_t nheld; /* how many are held (any thread may read it) */
    atomic_size_t nlost; /* registered tasks whose watch broke, not renewed (any thread) */
    int net_timeout_ms;  /* fixed at start */

    drv_agent *agents;                /* loop thread */
    drv_event events[DRV_EVENTS_MAX]; /* under mu */
    size_t nevents;
    uint64_t stopping_seq; /* reg.seq when the launcher began to stop the job; 0: it has not */
    hvd_mpi_impl mpi;      /* the jobs' MPI (hvd_driver_set_mpi), under mu */

    hvd_elastic_msg elastic; /* what ELASTIC_STATE answers (under mu) */
};

/* Registers the AGENT_WATCH, AGENT_REPORT and TASK_EVENT handlers (failure.c). Returns 0, or
 * -1. */
int drv_install_agent_handlers(hvd_driver *d);

/* The task service lost first, in a sentence naming it and its host's other lost tasks, with
 * *seq when it was lost (d->mu held). Returns 1 if its connection timed out (a partition), 0
 * if it broke, -1 if no task is lost (buf untouched). */
int drv_lost_text(hvd_driver *d, char *buf, size_t cap, uint64_t *seq);
/* hvd_first_failed_rank among what reached the driver before limit (in drv_registry.seq's
 * order; UINT64_MAX: everything). */
int drv_first_failed_before(const hvd_rank_result *r, size_t n, uint64_t limit);

/* How many WAIT_SHUTDOWN calls are held now (any thread; for tests and diagnostics). */
size_t drv_held_count(hvd_driver *d);

/* Registers the request handlers (handlers.c). Returns 0, or -1. */
int drv_install_handlers(hvd_driver *d);

/* Marks a registered task lost (d->mu held), unless the driver is shutting tasks down or it
 * is lost already: err is the errno that broke its watch (0: none), why what it said when it
 * ended early (NULL: nothing). */
void drv_mark_lost(hvd_driver *d, drv_task *t, int err, const char *why);

/* Answers the held WAIT_SHUTDOWN calls of the tasks marked in which[num_tasks] (loop
 * thread). */
void drv_answer_held_of(hvd_driver *d, const bool *which);
/* Lets the spent one-shot task services (registered without elastic, used since) go
 * between jobs: answers
 * their WAIT_SHUTDOWN, so that they end at once, and forgets them, so that the next job waits
 * for new ones at their indices. Any thread but the loop's. Returns how many. */
uint32_t drv_release_one_shot(hvd_driver *d);
/* Answers every held WAIT_SHUTDOWN call (loop thread). */
void drv_answer_held(hvd_driver *d);

/* Sends one line (printf-style) to the configured log, if any. Any thread. */
void drv_log(hvd_driver *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checks that object is an ELF shared object exporting a function named symbol, as hvd-exec's
 * dlsym will want it (entry_check.c). Returns 0, or -1 with err saying what is wrong. */
int drv_check_entry(const hvd_bytes *object, const char *symbol, hvd_err *err);

/* Deep-copies a message described by desc (through its own encoding). Returns 0, or -1. */
int drv_msg_clone(const hvd_msg_desc *desc, const void *src, void *dst);

/* Writes sorted indices as compressed ranges ("3-7,9,12") into buf of size len. When they do
 * not fit, writes as many as fit followed by ",..." so the text always ends cleanly. */
void drv_format_ranges(const uint32_t *v, size_t n, char *buf, size_t len);

/* Waits on d->cv (d->mu held) until deadline_ms (hvd_now_ms time; < 0: no limit). Returns
 * false when the deadline passed. */
bool drv_cond_wait(hvd_driver *d, int64_t deadline_ms);

#endif
