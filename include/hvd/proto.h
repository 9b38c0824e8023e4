/* The messages of the driver service and the task services (docs/protocol.md, "Driver
 * service" and "Task service"). Every request is answered with the reply named in its
 * comment, or with an error reply (hvd_error_body). Requests marked idempotent may be retried
 * by clients (HVD_CALL_RETRY).
 *
 * Service names (bound into the handshake): the driver is "driver"; task service i is
 * "task i" (hvd_task_service_name). */
#ifndef HVD_PROTO_H
#define HVD_PROTO_H

#include <stdbool.h>
#include <stdint.h>

#include "hvd/message.h"
#include "hvd/net.h"

#define HVD_DRIVER_SERVICE   "driver"
#define HVD_SERVICE_NAME_MAX 32

/* Writes "task <index>" into out. */
void hvd_task_service_name(uint32_t index, char out[HVD_SERVICE_NAME_MAX]);

/* ---- Environment variables -------------------------------------------------------------- */

/* Text form of the driver's addresses (hvd_addrs_format), for hvd-rsh and hvd-exec. */
#define HVD_DRIVER_ADDRS_ENV "HVD_DRIVER_ADDRS"
/* Set by a task service for its command: the host hash and the executor's work dir (Horovod's
 * names), and this task's index. */
#define HVD_HOSTNAME_ENV   "HOROVOD_HOSTNAME"
#define HVD_WORK_DIR_ENV   "HOROVOD_SPARK_WORK_DIR"
#define HVD_TASK_INDEX_ENV "HVD_TASK_INDEX"
/* The process id of the task service whose command (orted) started the rank: signals from it,
 * from orted, or from what lies between (the process runner) are the job ending its ranks. */
#define HVD_TASK_PID_ENV "HVD_TASK_PID"
/* Set by hvd-exec for the entry point: the addresses of the rank's task service (text form),
 * where an elastic rank commits its state. */
#define HVD_TASK_ADDRS_ENV "HVD_TASK_ADDRS"
/* Set by a task service that keeps a warm interpreter (hvd_task_config.warm_python) for its
 * command: the Unix socket where hvd-exec hands it a rank that runs that interpreter. */
#define HVD_WARM_SOCKET_ENV "HVD_WARM_SOCKET"
/* ... and the interpreter's path (also hvd-task's default for --warm-python): hvd-exec asks
 * the interpreter only for ranks whose program is the same file. */
#define HVD_WARM_PYTHON_ENV "HVD_WARM_PYTHON"
/* hvd-task's default for --warm-imports (comma-separated modules). */
#define HVD_WARM_IMPORTS_ENV "HVD_WARM_IMPORTS"
/* Set by hvd-driver's elastic launches for the ranks: which mpirun of the job this is. */
#define HVD_ELASTIC_EPOCH_ENV "HVD_ELASTIC_EPOCH"

/* ---- Message types ---------------------------------------------------------------------- */

enum {
    /* driver service requests */
    HVD_MSG_REGISTER_TASK = 200,    /* hvd_task_info -> ack; idempotent (replaces) */
    HVD_MSG_TASK_ADDRS = 201,       /* hvd_index_msg -> hvd_addrs_msg; idempotent */
    HVD_MSG_HOST_INDICES = 202,     /* hvd_host_msg -> hvd_indices_msg; idempotent */
    HVD_MSG_SET_LOCAL_RANK = 203,   /* hvd_local_rank_msg -> hvd_index_msg; idempotent */
    HVD_MSG_INDEX_BY_RANK = 204,    /* hvd_rank_msg -> hvd_index_msg; idempotent */
    HVD_MSG_CODE = 205,             /* empty -> hvd_code_msg; idempotent */
    HVD_MSG_REPORT_REACHABLE = 206, /* hvd_reachable_msg -> ack; idempotent (replaces) */
    HVD_MSG_WAIT_SHUTDOWN = 207,    /* hvd_index_msg (the caller's task) -> ack when the driver
                                       shuts tasks down (long-poll) */
    HVD_MSG_REPORT_RESULT = 208,    /* hvd_result_msg -> ack; idempotent (replaces) */
    HVD_MSG_TASK_INFO = 209,        /* hvd_index_msg -> hvd_task_info; idempotent */
    HVD_MSG_AGENT_WATCH = 220,      /* hvd_agent_msg -> never answered: held while the agent
                                       (hvd-rsh) runs; closed without AGENT_REPORT = it died */
    HVD_MSG_AGENT_REPORT = 221,     /* hvd_agent_report_msg -> ack: how the agent's command
                                       (orted) ended, sent on the AGENT_WATCH connection */
    HVD_MSG_TASK_EVENT = 222,       /* hvd_task_event_msg -> ack: what happened to a task
                                       service or its command (the driver names the part of a
                                       job that failed first) */
    HVD_MSG_RANK_WATCH = 223,       /* hvd_rank_msg -> never answered: held while the rank's
                                       entry point runs; closed without REPORT_RESULT first =
                                       the rank died (which silent rank went first) */

