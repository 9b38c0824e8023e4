/* The task service's state: struct hvd_task and what every file of task_service/ needs to
 * read and wait on it (private to task_service/).
 *
 * Layers, from the top; a file includes only headers of files below it, so the
 * dependencies form a DAG (task_service/README.md):
 *
 *   task.c      hvd_task_start, hvd_task_stop, results, port    -> handlers, run, held, notes,
 *                                                                  state
 *   handlers.c  the RPC handlers               (handlers.h)     -> held, pump, probe, state
 *   task_run.c  hvd_task_run, the driver watcher (run.h)        -> held, state
 *   held.c      held calls, aborts             (held.h)         -> notes, pump, state
 *   pump.c      output fan-out, the command's end (pump.h)      -> notes, state
 *   notes.c     TASK_EVENTs to the driver (notes.h)             -> state
 *   state.c     this header: log, waits, the driver connection  -> output, local_out
 *   probe.c (probe.h), output.c (output.h), local_out.c (local_out.h): leaves that know
 *   nothing of hvd_task.
 *
 * Who touches what:
 *   - "immutable" fields are set by hvd_task_start before the server starts and only read
 *     afterwards, from any thread;
 *   - "shared" fields are guarded by mu; waiters block on cv (CLOCK_MONOTONIC);
 *   - "loop" fields belong to the server's loop thread (handlers.c, held.c, pump.c), and to
 *     the thread in hvd_task_stop once the loop has stopped. */
#ifndef HVD_TASK_STATE_H
#define HVD_TASK_STATE_H

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

#define TASK_SETTLE_MS        1000 /* driver shutdown: time a command gets to end by itself */
#define TASK_END_SLACK_MS     5000 /* abort: how long after the grace period the end may take */
#define TASK_DRIVER_PROBE_MS  3000 /* budget of one attempt to reach the driver */
#define TASK_BACKOFF_FIRST_MS 100  /* first pause between attempts to reach the driver */
#define TASK_BACKOFF_MAX_MS   2000 /* ... doubled after each attempt up to this */

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
    hvd_call *call;          /* NULL once answered or cancelled; the struct is then swept */
    bool active;             /* receives output; false: an ATTACH held until a command starts */
    bool armed;              /* hvd_call_on_writable is pending */
    int64_t behind_ms;       /* since when it holds the output back (0: it is not) */
    bool runner;             /* the RUN_COMMAND (attach) that started the command: its agent */
    char peer[HVD_HOST_MAX]; /* where its call came from */
    struct task_sub *next;
} task_sub;

/* A held WAIT_EXIT call, or (elastic) a held STOP_COMMAND call. */
typedef struct task_waiter {
    struct hvd_task *t;
    hvd_call *call; /* NULL once answered or cancelled */
    bool status;    /* STOP_COMMAND: answered with STATUS instead of EXIT */
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
    uint16_t free_port; /* a port free on this host at start: MASTER_PORT if it runs rank 0 */
    char *shm_dir;      /* private dir for Open MPI's shared-memory files, or NULL */
    char *warm_dir;     /* the warm interpreter's directory (its socket), or NULL */
    char warm_socket[600];
    int warm_fd;    /* its listening socket until the interpreter has it, else -1 */
    hvd_proc *warm; /* the warm interpreter (warm.c), or NULL */
    char **gpus;    /* NULL-terminated */
    size_t ngpus;
    hvd_addr *driver_addrs;
    size_t n_driver_addrs;
    char *driver_text; /* hvd_addrs_format of driver_addrs */
    hvd_addr *addrs;   /* this service's addresses */
    size_t naddrs;
    char **cmd_env; /* the command's base environment (hvd_env_build) */
    hvd_server *srv;
    int abort_efd;            /* eventfd, readable once an abort was requested (never reset) */
    struct watcher *watch;    /* the driver watcher hvd_task_run started, until hvd_task_stop */
    pthread_mutex_t notes_mu; /* guards notes and notes_closed (notes.c) */
    struct task_notes *notes; /* made at the first note */
    bool notes_closed;        /* hvd_task_stop ended them */

    /* ---- shared (mu) ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool registration_done; /* REGISTRATION_DONE arrived */
    bool started;           /* a command was started */
    bool ended;             /* ... has ended and all its output was delivered */
    int exit_code;          /* valid when ended */
    int exit_signal;        /* valid when ended: the signal that killed the command unasked
                               (hvd_exit_msg.signal), 0 if it exited or we aborted it */
    int64_t ended_ms;       /* monotonic time of the end */
    task_abort abort_why;   /* first reason to abort, ABORT_NONE if none */
    bool job_over;          /* the driver shut the job down (answered WAIT_SHUTDOWN) */
    bool ended_normally;    /* hvd_task_run returned the command's own end: the watcher says
                               TASK_EV_DONE before it lets go of the driver */
    char ending_why[256];   /* the task is ending early (task_watch_ending): the watcher says
                               TASK_EV_ENDING with this; "" if not */
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
    uint64_t stall_timer;  /* drop_stalled is due (0: not armed) */
    bool tidy_posted;      /* a loop_tidy closure is queued */
    bool loop_stopping;
    task_pipe pipes[2];
    uint8_t *fbuf; /* TASK_CHUNK_MAX: formatted output */
    task_sub *subs;
    task_waiter *waiters;
    hvd_local_out *local; /* started on first use */
    bool local_failed;    /* ... and that failed: write synchronously */

    hvd_commit_msg commit; /* elastic: the newest state a rank committed here (id 0: none) */
};

/* Passes one line to cfg.log if level is within cfg.log_level. Any thread. */
void task_log(hvd_task *t, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Waits on t->cv until deadline_ms (monotonic; < 0: forever). Returns false on timeout. Call
 * with mu held. */
bool task_wait_until(hvd_task *t, int64_t deadline_ms);
/* Sleeps ms milliseconds (the whole of it: signals do not cut it short). */
void task_sleep_ms(int ms);
/* Fills info with this task's entry (pointers into t: do not free). */
void task_info(const hvd_task *t, hvd_task_info *info);
/* The budget of one attempt to reach the driver before deadline_ms (hvd_now_ms time):
 * TASK_DRIVER_PROBE_MS, or what is left of it, but at least 100 ms. */
int task_attempt_ms(int64_t deadline_ms);
/* Connects to the driver (one probe round within timeout_ms). NULL with err. */
hvd_client *task_driver_connect(hvd_task *t, int timeout_ms, hvd_err *err);
/* Makes t->shm_dir for the command (loop, before the command starts). */
void task_make_shm_dir(hvd_task *t);
/* A private temporary directory ("<prefix>-XXXXXX" in /dev/shm, else $TMPDIR, else /tmp),
 * malloc'd, or NULL. */
char *task_temp_dir(const char *prefix);

#endif
