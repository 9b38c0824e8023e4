/* hvd-task: the task service of one executor slot, as a daemon (libhvd_task's life cycle:
 * start, run, stop). See usage() for what it does and the exit statuses. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sig.h"
#include "common/strv.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/task.h"

#define EXIT_FAILED 1 /* the task could not do its part (see the message) */
#define EXIT_USAGE  2 /* bad command line or environment */

static void usage(FILE *f) {
    fputs("NAME\n"
          "    hvd-task - the task service of one executor slot of an hvd-bridge job\n"
          "\n"
          "SYNOPSIS\n"
          "    hvd-task --driver ADDRS --index I [--gpus 0,1] [--host-hash H]\n"
          "             [--start-timeout SEC] [--grace SEC] [--min-lifetime SEC]\n"
          "             [--net-timeout SEC] [--elastic]\n"
          "             [--nics lo,eth0] [--bind ADDR] [--secret-file F] [--log-level LEVEL]\n"
          "    hvd-task --help\n"
          "\n"
          "DESCRIPTION\n"
          "    hvd-task is what Horovod's Spark task function is to horovod.spark.run: one per\n"
          "    slot of the job, numbered 0..N-1. It starts an authenticated RPC service named\n"
          "    \"task I\" on every interface, registers it with the driver service (index, host\n"
          "    hash, addresses, GPUs, working directory), and waits until the driver says every\n"
          "    task registered; it then probes the other tasks and reports which of their\n"
          "    addresses it reached.\n"
          "\n"
          "    The lowest index of each host hash runs the job's command there: hvd-rsh, run by\n"
          "    mpirun, connects and starts orted with /bin/sh -c in the working directory, in its\n"
          "    own process group, with this process's environment plus HVD_SECRET,\n"
          "    HVD_DRIVER_ADDRS, HOROVOD_HOSTNAME (the host hash), HOROVOD_SPARK_WORK_DIR and\n"
          "    HVD_TASK_INDEX. Its output goes to whoever is attached, else to this process's\n"
          "    stdout and stderr. Only one command ever runs (--elastic: one at a time); no\n"
          "    process of it outlives hvd-task, even when hvd-task is killed with SIGKILL. The\n"
          "    other indices of the host run nothing: they wait for that command to end and\n"
          "    exit with its status.\n"
          "\n"
          "    hvd-task ends when the command ends (after the minimum lifetime, so that late\n"
          "    siblings still get the exit code, or sooner if the driver shuts the job down),\n"
          "    when the driver shuts the job down or goes away, or on SIGTERM, SIGINT or\n"
          "    SIGHUP; the last three abort the command (SIGTERM to all its processes, SIGKILL\n"
          "    after the grace period). Events are logged to stderr, one line each, prefixed\n"
          "    \"hvd-task[I]: \".\n"
          "\n"
          "OPTIONS\n"
          "    --driver ADDRS       the driver service's addresses, in hvd-bridge's text form\n"
          "                         (\"lo=127.0.0.1:4000,eth0=10.0.0.2:4000\"). Default:\n"
          "                         $HVD_DRIVER_ADDRS.\n"
          "    --index I            this task's index, 0..N-1. Required.\n"
          "    --gpus LIST          GPU ids of this slot, comma-separated, reported to the ranks\n"
          "                         this task stands for. Default: $CUDA_VISIBLE_DEVICES, else\n"
          "                         none.\n"
          "    --host-hash H        the name under which mpirun knows this host (1 to 127 of\n"
          "                         [A-Za-z0-9_-]). Default: $HVD_HOST_HASH, else the first\n"
          "                         label of the hostname and an MD5 of the hostname, the\n"
          "                         namespaces and $CONTAINER_ID.\n"
          "    --start-timeout SEC  how long to wait for each start-up step: reaching the\n"
          "                         driver, every task registering, and (first task of a host)\n"
          "                         the command arriving. Default 600.\n"
          "    --net-timeout SEC    when the connection to the driver hears nothing for about\n"
          "                         this long (TCP keepalive: a network partition), the driver\n"
          "                         counts as gone and the command is aborted. Default\n"
          "                         $HVD_NET_TIMEOUT, else 15.\n"
          "    --grace SEC          time between SIGTERM and SIGKILL when aborting the command.\n"
          "                         Default 5.\n"
          "    --min-lifetime SEC   how long the service stays up after the command ended, to\n"
          "                         answer late requests for its exit code; it ends sooner when\n"
          "                         the driver shuts the job down. Default 3; 0 turns it off.\n"
          "    --nics LIST          advertise only these interfaces, comma-separated (all by\n"
          "                         default).\n"
          "    --bind ADDR          listen only there, and advertise only that address: a\n"
          "                         numeric address, or an interface name such as lo (its\n"
          "                         first address). Default: every interface.\n"
          "    --secret-file F      read the job secret (base64) from F, which must be private\n"
          "                         to its owner (mode 0600). Default: $HVD_SECRET, else the\n"
          "                         file named by $HVD_SECRET_FILE. The secret is never taken\n"
          "                         from the command line, where other users could read it.\n"
          "    --elastic            the job is elastic (hvd-driver run --min-np/--max-np), or\n"
          "                         one of several (hvd-driver serve --jobs N): run one\n"
          "                         command at a time, as many as the driver's launches ask\n"
          "                         for, whichever index of the host this is, and keep the\n"
          "                         newest state a rank commits here; exit when the driver\n"
          "                         ends the job (with the last command's status).\n"
          "    --warm-python PY     keep the Python interpreter PY running, with the modules\n"
          "                         of --warm-imports imported, for as long as this service\n"
          "                         runs; a rank whose program is PY (PY script.py, PY -m\n"
          "                         module, PY -c code) is forked from it instead of starting\n"
          "                         anew, so it does not import torch again: what makes an\n"
          "                         elastic reset of Python ranks fast. PY needs the hvd_bridge\n"
          "                         package on its path. Default: $HVD_WARM_PYTHON, else none.\n"
          "    --warm-imports LIST  modules PY imports, comma-separated. Default:\n"
          "                         $HVD_WARM_IMPORTS, else torch,torch._dynamo (the second\n"
          "                         is what torch's first optimizer imports).\n"
          "    --log-level LEVEL    error, warn, info (default) or debug.\n"
          "    --help               print this text and exit.\n"
          "    SEC values may have a fraction (0.5).\n"
          "\n"
          "ENVIRONMENT\n"
          "    HVD_DRIVER_ADDRS     default for --driver.\n"
          "    HVD_SECRET           the job secret as base64 (44 characters).\n"
          "    HVD_SECRET_FILE      file holding the secret, if HVD_SECRET is not set.\n"
          "    HVD_HOST_HASH        overrides the computed host hash.\n"
          "    HVD_NET_TIMEOUT      default for --net-timeout, in seconds.\n"
          "    HVD_WARM_PYTHON, HVD_WARM_IMPORTS  defaults for --warm-python, --warm-imports.\n"
          "    HVD_KEEPER           the program that keeps the command: default hvd-keeper in\n"
          "                         $HVD_BIN_DIR or beside hvd-task; 'none': a forked copy of\n"
          "                         hvd-task.\n"
          "    CUDA_VISIBLE_DEVICES default for --gpus.\n"
          "    CONTAINER_ID         salts the computed host hash (YARN containers).\n"
          "\n"
          "EXIT STATUS\n"
          "    0-255  the command ended with this status (128+N: killed by signal N); a task\n"
          "           that runs nothing exits with the status of its host's command.\n"
          "    1      the task failed before the command ended: it could not register, a\n"
          "           start-up step timed out (\"no command reached task 0 within 600 s\"),\n"
          "           the driver shut the job down or went away, or the first task of the\n"
          "           host was lost. A one-line reason is printed.\n"
          "    2      bad command line or environment.\n"
          "    128+N  stopped by signal N (SIGHUP 129, SIGINT 130, SIGTERM 143); the command,\n"
          "           if any, was aborted.\n"
          "    A command can itself exit with 1 or 2; the log says which case it was.\n"
          "\n"
          "EXAMPLE\n"
          "    Three slots on two hosts, the driver at 10.0.0.1:4000 (what an executor runs):\n"
          "      export HVD_SECRET_FILE=$HOME/.hvd/job-42.secret\n"
          "      hvd-task --driver eth0=10.0.0.1:4000 --index 0 --gpus 0 &   # host A\n"
          "      hvd-task --driver eth0=10.0.0.1:4000 --index 1 --gpus 1 &   # host A\n"
          "      hvd-task --driver eth0=10.0.0.1:4000 --index 2 --gpus 0     # host B\n"
          "    mpirun then starts orted in tasks 0 and 2 through hvd-rsh; task 1 exits with\n"
          "    task 0's status.\n",
          f);
}

