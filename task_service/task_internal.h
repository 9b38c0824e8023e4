/* The task service's shared state (private to task_service/).
 *
 * Who touches what:
 *   - "immutable" fields are set by hvd_task_start before the server starts and only read
 *     afterwards, from any thread;
 *   - "shared" fields are guarded by mu; waiters block on cv (CLOCK_MONOTONIC);
 *   - "loop" fields belong to the server's loop thread (handlers.c, pump.c), and to the
 *     thread in hvd_task_stop once the loop has stopped.
 *
 * Files: task.c (start, registration, stop, logging), task_run.c (hvd_task_run, the driver
 * watcher, abort), handlers.c (the RPC handlers), pump.c (output fan-out with back-pressure,
 * the end of the command), probe.c (task-to-task reachability), local_out.c (the service's
 * own stdout/stderr as a bounded sink). */
#ifndef HVD_TASK_INTERNAL_H
#define HVD_TASK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/loop.h"
#include "common/proc.h"
#include "hvd/rpc.h"
#include "hvd/task.h"
#include "local_out.h"
#include "output.h"

#define TASK_READ_MAX    (64 * 1024)  /* bytes read from an output pipe at once */
#define TASK_CHUNK_MAX   (64 * 1024)  /* largest formatted chunk handed to a sink */
#define TASK_CHUNK_SLACK 256          /* framing overhead allowed for in room checks */
#define TASK_LOCAL_MAX   (256 * 1024) /* bound of the queue to our own stdout/stderr */
#define TASK_PROBE_MS    2000         /* budget to reach one peer address */
#define TASK_SETTLE_MS   1000         /* driver shutdown: time a command gets to end by itself */

/* Why hvd_task_run was asked to end early (shared: abort_why). */
typedef enum task_abort {
    ABORT_NONE = 0,
    ABORT_USER,            /* hvd_task_abort */
    ABORT_REQUEST,         /* an ABORT request came before any command */
    ABORT_DRIVER_SHUTDOWN, /* the driver answered WAIT_SHUTDOWN */
    ABORT_DRIVER_GONE,     /* the WAIT_SHUTDOWN connection broke */
} task_abort;

/* A subscriber: a held RUN_COMMAND (attach) or ATTACH call that receives output. */
typedef struct task_sub {
    struct hvd_task *t;
    hvd_call *call; /* NULL once answered or cancelled; the struct is then swept */
    bool active;    /* receives output; false: an ATTACH held until a command starts */
    bool armed;     /* hvd_call_on_writable is pending */
    struct task_sub *next;
} task_sub;

/* A held WAIT_EXIT call. */
typedef struct task_waiter {
    struct hvd_task *t;
    hvd_call *call; /* NULL once answered or cancelled */
    struct task_waiter *next;
} task_waiter;

/* One output pipe of the command. */
typedef struct task_pipe {
    struct hvd_task *t;
    int fd;           /* non-blocking read end; -1 once at end-of-file */
    uint32_t channel; /* HVD_CHANNEL_STDOUT or HVD_CHANNEL_STDERR */
    int local_fd;     /* our own stream used when nobody is attached: 1 or 2 */
    hvd_watch *watch; /* its watch on the loop, or NULL */
    hvd_output fmt;   /* line prefixes and timestamps */
    uint8_t *buf;     /* TASK_READ_MAX bytes: read, not yet delivered from off to len */
    size_t off, len;
} task_pipe;

struct hvd_task {
    /* ---- immutable after start ---- */
    hvd_task_config cfg; /* copy: its pointers are NULLed, the copies are below */
    char name[HVD_SERVICE_NAME_MAX];
    char host_hash[HVD_HOST_HASH_MAX];
    char *work_dir;
    char *shm_dir; /* private dir for Open MPI's shared-memory files, or NULL */
    char **gpus;   /* NULL-terminated */
    size_t ngpus;
    hvd_addr *driver_addrs;
    size_t n_driver_addrs;
    char *driver_text; /* hvd_addrs_format of driver_addrs */
    hvd_addr *addrs;   /* this service's addresses */
    size_t naddrs;
    char **cmd_env; /* the command's base environment (hvd_env_build) */
    hvd_server *srv;
    int abort_efd;         /* eventfd, readable once an abort was requested (never reset) */
    struct watcher *watch; /* the driver watcher hvd_task_run started, until hvd_task_stop */

