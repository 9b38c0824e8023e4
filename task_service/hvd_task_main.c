/* hvd-task: the task service of one executor slot, as a daemon (libhvd_task's life cycle:
 * start, run, stop). See usage() for what it does and the exit statuses. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
          "             [--net-timeout SEC]\n"
          "             [--nics lo,eth0] [--secret-file F] [--log-level LEVEL]\n"
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
          "    stdout and stderr. Only one command ever runs; no process of it outlives hvd-task,\n"
          "    even when hvd-task is killed with SIGKILL. The other indices of the host run\n"
          "    nothing: they wait for that command to end and exit with its status.\n"
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
          "    --secret-file F      read the job secret (base64) from F, which must be private\n"
          "                         to its owner (mode 0600). Default: $HVD_SECRET, else the\n"
          "                         file named by $HVD_SECRET_FILE. The secret is never taken\n"
          "                         from the command line, where other users could read it.\n"
          "    --log-level LEVEL    error, warn, info (default) or debug.\n"
          "    --help               print this text and exit.\n"
          "    SEC values may have a fraction (0.5).\n"
          "\n"
          "ENVIRONMENT\n"
          "    HVD_DRIVER_ADDRS     default for --driver.\n"
          "    HVD_SECRET           the job secret as base64 (44 characters).\n"
          "    HVD_SECRET_FILE      file holding the secret, if HVD_SECRET is not set.\n"
          "    HVD_HOST_HASH        overrides the computed host hash.\n"
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
static int g_signal;     /* the first signal received */

static void *signal_main(void *arg) {
    sigset_t *set = arg;
    for (;;) {
        int sig;
        if (sigwait(set, &sig) != 0) continue;
        pthread_mutex_lock(&g_lock);
        bool first = g_signal == 0;
        if (first) g_signal = sig;
        if (!g_task && !g_done) {
            /* Still starting: no command can be running, nothing to clean up. */
            fprintf(stderr, "hvd-task[%u]: got %s while starting: exiting\n", g_index,
                    strsignal(sig));
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
    return NULL;
}

/* ---- Options --------------------------------------------------------------------------------- */

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

/* Splits "a,b,c" into a NULL-terminated array of pointers into a copy of text. */
static char **split_list(const char *text) {
    size_t n = 1;
    for (const char *p = text; *p; p++)
        n += *p == ',';
    char **v = calloc(n + 1, sizeof *v);
    char *copy = strdup(text);
    if (!v || !copy) {
        free(v);
        free(copy);
        return NULL;
    }
    size_t k = 0;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save))
        v[k++] = tok;
    if (k == 0) free(copy); /* v[0] owns the copy otherwise */
    return v;
}

static void free_list(char **v) {
    if (v) free(v[0]);
    free(v);
}