/* ---- Logging and signals --------------------------------------------------------------------- */

static uint32_t g_index;

static void log_line(void *user, int level, const char *line) {
    (void)user;
    const char *tag = level == HVD_LOG_ERROR ? "error: " : level == HVD_LOG_WARN ? "warning: " : "";
    fprintf(stderr, "hvd-task[%u]: %s%s\n", g_index, tag, line);
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static hvd_task *g_task; /* the running task, for the signal thread */
static bool g_done;      /* hvd_task_run returned: signals no longer abort */

/* One signal, on the signal thread: abort the command, or leave while nothing runs yet. */
static void on_signal(int sig) {
    pthread_mutex_lock(&g_lock);
    bool first = hvd_signals_first() == sig;
    if (!g_task && !g_done) {
        /* Still starting: no command can be running, nothing to clean up. */
        fprintf(stderr, "hvd-task[%u]: got %s while starting: exiting\n", g_index, strsignal(sig));
        _exit(128 + sig);
    }
    if (g_task && first) {
        fprintf(stderr, "hvd-task[%u]: got %s: aborting\n", g_index, strsignal(sig));
        hvd_task_abort(g_task);
    } else if (!g_task) {
        fprintf(stderr, "hvd-task[%u]: got %s while stopping: already ending\n", g_index,
                strsignal(sig));
    }
    pthread_mutex_unlock(&g_lock);
}

/* Reads the process's signal pipe (common/sig.h) for the whole life of the process. */
static void *signal_main(void *arg) {
    int fd = *(int *)arg;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, -1) <= 0) continue;
        int sig;
        while ((sig = hvd_signals_next(fd)) != 0)
            on_signal(sig);
    }
    return NULL;
}