    /* task service requests */
    HVD_MSG_REGISTRATION_DONE = 300, /* hvd_peers_msg -> ack; the task then probes its peers
                                        (unless probe is false) and sends REPORT_REACHABLE */
    HVD_MSG_RUN_COMMAND = 301,       /* hvd_run_msg -> ack, or (attach) stream chunks on
                                        channels 1 (stdout) and 2 (stderr), then hvd_exit_msg */
    HVD_MSG_ATTACH = 302,            /* empty -> chunks as above, then hvd_exit_msg */
    HVD_MSG_ABORT = 303,             /* empty -> ack; idempotent */
    HVD_MSG_WAIT_EXIT = 304,         /* empty -> hvd_exit_msg when the command ends (long-poll);
                                        idempotent */
    HVD_MSG_COMMAND_STATUS = 305,    /* empty -> hvd_status_msg; idempotent */
    HVD_MSG_RESOURCES = 306,         /* empty -> hvd_task_info (this task's entry); idempotent */
    HVD_MSG_REGISTER_RESULT = 307,   /* hvd_result_msg -> ack; idempotent (replaces) */
    HVD_MSG_GET_RESULT = 308,        /* empty -> hvd_result_msg; idempotent */

    /* replies */
    HVD_MSG_ADDRS = 400,
    HVD_MSG_INDICES = 401,
    HVD_MSG_INDEX = 402,
    HVD_MSG_CODE_REPLY = 403,
    HVD_MSG_EXIT = 404,
    HVD_MSG_STATUS = 405,
    HVD_MSG_TASK_INFO_REPLY = 406,
    HVD_MSG_RESULT = 407,
};

/* Elastic jobs (docs/elastic.md): the driver tells ranks whether the hosts changed; a task
 * service runs one command at a time, any number in its life, and keeps the newest state a
 * rank committed to it, which outlives the ranks. */
enum {
    HVD_MSG_ELASTIC_STATE = 210, /* empty -> hvd_elastic_msg; idempotent */
    HVD_MSG_STOP_COMMAND = 310,  /* empty -> hvd_status_msg once no command runs (long-poll);
                                    idempotent */
    HVD_MSG_COMMIT_STATE = 311,  /* hvd_commit_msg -> ack; idempotent (an older id never
                                    replaces a newer one) */
    HVD_MSG_LATEST_COMMIT = 312, /* empty -> hvd_commit_msg without the state; idempotent */
    HVD_MSG_FETCH_COMMIT = 313,  /* hvd_commit_ref_msg -> hvd_commit_msg; idempotent */
    HVD_MSG_COMMIT = 408,
    HVD_MSG_ELASTIC = 409,
};

/* Stream channels of RUN_COMMAND / ATTACH. */
#define HVD_CHANNEL_STDOUT 1
#define HVD_CHANNEL_STDERR 2

/* ---- Bodies ------------------------------------------------------------------------------ */

/* An address on the wire: hvd_addr itself (ifname, host, port). */
extern const hvd_msg_desc hvd_addr_desc;