int main(int argc, char **argv) {
    const char *driver = getenv(HVD_DRIVER_ADDRS_ENV), *index_s = NULL, *gpus_s = NULL,
               *host_hash = NULL, *nics_s = NULL, *secret_file = NULL, *level_s = "info";
    int start_ms = 600000, grace_ms = 5000, life_ms = 3000, net_ms = 15000;
    const char *net_env = getenv("HVD_NET_TIMEOUT");
    if (net_env && *net_env && (net_ms = parse_secs(net_env)) <= 0)
        return bad_usage("bad HVD_NET_TIMEOUT %s", net_env);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--secret", 8) == 0 && strcmp(a, "--secret-file") != 0)
            return bad_usage("%s: the secret is never taken from the command line; set "
                             "HVD_SECRET or HVD_SECRET_FILE, or pass --secret-file",
                             a);
        static const char *const with_value[] = {"--driver",    "--index",         "--gpus",
                                                 "--host-hash", "--start-timeout", "--grace",
                                                 "--nics",      "--min-lifetime",  "--secret-file",
                                                 "--log-level", "--net-timeout"};
        size_t k = 0;
        while (k < sizeof with_value / sizeof *with_value && strcmp(a, with_value[k]) != 0)
            k++;
        if (k == sizeof with_value / sizeof *with_value) return bad_usage("unknown option %s", a);
        if (i + 1 >= argc) return bad_usage("%s needs a value", a);
        const char *v = argv[++i];
        int ms;
        switch (k) {
        case 0:
            driver = v;
            break;
        case 1:
            index_s = v;
            break;
        case 2:
            gpus_s = v;
            break;
        case 3:
            host_hash = v;
            break;
        case 4:
            if ((ms = parse_secs(v)) <= 0) return bad_usage("bad --start-timeout %s", v);
            start_ms = ms;
            break;
        case 5:
            if ((ms = parse_secs(v)) < 0) return bad_usage("bad --grace %s", v);
            grace_ms = ms > 0 ? ms : 1; /* 0 would mean the default */
            break;
        case 6:
            nics_s = v;
            break;
        case 7:
            if ((ms = parse_secs(v)) < 0) return bad_usage("bad --min-lifetime %s", v);
            life_ms = ms > 0 ? ms : -1; /* 0 would mean the default */
            break;
        case 8:
            secret_file = v;
            break;
        case 10:
            if ((ms = parse_secs(v)) <= 0) return bad_usage("bad --net-timeout %s", v);
            net_ms = ms;
            break;
        default:
            level_s = v;
            break;
        }
    }
    if (!index_s) return bad_usage("%s", "--index is required");
    char *end;
    errno = 0;
    unsigned long idx = strtoul(index_s, &end, 10);
    if (errno || end == index_s || *end || *index_s == '-' || idx > UINT32_MAX - 1)
        return bad_usage("bad --index %s", index_s);
    g_index = (uint32_t)idx;
    int level;
    if (strcmp(level_s, "error") == 0)
        level = HVD_LOG_ERROR;
    else if (strcmp(level_s, "warn") == 0)
        level = HVD_LOG_WARN;
    else if (strcmp(level_s, "info") == 0)
        level = HVD_LOG_INFO;
    else if (strcmp(level_s, "debug") == 0)
        level = HVD_LOG_DEBUG;
    else
        return bad_usage("bad --log-level %s: use error, warn, info or debug", level_s);
    if (!driver || !*driver)
        return bad_usage("%s", "no driver address: pass --driver or set HVD_DRIVER_ADDRS");
    hvd_err err;
    hvd_addr *addrs = NULL;
    size_t naddrs = 0;
    if (hvd_addrs_parse(driver, &addrs, &naddrs, &err) != 0)
        return bad_usage("bad driver addresses: %s", err.msg);
    hvd_task_config cfg = {.index = g_index,
                           .driver_addrs = addrs,
                           .n_driver_addrs = naddrs,
                           .host_hash = host_hash,
                           .start_timeout_ms = start_ms,
                           .grace_ms = grace_ms,
                           .min_lifetime_ms = life_ms,
                           .net_timeout_ms = net_ms,
                           .log = log_line,
                           .log_level = level};
    int rc = secret_file ? hvd_secret_read_file(&cfg.secret, secret_file, &err)
                         : hvd_secret_load_env(&cfg.secret, &err);
    if (rc != 0) {
        free(addrs);
        return bad_usage("no job secret: %s", err.msg);
    }
    char **gpus = gpus_s ? split_list(gpus_s) : NULL;
    char **nics = nics_s ? split_list(nics_s) : NULL;
    cfg.gpus = (const char *const *)gpus;
    cfg.nics = (const char *const *)nics;

    /* Signals are taken by one thread with sigwait; every thread created from here on
     * inherits the mask. The command's processes get default dispositions and no mask. */
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, signal_main, &set) != 0) {
        fprintf(stderr, "hvd-task[%u]: cannot start the signal thread\n", g_index);
        return EXIT_FAILED;
    }

    int status = EXIT_FAILED;
    hvd_task *t = hvd_task_start(&cfg, &err);
    hvd_secret_wipe(&cfg.secret);
    free(addrs);
    free_list(gpus);
    free_list(nics);
    if (!t) {
        fprintf(stderr, "hvd-task[%u]: %s\n", g_index, err.msg);
        return EXIT_FAILED;
    }
    pthread_mutex_lock(&g_lock);
    g_task = t;
    pthread_mutex_unlock(&g_lock);

    int code = 0;
    rc = hvd_task_run(t, &code, &err);
    pthread_mutex_lock(&g_lock);
    g_task = NULL;
    g_done = true;
    int sig = g_signal;
    pthread_mutex_unlock(&g_lock);
    if (rc == 0) {
        status = code;
    } else if (sig) {
        status = 128 + sig;
    } else {
        fprintf(stderr, "hvd-task[%u]: %s\n", g_index, err.msg);
    }
    hvd_task_stop(t);
    return status;
}