/* Installs the signal pipe and starts its thread; the threads started later take no signal.
 * Returns 0, or -1 after printing why. */
static int start_signals(void) {
    static int fd;
    hvd_err err;
    if ((fd = hvd_signals_install(&err)) < 0) {
        fprintf(stderr, "hvd-task[%u]: %s\n", g_index, err.msg);
        return -1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_t t;
    if (pthread_create(&t, NULL, signal_main, &fd) != 0) {
        fprintf(stderr, "hvd-task[%u]: cannot start the signal thread\n", g_index);
        return -1;
    }
    /* Only the signal thread takes the signals (its handler writes the pipe it reads): this
     * thread and the service's threads, created after this, inherit the mask. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    return 0;
}

/* ---- Options --------------------------------------------------------------------------------- */

typedef struct task_opts {
    const char *driver, *gpus, *host_hash, *nics, *bind, *secret_file;
    int start_ms, grace_ms, life_ms, net_ms, level;
    bool has_index;
    bool elastic;                           /* --elastic */
    const char *warm_python, *warm_imports; /* --warm-python, --warm-imports */
} task_opts;

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "hvd-task: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see hvd-task --help)\n");
    return EXIT_USAGE;
}

/* Seconds (with a fraction) to milliseconds; -1 if text is not a number >= 0. */
static int parse_secs(const char *text) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= 0) || v > INT_MAX / 1000.0) return -1;
    return (int)(v * 1000.0 + 0.5);
}

static int parse_index(const char *text) {
    char *end;
    errno = 0;
    unsigned long idx = strtoul(text, &end, 10);
    if (errno || end == text || *end || *text == '-' || idx > UINT32_MAX - 1)
        return bad_usage("bad --index %s", text);
    g_index = (uint32_t)idx;
    return 0;
}

static int parse_level(const char *text, int *level) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) /* HVD_LOG_ERROR .. HVD_LOG_DEBUG */
        if (strcmp(text, names[i]) == 0) {
            *level = i;
            return 0;
        }
    return bad_usage("bad --log-level %s: use error, warn, info or debug", text);
}