/* What a task registers, and what RESOURCES and TASK_INFO return. */
typedef struct hvd_task_info {
    uint32_t index;
    char *host_hash;
    hvd_list addrs;     /* hvd_addr: every address of the task service */
    hvd_strv gpus;      /* GPU ids of the executor ("0", "1"), maybe empty */
    char *work_dir;     /* the executor's working directory */
    uint16_t free_port; /* a TCP port that was free on the task's host when it registered
                           (torch.distributed's MASTER_PORT when its rank is 0), or 0 */
    bool elastic;       /* it runs commands one after another until the driver shuts the job
                           down (hvd-task --elastic); false: one command, then it ends */
} hvd_task_info;
extern const hvd_msg_desc hvd_register_task_desc; /* REGISTER_TASK */
extern const hvd_msg_desc hvd_task_info_desc;     /* TASK_INFO_REPLY */

typedef struct hvd_index_msg {
    uint32_t index;
} hvd_index_msg;
extern const hvd_msg_desc hvd_task_addrs_desc;    /* TASK_ADDRS request */
extern const hvd_msg_desc hvd_task_info_req_desc; /* TASK_INFO request */
extern const hvd_msg_desc hvd_index_desc;         /* INDEX reply */

typedef struct hvd_addrs_msg {
    hvd_list addrs; /* hvd_addr */
} hvd_addrs_msg;
extern const hvd_msg_desc hvd_addrs_desc; /* ADDRS reply */

typedef struct hvd_host_msg {
    char *host_hash;
} hvd_host_msg;
extern const hvd_msg_desc hvd_host_indices_desc; /* HOST_INDICES request */

typedef struct hvd_indices_msg {
    hvd_u32v indices; /* sorted ascending */
} hvd_indices_msg;
extern const hvd_msg_desc hvd_indices_desc; /* INDICES reply */

typedef struct hvd_local_rank_msg {
    char *host_hash;
    uint32_t local_rank;
    uint32_t rank;
} hvd_local_rank_msg;
extern const hvd_msg_desc hvd_set_local_rank_desc;

typedef struct hvd_rank_msg {
    uint32_t rank;
} hvd_rank_msg;
extern const hvd_msg_desc hvd_index_by_rank_desc;

/* The job's entry point: a program; a shared object shipped as bytes; or a program that
 * reads argument bytes (the payload) on descriptor HVD_PAYLOAD_FD and may write result bytes
 * on HVD_RESULT_FD (the Python package runs a pickled function this way). */
enum { HVD_CODE_ARGV = 1, HVD_CODE_SHARED_OBJECT = 2, HVD_CODE_ARGV_IO = 3 };
/* The descriptors of an ARGV_IO program, also named in its environment (same names). */
#define HVD_PAYLOAD_FD 3
#define HVD_RESULT_FD  4
typedef struct hvd_code_msg {
    uint32_t kind;    /* HVD_CODE_ARGV, HVD_CODE_SHARED_OBJECT or HVD_CODE_ARGV_IO */
    hvd_strv argv;    /* ARGV, ARGV_IO: the program and its arguments */
    hvd_bytes object; /* SHARED_OBJECT: the .so file's bytes; ARGV_IO: the payload */
    char *symbol;     /* SHARED_OBJECT: the hvd_entry_fn to call */
    hvd_bytes arg;    /* SHARED_OBJECT: the argument bytes */
} hvd_code_msg;
/* The largest CODE reply hvd-exec accepts (a client's max_frame for that one call): a payload
 * or object of up to about 2 GiB, as Horovod's pickled functions. The driver refuses a code
 * message that would not fit (HVD_CODE_SLACK covers the rest of the message). While the ranks
 * fetch it, the driver holds one sealed copy per rank being sent to. */
#define HVD_CODE_MAX_FRAME HVD_MAX_FRAME_LIMIT
#define HVD_CODE_SLACK     (64u * 1024u)
extern const hvd_msg_desc hvd_code_req_desc; /* CODE request (empty) */
extern const hvd_msg_desc hvd_code_desc;     /* CODE_REPLY */

