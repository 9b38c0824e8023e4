/* The defaults and environment variables shared by the programs and libraries of hvd-bridge.
 * One name per setting, from the command line to the socket: --net-timeout on the command
 * lines, HVD_NET_TIMEOUT in the environment, net_timeout_ms in every config struct. */
#ifndef HVD_DEFAULTS_H
#define HVD_DEFAULTS_H

/* How long a peer may stay silent before its connection counts as lost (TCP keepalive and
 * TCP_USER_TIMEOUT): a task service cut off from the driver, say by a network partition.
 * --net-timeout S, HVD_NET_TIMEOUT=S, net_timeout_ms. */
#define HVD_NET_TIMEOUT_ENV       "HVD_NET_TIMEOUT"
#define HVD_NET_TIMEOUT_DEFAULT_S 15
#define HVD_NET_TIMEOUT_MAX_S     3600

/* The driver's budget for the tasks to register and to probe each other (--start-timeout). */
#define HVD_START_TIMEOUT_DEFAULT_S 120
/* A task service's budget for each step of its start (registering, the driver's notice, the
 * command's arrival: hvd-task --start-timeout). Longer than the driver's: executors may
 * start well before the driver has everyone. */
#define HVD_TASK_START_TIMEOUT_DEFAULT_S 600

/* Abort: SIGTERM, then SIGKILL after this grace period (hvd-task --grace). */
#define HVD_GRACE_DEFAULT_MS 5000
/* The grace of a task service that hvd-driver started (--local, --ssh-hosts) and stops: its
 * command's (HVD_GRACE_DEFAULT_MS) and then time for that command's keeper to remove the
 * command's private directory (/dev/shm/hvd-task-*). With equal graces, ranks that ignore
 * SIGTERM made both end at once, and the task's SIGKILL took the command's keeper before it
 * had cleaned up. */
#define HVD_TASK_STOP_GRACE_MS (HVD_GRACE_DEFAULT_MS + 3000)
/* How long a task service still answers exit-code requests after its command ended, unless
 * the driver ends the job first (hvd-task --min-lifetime). */
#define HVD_MIN_LIFETIME_DEFAULT_MS 3000
/* A stopped job's mpirun gets SIGTERM, and SIGKILL this much later. */
#define HVD_MPIRUN_KILL_DELAY_MS 10000
/* ... or this much later when the job stops because a part of it is unreachable (a network
 * partition): mpirun would only wait on the lost orted, and the reachable ranks end with their
 * task services anyway. */
#define HVD_MPIRUN_LOST_KILL_DELAY_MS 1000

/* How long a launcher waits, once a failed job's mpirun has exited, for the results of ranks
 * still reporting that they were stopped (hvd_driver_wait_results). */
#define HVD_LATE_RESULTS_MS 1000

/* How long hvd-rsh waits for the driver to take its AGENT_REPORT before it exits anyway. */
#define HVD_AGENT_REPORT_TIMEOUT_MS 2000

/* Clients that reach a service at one of several addresses (the driver's, a task's) start the
 * next address only when none of the started ones connected within this long or all failed:
 * a service on this machine or a LAN then does one handshake per client, not one per address
 * (hvd_client_config.stagger_ms). */
#define HVD_CONNECT_STAGGER_MS 100
/* How often the rank bootstrap and hvd-rsh try to reach the driver or a task when the service
 * does not finish the handshake in time (a service on a machine busy starting 1000 ranks). */
#define HVD_CONNECT_ATTEMPTS 3

/* Descriptors a driver of N tasks may hold at once: N * PER_TASK + BASE. Measured with 1024
 * tasks on 256 hosts: 3314 sockets at the peak of the launch (a long-poll per task, every
 * rank's calls, the agents' connections), plus hvd-driver's handles of local tasks.
 * hvd-driver raises its soft RLIMIT_NOFILE to it; the library warns when the limit is lower. */
#define HVD_DRIVER_FDS_PER_TASK 4
#define HVD_DRIVER_FDS_BASE     256

/* ---- Elastic jobs (hvd-driver run --min-np/--max-np, docs/elastic.md) ---- */

/* How long fewer than --min-np slots may be usable before the job fails (--elastic-timeout;
 * Horovod's default and its variable). */
#define HVD_ELASTIC_TIMEOUT_DEFAULT_S 600
#define HVD_ELASTIC_TIMEOUT_ENV       "HOROVOD_ELASTIC_TIMEOUT"
/* How often the host discovery script runs (Horovod: once a second). */
#define HVD_DISCOVERY_INTERVAL_MS 1000
/* A discovery script that has not ended in this long counts as failed (and is killed). */
#define HVD_DISCOVERY_TIMEOUT_MS 10000
/* The exit status with which a rank ends for a reset (hosts updated, or a collective failed
 * because another rank went away): EX_TEMPFAIL, "try again". Never blamed on its host. */
#define HVD_ELASTIC_EXIT_RESET 75
/* An elastic rank that failed on its own (status 1-127 but 75) stays this long after its
 * report before it exits: mpirun aborts the other ranks when the first one exits, and ranks
 * that fail at the same point (e.g. a state over HVD_ELASTIC_STATE_MAX) must all be heard, so
 * that the driver sees the job's own failure and ends the job instead of blaming one host and
 * resetting into the same failure. */
#define HVD_ELASTIC_FAIL_LINGER_MS 1000
/* A reset stops the old mpirun: SIGTERM, SIGKILL this much later (the ranks are restarted
 * from their last commit anyway; the delay lets mpirun remove its session directory). */
#define HVD_ELASTIC_KILL_DELAY_MS 3000
/* A host whose rank failed is blacklisted for MIN * 2^k + U(0, MIN) seconds (its k-th time),
 * at most MAX (--blacklist-cooldown-range MIN MAX; Horovod's formula and upper bound). */
#define HVD_BLACKLIST_COOLDOWN_MIN_S 10
#define HVD_BLACKLIST_COOLDOWN_MAX_S 3600
/* hvd-driver --local with a discovery script: the most task indices its fake hosts use. */
#define HVD_ELASTIC_LOCAL_TASKS_MAX 1024
/* The largest state a rank can commit to its task service (one frame carries it). */
#define HVD_ELASTIC_STATE_MAX (60u * 1024u * 1024u)

/* Where hvd-rsh, hvd-exec and hvd-task are (default: next to the running program). */
#define HVD_BIN_DIR_ENV "HVD_BIN_DIR"

/* What a task service's warm interpreter imports unless told otherwise (hvd-task
 * --warm-imports): torch, and torch._dynamo, which torch's first optimizer imports (1.7 s). */
#define HVD_WARM_IMPORTS_DEFAULT "torch,torch._dynamo"

#endif