enum {
    O_DRIVER = 1000,
    O_INDEX,
    O_GPUS,
    O_HOST_HASH,
    O_START,
    O_GRACE,
    O_NICS,
    O_BIND,
    O_LIFE,
    O_SECRET_FILE,
    O_LEVEL,
    O_NET,
    O_ELASTIC,
    O_WARM_PYTHON,
    O_WARM_IMPORTS,
    O_HELP
};

static const struct option LONG_OPTS[] = {
    {"driver", required_argument, NULL, O_DRIVER},
    {"index", required_argument, NULL, O_INDEX},
    {"gpus", required_argument, NULL, O_GPUS},
    {"host-hash", required_argument, NULL, O_HOST_HASH},
    {"start-timeout", required_argument, NULL, O_START},
    {"grace", required_argument, NULL, O_GRACE},
    {"nics", required_argument, NULL, O_NICS},
    {"bind", required_argument, NULL, O_BIND},
    {"min-lifetime", required_argument, NULL, O_LIFE},
    {"secret-file", required_argument, NULL, O_SECRET_FILE},
    {"log-level", required_argument, NULL, O_LEVEL},
    {"net-timeout", required_argument, NULL, O_NET},
    {"elastic", no_argument, NULL, O_ELASTIC},
    {"warm-python", required_argument, NULL, O_WARM_PYTHON},
    {"warm-imports", required_argument, NULL, O_WARM_IMPORTS},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0},
};

/* One option. Returns 0 or the exit status. */
static int take(int c, const char *v, task_opts *o) {
    int ms;
    switch (c) {
    case O_DRIVER:
        o->driver = v;
        return 0;
    case O_INDEX:
        o->has_index = true;
        return parse_index(v);
    case O_GPUS:
        o->gpus = v;
        return 0;
    case O_HOST_HASH:
        o->host_hash = v;
        return 0;
    case O_NICS:
        o->nics = v;
        return 0;
    case O_BIND:
        o->bind = v;
        return 0;
    case O_SECRET_FILE:
        o->secret_file = v;
        return 0;
    case O_LEVEL:
        return parse_level(v, &o->level);
    case O_ELASTIC:
        o->elastic = true;
        return 0;
    case O_WARM_PYTHON:
        o->warm_python = *v ? v : NULL;
        return 0;
    case O_WARM_IMPORTS:
        o->warm_imports = v;
        return 0;
    case O_START:
        if ((ms = parse_secs(v)) <= 0) return bad_usage("bad --start-timeout %s", v);
        o->start_ms = ms;
        return 0;
    case O_GRACE:
        if ((ms = parse_secs(v)) < 0) return bad_usage("bad --grace %s", v);
        o->grace_ms = ms > 0 ? ms : 1; /* 0 would mean the default */
        return 0;
    case O_LIFE:
        if ((ms = parse_secs(v)) < 0) return bad_usage("bad --min-lifetime %s", v);
        o->life_ms = ms > 0 ? ms : -1; /* 0 would mean the default */
        return 0;
    case O_NET:
        if ((ms = parse_secs(v)) <= 0 || ms > HVD_NET_TIMEOUT_MAX_S * 1000)
            return bad_usage("bad --net-timeout %s", v);
        o->net_ms = ms;
        return 0;
    default:
        return EXIT_USAGE;
    }
}

