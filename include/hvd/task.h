/* libhvd_task: the task service of one executor (Horovod's SparkTaskService and
 * safe_shell_exec, their defects fixed), and its life cycle.
 *
 * A task service registers with the driver (index, host hash, addresses, GPUs, work dir),
 * then serves: it runs exactly one command in its lifetime (`/bin/sh -c`, in its own process
 * group with a lifeline), streams its output to any number of subscribers, answers the exit
 * code the moment the command ends, and keeps a rank's result. The lowest index on a host
 * hash runs the command (orted); the others on that host run nothing and end with it.
 * Embeddable (JNI): no signals are installed, nothing calls exit(). */
#ifndef HVD_TASK_H
#define HVD_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/error.h"
#include "hvd/net.h"
#include "hvd/proto.h"

typedef struct hvd_task hvd_task;

/* Log levels for hvd_task_log_fn. */
enum { HVD_LOG_ERROR = 0, HVD_LOG_WARN = 1, HVD_LOG_INFO = 2, HVD_LOG_DEBUG = 3 };
/* Receives one line per event (no newline). Called from any of the service's threads, its
 * event loop included: it must be thread-safe and must not block for long. Never carries the
 * job secret; at debug level the command's environment changes are logged with the values
 * of variables whose name contains "SECRET" hidden. */
typedef void (*hvd_task_log_fn)(void *user, int level, const char *line);

/* A task service's settings (hvd_task_start). The HVD_*_DEFAULT_* values are those of
 * hvd/defaults.h. */
typedef struct hvd_task_config {
    uint32_t index;               /* this task's index, 0..N-1 */
    hvd_secret secret;            /* the job secret */
    const hvd_addr *driver_addrs; /* every address of the driver service */
    size_t n_driver_addrs;
    const char *host_hash;   /* NULL: hvd_host_hash() (which honours HVD_HOST_HASH) */
    const char *const *gpus; /* NULL-terminated GPU ids; NULL: from CUDA_VISIBLE_DEVICES,
                                else none */
    const char *work_dir;    /* NULL: the current directory */
    char *const *base_env;   /* the command's base environment; NULL: environ */
    const char *const *nics; /* interfaces to advertise; NULL: all */
    int start_timeout_ms;    /* budget of each start-up step: registering with the driver, the
                                registration-complete notice, and (first task of a host) the
                                command's arrival; <= 0: HVD_TASK_START_TIMEOUT_DEFAULT_S s */
    int grace_ms;            /* abort: SIGTERM -> SIGKILL; <= 0: HVD_GRACE_DEFAULT_MS */
    int min_lifetime_ms;     /* exit code still answered this long after the end (by
                                hvd_task_stop), or until the driver shuts the job down;
                                0: HVD_MIN_LIFETIME_DEFAULT_MS; < 0: none */
    hvd_task_log_fn log;     /* NULL: none */
    void *log_user;
    int log_level;            /* lines above this level are not passed to log */
    int net_timeout_ms;       /* the driver counts as gone (and the command is ended) when the
                                 watcher's connection to it hears nothing for about this long (TCP
                                 keepalive, TCP_USER_TIMEOUT: a network partition);
                                 <= 0: HVD_NET_TIMEOUT_DEFAULT_S s */
    const char *bind_host;    /* where to listen: a numeric address or an interface name
                                 (hvd_bind_resolve), then the only address advertised; NULL:
                                 every interface */
    bool elastic;             /* an elastic job (docs/elastic.md): the service runs one command at
                                 a time, any number of them, whichever task of its host it is, and
                                 hvd_task_run waits for the driver's shutdown instead of the first
                                 command's end; it keeps the newest state a rank committed to it */
    const char *warm_python;  /* or NULL: a Python interpreter the service keeps running with
                                 warm_imports imported, from its start to its end; a rank
                                 that runs this interpreter is forked from it instead of
                                 starting (and importing) anew (docs/elastic.md, "Warm Python
                                 ranks"). Needs the hvd_bridge package on that interpreter's
                                 path; without it ranks start as usual. */
    const char *warm_imports; /* comma-separated modules for warm_python; NULL:
                                 HVD_WARM_IMPORTS_DEFAULT (torch, torch._dynamo) */
} hvd_task_config;

/* Starts the task service and registers it with the driver (retrying with backoff while the
 * driver cannot be reached, until the start timeout passes; an error answer from the driver,
 * or a handshake that fails on the secret, ends it at once). The strings and arrays of cfg
 * are copied. Returns NULL with err, which names the driver addresses tried. */
hvd_task *hvd_task_start(const hvd_task_config *cfg, hvd_err *err);

/* Runs the rest of the task's life on the calling thread (call it once): waits for the
 * driver's registration-complete notice (the probing of the other tasks runs on its own
 * thread); then, as the first task of its host, waits for the command to start (start
 * timeout) and to end; as a sibling, waits for the first task's command to end (a WAIT_EXIT
 * long-poll). Returns 0 with the exit code (a sibling gets the first task's), or -1 with err:
 *   HVD_E_TIMEOUT   a start-up step timed out (the message names what was awaited);
 *   HVD_E_SHUTDOWN  hvd_task_abort, or the driver shut the job down (WAIT_SHUTDOWN answered);
 *   HVD_E_IO        the driver went away, or the first task of the host was lost;
 *   HVD_E_STATE     an ABORT request came before any command.
 * On those ends the command is aborted (SIGTERM, SIGKILL after the grace period) and run
 * returns once it is gone; a sibling asks its first task to abort (its ranks could no longer
 * report). A driver shutdown is also how every job ends, so the command (or, for a sibling,
 * the first task's answer) gets a moment (1 s) to end by itself first: if it does, run
 * returns its exit code as usual. */
int hvd_task_run(hvd_task *t, int *exit_code, hvd_err *err);

/* Elastic (cfg.elastic): hvd_task_run waits until the driver shuts the job down (or goes
 * away, or hvd_task_abort), serving commands meanwhile: RUN_COMMAND is refused only while a
 * command runs, STOP_COMMAND aborts it and answers once it has ended, ABORT never refuses
 * later commands. Returns 0 with the last command's exit code (0 if none ran) when the driver
 * shut the job down, else -1 with err as above. */

/* Asks hvd_task_run to abort the command and return. Any thread, any time before
 * hvd_task_stop: before hvd_task_run it makes run return at once; with no command yet,
 * later RUN_COMMAND requests are refused. */
void hvd_task_abort(hvd_task *t);

/* The result registered for this task's rank, if any (free with
 * hvd_msg_free(&hvd_result_desc, out)). Returns 0 (out->present tells), or -1. */
int hvd_task_result(hvd_task *t, hvd_result_msg *out);

/* The task service's port. */
uint16_t hvd_task_port(const hvd_task *t);

/* Stops the service: aborts a command still running and waits for its end (up to the grace
 * period and 5 s more), keeps answering exit-code requests until the minimum lifetime after
 * the end has passed, answers the calls still held (with the exit code, or an
 * HVD_E_SHUTDOWN error), stops the server, kills whatever still runs, and frees everything.
 * Must not run while hvd_task_run does (call hvd_task_abort and let run return first). NULL
 * is ignored. */
void hvd_task_stop(hvd_task *t);

#endif