/* Task-to-task reachability: which addresses of task `to` the task `from` reached. */
typedef struct hvd_reach {
    uint32_t to;
    hvd_list addrs; /* hvd_addr: reached, with the interface name matching on both ends */
} hvd_reach;
typedef struct hvd_reachable_msg {
    uint32_t from;
    hvd_list reach; /* hvd_reach, one per probed peer */
} hvd_reachable_msg;
extern const hvd_msg_desc hvd_reachable_desc;

/* A rank's result. */
typedef struct hvd_result_msg {
    int32_t rank;     /* -1 when unknown */
    uint32_t index;   /* the task the rank represents */
    bool present;     /* false: nothing registered yet (GET_RESULT) */
    int32_t status;   /* the entry point's exit status */
    hvd_bytes result; /* result bytes (may be empty) */
    char *error;      /* error text, NULL on success */
    bool stopped;     /* a signal from outside (mpirun ending the job) stopped the rank before
                         its entry point finished: it did not fail on its own */
} hvd_result_msg;
extern const hvd_msg_desc hvd_report_result_desc;   /* REPORT_RESULT (driver) */
extern const hvd_msg_desc hvd_register_result_desc; /* REGISTER_RESULT (task) */
extern const hvd_msg_desc hvd_result_desc;          /* RESULT reply */

/* What the driver tells each task once every task registered. */
typedef struct hvd_peers_msg {
    bool probe;     /* false: nothing to probe here (or the user fixed the interfaces) */
    hvd_list tasks; /* hvd_task_info of the tasks the receiver is to probe (index, host
                       hash and candidate addresses only; empty when probe is false) */
} hvd_peers_msg;
extern const hvd_msg_desc hvd_registration_done_desc;

typedef struct hvd_run_msg {
    char *command;      /* run as /bin/sh -c command */
    hvd_strv env_set;   /* "NAME=VALUE" added to the executor's environment */
    hvd_strv env_unset; /* names removed from it */
    bool prefix_output; /* "[index]<stdout>:" line prefixes */
    bool timestamps;    /* asctime()-style timestamps before the prefixes */
    bool attach;        /* stream output on this call and answer with the exit code */
} hvd_run_msg;
extern const hvd_msg_desc hvd_run_desc;

typedef struct hvd_exit_msg {
    int32_t exit_code; /* status, or 128 + signal */
    int32_t signal;    /* the signal that killed the command when nobody asked for its end (no
                          ABORT, no shutdown of the task): someone killed it; 0 otherwise */
} hvd_exit_msg;
extern const hvd_msg_desc hvd_exit_desc;

typedef struct hvd_status_msg {
    bool started;
    bool ended;
    int32_t exit_code; /* valid when ended */
} hvd_status_msg;
extern const hvd_msg_desc hvd_status_desc;

/* An agent (hvd-rsh) running a command for a host: AGENT_WATCH. */
typedef struct hvd_agent_msg {
    char *host_hash; /* the host it runs the command for */
    uint32_t pid;    /* its process id, on mpirun's machine */
} hvd_agent_msg;
extern const hvd_msg_desc hvd_agent_watch_desc;
extern const hvd_msg_desc hvd_rank_watch_desc;

/* How an agent's command ended: AGENT_REPORT. */
typedef struct hvd_agent_report_msg {
    char *host_hash;
    uint32_t pid;
    int32_t index;     /* the task that ran the command; -1: none was found */
    bool started;      /* the command started */
    int32_t exit_code; /* when it ended: hvd_exit_msg */
    int32_t signal;    /* ... and hvd_exit_msg's signal: killed from outside */
    bool lost;         /* the task service went away while the command ran */
    bool stopped;      /* the agent was told to stop (a signal): it asked the task to abort */
    char *error;       /* what went wrong (NULL: nothing) */
} hvd_agent_report_msg;
extern const hvd_msg_desc hvd_agent_report_desc;

/* Elastic: what ELASTIC_STATE answers. */
typedef struct hvd_elastic_msg {
    uint64_t epoch;     /* which mpirun of the job this is: 1, 2, ... (0: not elastic) */
    bool hosts_updated; /* hosts came, or are leaving, since this mpirun started: the ranks
                           should commit and end (HVD_ELASTIC_EXIT_RESET) for a reset */
} hvd_elastic_msg;
extern const hvd_msg_desc hvd_elastic_state_desc; /* ELASTIC_STATE request (empty) */
extern const hvd_msg_desc hvd_elastic_desc;       /* ELASTIC reply */