/* Parses the command line. Returns 0, -1 for --help (exit 0), or the exit status. */
static int parse(int argc, char **argv, task_opts *o) {
    *o = (task_opts){.driver = getenv(HVD_DRIVER_ADDRS_ENV),
                     .start_ms = HVD_TASK_START_TIMEOUT_DEFAULT_S * 1000,
                     .grace_ms = HVD_GRACE_DEFAULT_MS,
                     .life_ms = HVD_MIN_LIFETIME_DEFAULT_MS,
                     .net_ms = HVD_NET_TIMEOUT_DEFAULT_S * 1000,
                     .level = HVD_LOG_INFO,
                     .warm_python = getenv(HVD_WARM_PYTHON_ENV),
                     .warm_imports = getenv(HVD_WARM_IMPORTS_ENV)};
    if (o->warm_python && !*o->warm_python) o->warm_python = NULL;
    const char *net_env = getenv(HVD_NET_TIMEOUT_ENV);
    if (net_env && *net_env && (o->net_ms = parse_secs(net_env)) <= 0)
        return bad_usage("bad HVD_NET_TIMEOUT %s", net_env);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--secret", 8) == 0 && strncmp(argv[i], "--secret-file", 13) != 0)
            return bad_usage("%s: the secret is never taken from the command line; set "
                             "HVD_SECRET or HVD_SECRET_FILE, or pass --secret-file",
                             argv[i]);
    opterr = 0;
    int c, rc = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, ":h", LONG_OPTS, NULL)) != -1) {
        if (c == O_HELP || c == 'h') {
            usage(stdout);
            return -1;
        }
        if (c == ':') return bad_usage("%s needs a value", argv[optind - 1]);
        if (c == '?') return bad_usage("unknown option %s", argv[optind - 1]);
        rc = take(c, optarg, o);
    }
    if (rc != 0) return rc;
    if (optind < argc) return bad_usage("unexpected argument %s", argv[optind]);
    if (!o->has_index) return bad_usage("%s", "--index is required");
    if (!o->driver || !*o->driver)
        return bad_usage("%s", "no driver address: pass --driver or set HVD_DRIVER_ADDRS");
    return 0;
}

/* ---- The task's life --------------------------------------------------------------------------
 */

/* Starts the task service from the options. Returns it, or NULL and sets *status. */
static hvd_task *start_task(const task_opts *o, int *status) {
    hvd_err err;
    hvd_addr *addrs = NULL;
    size_t naddrs = 0;
    if (hvd_addrs_parse(o->driver, &addrs, &naddrs, &err) != 0) {
        *status = bad_usage("bad driver addresses: %s", err.msg);
        return NULL;
    }
    hvd_task_config cfg = {.index = g_index,
                           .driver_addrs = addrs,
                           .n_driver_addrs = naddrs,
                           .host_hash = o->host_hash,
                           .start_timeout_ms = o->start_ms,
                           .grace_ms = o->grace_ms,
                           .min_lifetime_ms = o->life_ms,
                           .net_timeout_ms = o->net_ms,
                           .bind_host = o->bind,
                           .log = log_line,
                           .log_level = o->level,
                           .elastic = o->elastic,
                           .warm_python = o->warm_python,
                           .warm_imports = o->warm_imports};
    int rc = o->secret_file ? hvd_secret_read_file(&cfg.secret, o->secret_file, &err)
                            : hvd_secret_load_env(&cfg.secret, &err);
    if (rc != 0) {
        free(addrs);
        *status = bad_usage("%s", err.msg);
        return NULL;
    }
    char **gpus = o->gpus ? hvd_strv_split(o->gpus, ',') : NULL;
    char **nics = o->nics ? hvd_strv_split(o->nics, ',') : NULL;
    cfg.gpus = (const char *const *)gpus;
    cfg.nics = (const char *const *)nics;
    hvd_task *t = NULL;
    if (start_signals() == 0)
        t = hvd_task_start(&cfg, &err);
    else
        err.msg[0] = '\0';
    hvd_secret_wipe(&cfg.secret);
    free(addrs);
    hvd_strv_free(gpus);
    hvd_strv_free(nics);
    if (!t) {
        if (err.msg[0]) fprintf(stderr, "hvd-task[%u]: %s\n", g_index, err.msg);
        *status = EXIT_FAILED;
    }
    return t;
}

/* Runs the task to its end. Returns the exit status. */
static int run_task(hvd_task *t) {
    pthread_mutex_lock(&g_lock);
    g_task = t;
    pthread_mutex_unlock(&g_lock);
    int code = 0, status = EXIT_FAILED;
    hvd_err err;
    int rc = hvd_task_run(t, &code, &err);
    pthread_mutex_lock(&g_lock);
    g_task = NULL;
    g_done = true;
    int sig = hvd_signals_first();
    pthread_mutex_unlock(&g_lock);
    if (rc == 0)
        status = code;
    else if (sig)
        status = 128 + sig;
    else
        fprintf(stderr, "hvd-task[%u]: %s\n", g_index, err.msg);
    hvd_task_stop(t);
    return status;
}

int main(int argc, char **argv) {
    task_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0) return rc < 0 ? 0 : rc;
    hvd_task *t = start_task(&o, &rc);
    return t ? run_task(t) : rc;
}