    /* ---- shared (mu) ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool registration_done; /* REGISTRATION_DONE arrived */
    bool started;           /* a command was started */
    bool ended;             /* ... has ended and all its output was delivered */
    int exit_code;          /* valid when ended */
    int64_t ended_ms;       /* monotonic time of the end */
    task_abort abort_why;   /* first reason to abort, ABORT_NONE if none */
    bool job_over;          /* the driver shut the job down (answered WAIT_SHUTDOWN) */
    bool abort_sent;        /* the running command was told to abort (by us or a request) */
    char abort_detail[HVD_ERR_MAX];
    bool stopping;      /* hvd_task_stop began: refuse new commands */
    bool loop_quiesced; /* the loop failed every held call (stop) */
    hvd_result_msg result;
    bool has_result;
    hvd_peers_msg peers; /* what REGISTRATION_DONE told us (probe thread input) */
    bool probe_running;  /* probe_thread exists and is not joined */
    pthread_t probe_thread;
    atomic_bool probe_cancel;   /* stop probing (hvd_task_stop) */
    atomic_bool probe_finished; /* probe_thread has done its work */

    /* ---- loop ---- */
    hvd_proc *cmd;
    hvd_watch *exit_watch; /* the command's exit fd on the loop, or NULL */
    bool refused;          /* an abort came before any command: refuse RUN_COMMAND */
    bool exit_seen;        /* the command's exit fd fired */
    bool paused;           /* pipes unwatched until every sink has room */
    bool tidy_posted;      /* a loop_tidy closure is queued */
    bool loop_stopping;
    task_pipe pipes[2];
    uint8_t *fbuf; /* TASK_CHUNK_MAX: formatted output */
    task_sub *subs;
    task_waiter *waiters;
    hvd_local_out *local; /* started on first use */
    bool local_failed;    /* ... and that failed: write synchronously */
};

/* ---- task.c ---------------------------------------------------------------------------------- */
int64_t task_now_ms(void);
void task_log(hvd_task *t, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Connects to the driver (one probe round within timeout_ms). NULL with err. */
hvd_client *task_driver_connect(hvd_task *t, int timeout_ms, hvd_err *err);
/* Fills info with this task's entry (pointers into t: do not free). */
void task_info(const hvd_task *t, hvd_task_info *info);
/* Waits on t->cv until deadline_ms (monotonic; < 0: forever). Returns false on timeout. Call
 * with mu held. */
bool task_wait_until(hvd_task *t, int64_t deadline_ms);

/* ---- task_run.c ------------------------------------------------------------------------------ */
/* Records the first reason to abort, wakes hvd_task_run and aborts the command on the loop.
 * Any thread. */
void task_request_abort(hvd_task *t, task_abort why, const char *detail);
/* Stops the driver watcher hvd_task_run left running (hvd_task_stop). */
void task_watch_stop(hvd_task *t);

/* ---- handlers.c ------------------------------------------------------------------------------ */
/* Registers every task-service request handler on t->srv. Returns 0 or -1. */
int task_handlers_register(hvd_task *t);
/* Loop: aborts the command if one runs; without one, refuses later commands and fails held
 * ATTACH and WAIT_EXIT calls. */
void task_loop_abort(void *arg);
/* Loop: fails every held call (the service stops) and signals loop_quiesced. */
void task_loop_quiesce(void *arg);

/* ---- pump.c ---------------------------------------------------------------------------------- */
/* Loop: watches a just-started command's pipes and exit fd. Returns 0 or -1 with err. */
int pump_start(hvd_task *t, bool prefix, bool timestamps, hvd_err *err);
/* Loop: stops watching the command's descriptors (before freeing it). */
void pump_stop(hvd_task *t);
/* Loop: a subscriber joined or left: re-evaluate back-pressure. */
void pump_resume(hvd_task *t);
/* Loop: a held call was answered or cancelled (its pointer cleared): frees such entries and
 * re-evaluates back-pressure soon, from a posted closure, so that nothing is freed under a
 * caller that walks the lists (a failed send cancels calls from inside hvd_call_stream and
 * hvd_call_reply). */
void pump_call_gone(hvd_task *t);
/* Frees the subscribers and waiters whose call is NULL. Only with nothing walking them. */
void pump_sweep(hvd_task *t);
/* Loop: answers a subscriber or waiter with the exit code (the call pointer is cleared). */
void pump_reply_exit(hvd_call **call, int exit_code);

/* ---- probe.c --------------------------------------------------------------------------------- */
/* Probes every task of `tasks` (hvd_task_info) other than `self` at each of its addresses
 * in parallel: an address counts as reached if the peer answers a PING and saw us coming
 * from one of our addresses on the interface of the same name (Horovod's match_intf).
 * Fills out (free with hvd_msg_free(&hvd_reachable_desc, out)). Stops early when *cancel
 * becomes true. Returns 0, or -1 with err (out of memory, no local address). */
int probe_peers(const hvd_secret *secret, uint32_t self, const hvd_list *tasks, int timeout_ms,
                atomic_bool *cancel, hvd_reachable_msg *out, hvd_err *err);

/* Makes t->shm_dir for the command (task.c). */
void task_make_shm_dir(hvd_task *t);

#endif
