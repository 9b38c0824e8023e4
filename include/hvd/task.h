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
typedef void (*hvd_task_log_fn)(void *user, int level, const char *line);

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
    int start_timeout_ms;    /* registration and command start; 0: 600000 */
    int grace_ms;            /* abort: SIGTERM -> SIGKILL; 0: 5000 */
    int min_lifetime_ms;     /* exit code still answered this long after the end; 0: 3000 */
    hvd_task_log_fn log;     /* NULL: none */
    void *log_user;
    int log_level; /* lines above this level are not passed to log */
} hvd_task_config;

/* Starts the task service and registers it with the driver (retrying until the driver
 * answers or the start timeout passes). Returns NULL with err. */
hvd_task *hvd_task_start(const hvd_task_config *cfg, hvd_err *err);

/* Runs the rest of the task's life on the calling thread: waits for the driver's
 * registration-complete notice, probes the other tasks and reports what it reached; then,
 * as the first task of its host, waits for the command to start (start timeout) and to end;
 * as a sibling, waits for the first task's command to end. Returns 0 with the exit code (a
 * sibling gets the first task's), or -1 with err (timeouts name what was awaited). Ends early
 * (aborting the command) when the driver shuts tasks down or goes away, or on
 * hvd_task_abort. */
int hvd_task_run(hvd_task *t, int *exit_code, hvd_err *err);

/* Asks hvd_task_run to abort the command and return. Any thread. */
void hvd_task_abort(hvd_task *t);

/* The result registered for this task's rank, if any (free with
 * hvd_msg_free(&hvd_result_desc, out)). Returns 0 (out->present tells), or -1. */
int hvd_task_result(hvd_task *t, hvd_result_msg *out);

/* The task service's port. */
uint16_t hvd_task_port(const hvd_task *t);

/* Stops the service (after answering pending exit-code long-polls for up to the minimum
 * lifetime), kills any command still running, and frees everything. NULL is ignored. */
void hvd_task_stop(hvd_task *t);

#endif