/* Elastic: a rank's committed state, kept by its task service (at most one, the newest). */
typedef struct hvd_commit_msg {
    uint64_t id;     /* 1, 2, ...: the commit's number, the same on every rank; 0: none */
    uint64_t size;   /* the state's length (LATEST_COMMIT tells it without sending it) */
    hvd_bytes state; /* the committed bytes (empty in LATEST_COMMIT's answer) */
} hvd_commit_msg;
extern const hvd_msg_desc hvd_commit_state_desc;  /* COMMIT_STATE */
extern const hvd_msg_desc hvd_latest_commit_desc; /* LATEST_COMMIT request (empty) */
extern const hvd_msg_desc hvd_commit_desc;        /* COMMIT reply */

typedef struct hvd_commit_ref_msg {
    uint64_t id; /* the commit wanted */
} hvd_commit_ref_msg;
extern const hvd_msg_desc hvd_fetch_commit_desc; /* FETCH_COMMIT */
extern const hvd_msg_desc hvd_stop_command_desc; /* STOP_COMMAND request (empty) */

/* Empty task-service requests. */
extern const hvd_msg_desc hvd_attach_desc;
extern const hvd_msg_desc hvd_abort_desc;
extern const hvd_msg_desc hvd_wait_exit_desc;
extern const hvd_msg_desc hvd_command_status_desc;
extern const hvd_msg_desc hvd_resources_desc;
extern const hvd_msg_desc hvd_get_result_desc;
extern const hvd_msg_desc hvd_wait_shutdown_desc;

/* TASK_EVENT kinds. DONE and ENDING come on the task's WAIT_SHUTDOWN connection just before it
 * closes (so that the close is understood); the others on a connection of their own. */
enum {
    HVD_TASK_EV_DONE = 1,            /* the task ends normally (its command, or its host's, ended
                                        by itself): its watch closing is no loss */
    HVD_TASK_EV_ENDING = 2,          /* the task ends early (text: why): lost as of now */
    HVD_TASK_EV_COMMAND_ENDED = 3,   /* its command (orted) ended unasked with exit_code (and
                                        signal: killed), not 0 */
    HVD_TASK_EV_AGENT_GONE = 4,      /* the agent that started its command went away while the
                                        command ran (text: from where) */
    HVD_TASK_EV_COMMAND_STARTED = 5, /* a one-shot task service (no --elastic) started its one
                                        command: it is spent after this job, even if no rank
                                        ever ran in it */
};
typedef struct hvd_task_event_msg {
    uint32_t index;
    uint32_t kind; /* HVD_TASK_EV_* */
    int32_t exit_code;
    int32_t signal;
    char *text; /* or NULL */
} hvd_task_event_msg;
extern const hvd_msg_desc hvd_task_event_desc;

/* Every request and reply description above (for fuzzing and docs). */
extern const hvd_msg_desc *const hvd_proto_all[];
extern const size_t hvd_proto_count;

/* Copies an address list out of a decoded hvd_list (malloc'd array of *n addresses). Returns
 * NULL only on out of memory (or n == 0). */
hvd_addr *hvd_addrs_from_list(const hvd_list *l, size_t *n);

/* ---- Clients of the two services --------------------------------------------------------- */

struct hvd_client;

/* Connects to the driver named by the environment: addresses from $HVD_DRIVER_ADDRS, secret
 * from $HVD_SECRET or $HVD_SECRET_FILE. Returns NULL with err saying which variable is
 * missing or wrong, or why the driver could not be reached. */
struct hvd_client *hvd_driver_connect_env(hvd_secret *secret_out, hvd_err *err);

/* Connects to task service `index`, asking the driver for its addresses. Returns NULL with
 * err. */
struct hvd_client *hvd_task_connect(struct hvd_client *driver, const hvd_secret *secret,
                                    uint32_t index, hvd_err *err);

#endif
