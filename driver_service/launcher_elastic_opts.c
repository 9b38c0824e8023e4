/* hvd-driver's options for elastic jobs (Horovod's --min-np, --max-np,
 * --host-discovery-script, --slots, --reset-limit, --elastic-timeout,
 * --blacklist-cooldown-range), horovodrun's host flags (-H/--hosts, --hostfile, -p,
 * --network-interfaces, --output-filename) and its tunables (--fusion-threshold-mb, ...: the
 * ranks' HOROVOD_* variables), kept apart from launcher_opts.c, which calls in here for the
 * options it does not know. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hostspec.h"
#include "common/strv.h"
#include "launcher.h"

const char ELASTIC_USAGE[] =
    "\n"
    "Elastic jobs (docs/elastic.md; Horovod's flags). Ranks come and go: whenever the usable\n"
    "hosts change, the job is reset (mpirun ended and started again over the hosts there are,\n"
    "between --min-np and --max-np ranks) and the ranks resume from their last commit\n"
    "(hvd_elastic_commit, or hvd_bridge.torch.elastic). Each reset is one line.\n"
    "  --min-np N          fewest ranks (default -np); elastic when given (or --min-num-proc)\n"
    "  --max-np N          most ranks (default: every usable slot) (or --max-num-proc)\n"
    "  --host-discovery-script S\n"
    "                      run S every second; its lines host[:slots] are the usable hosts.\n"
    "                      With --local, the hosts it names are fake hosts started here;\n"
    "                      with --ssh, their task services are started over ssh (the\n"
    "                      --ssh-* options apply; horovodrun's way); else task services\n"
    "                      register themselves and the script says which hosts to use\n"
    "  --ssh               with --host-discovery-script: its hosts are ssh hosts\n"
    "  --slots K           slots of a discovered host that names none (default 1) (or\n"
    "                      --slots-per-host)\n"
    "  --reset-limit R     end the job after more than R resets (default: no limit)\n"
    "  --elastic-timeout T end the job when fewer than --min-np slots were usable for T\n"
    "                      seconds (default 600, or HOROVOD_ELASTIC_TIMEOUT)\n"
    "  --blacklist-cooldown-range MIN MAX\n"
    "                      a host whose rank failed is not used for MIN*2^k+U(0,MIN) seconds\n"
    "                      (its k-th time), at most MAX (default 10 3600)\n"
    "  -np N               with them: the ranks the first launch waits for (default\n"
    "                      --min-np); task services: with --local, max(-np, --max-np) of them\n"
    "\n"
    "horovodrun's host flags (a horovodrun command line runs as hvd-driver run):\n"
    "  -H, --hosts LIST    host:slots,...: ssh hosts, as --ssh-hosts; \"localhost:N\" (or this\n"
    "                      machine's name) runs N local task services, as --local 1 (and\n"
    "                      -p, -i are ignored: no ssh; run only)\n"
    "  --hostfile F        the hosts from F, one \"host slots=N\" per line\n"
    "  -p, --ssh-port P    as --ssh-port\n"
    "  --network-interfaces a,b  as --nics (or --network-interface)\n"
    "  --output-filename DIR     each rank's output in DIR/1/rank.R/stdout and stderr as\n"
    "                            well (Open MPI 5: in DIR/rank.<job id>.R.out and .err\n"
    "                            instead; MPICH: in DIR/1/rank.R instead); elastic jobs:\n"
    "                            launch E's under DIR/launch.E\n"
    "  --mpi-args \"A B\"    mpirun's extra words, split as a shell does (quotes kept\n"
    "                      together; nothing expanded), as --mpi-arg A --mpi-arg B\n"
    "  --disable-cache     accepted; hvd-driver caches no checks\n"
    "  --prefix-output-with-timestamp  mpirun's --timestamp-output (Open MPI)\n"
    "  horovodrun's other flags are ignored with a line when they ask for what hvd-bridge\n"
    "  does anyway (--stall-check, --no-autotune, --log-level L, ...), else refused saying\n"
    "  why (--gloo, --autotune, --hierarchical-allreduce, --config-file, -cb, ...)\n"
    "  COMMAND ARGS        the command may follow the options without --\n"
    "\n"
    "horovodrun's tunables: the HOROVOD_* variable each sets for every rank (docs/runtime.md)\n"
    "  --fusion-threshold-mb MB            HOROVOD_FUSION_THRESHOLD (bytes), default 128\n"
    "  --cycle-time-ms MS                  HOROVOD_CYCLE_TIME, default 1\n"
    "  --cache-capacity N                  HOROVOD_CACHE_CAPACITY, default 1024\n"
    "  --timeline-filename FILE            HOROVOD_TIMELINE (rank 0 writes it; made absolute)\n"
    "  --no-stall-check                    HOROVOD_STALL_CHECK_DISABLE=1\n"
    "  --stall-check-warning-time-seconds S    HOROVOD_STALL_CHECK_TIME_SECONDS, default 60\n"
    "  --stall-check-shutdown-time-seconds S   HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, default 0\n";

enum {
    OPT_MIN_NP = 2000,
    OPT_MAX_NP,
    OPT_DISCOVERY,
    OPT_SLOTS,
    OPT_RESET_LIMIT,
    OPT_ELASTIC_TIMEOUT,
    OPT_COOLDOWN,
    OPT_HOSTS,
    OPT_HOSTFILE,
    OPT_PORT,
    OPT_NETWORK_INTERFACES,
    OPT_OUTPUT_FILENAME,
    OPT_MPI_ARGS,
    OPT_SSH,
    OPT_DISABLE_CACHE,
    OPT_TUNABLE, /* OPT_TUNABLE + i: TUNABLES[i] */
};

/* horovodrun's tunables: each sets one variable of the runtime's (runtime/config.c) for every
 * rank. MB: a whole number of MiB given in bytes; NUM: a number of at most max; PATH: made
 * absolute (the ranks run in their task's directory); FLAG: no value, sets 1. */
typedef enum { TUNE_MB, TUNE_NUM, TUNE_PATH, TUNE_FLAG } tune_kind;
static const struct {
    const char *opt, *env;
    tune_kind kind;
    double max;
} TUNABLES[LAUNCH_TUNABLES] = {
    {"fusion-threshold-mb", "HOROVOD_FUSION_THRESHOLD", TUNE_MB, 1 << 20},
    {"cycle-time-ms", "HOROVOD_CYCLE_TIME", TUNE_NUM, 1e4},
    {"cache-capacity", "HOROVOD_CACHE_CAPACITY", TUNE_NUM, 1 << 20},
    {"timeline-filename", "HOROVOD_TIMELINE", TUNE_PATH, 0},
    {"no-stall-check", "HOROVOD_STALL_CHECK_DISABLE", TUNE_FLAG, 0},
    {"stall-check-warning-time-seconds", "HOROVOD_STALL_CHECK_TIME_SECONDS", TUNE_NUM, 1e6},
    {"stall-check-shutdown-time-seconds", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", TUNE_NUM, 1e6},
};

const struct option ELASTIC_LONG_OPTS[] = {
    {"min-np", required_argument, NULL, OPT_MIN_NP},
    {"min-num-proc", required_argument, NULL, OPT_MIN_NP},
    {"max-np", required_argument, NULL, OPT_MAX_NP},
    {"max-num-proc", required_argument, NULL, OPT_MAX_NP},
    {"host-discovery-script", required_argument, NULL, OPT_DISCOVERY},
    {"slots", required_argument, NULL, OPT_SLOTS},
    {"slots-per-host", required_argument, NULL, OPT_SLOTS},
    {"reset-limit", required_argument, NULL, OPT_RESET_LIMIT},
    {"elastic-timeout", required_argument, NULL, OPT_ELASTIC_TIMEOUT},
    {"blacklist-cooldown-range", required_argument, NULL, OPT_COOLDOWN},
    {"H", required_argument, NULL, OPT_HOSTS},
    {"hosts", required_argument, NULL, OPT_HOSTS},
    {"hostfile", required_argument, NULL, OPT_HOSTFILE},
    {"p", required_argument, NULL, OPT_PORT},
    {"network-interfaces", required_argument, NULL, OPT_NETWORK_INTERFACES},
    {"network-interface", required_argument, NULL, OPT_NETWORK_INTERFACES},
    {"output-filename", required_argument, NULL, OPT_OUTPUT_FILENAME},
    {"mpi-args", required_argument, NULL, OPT_MPI_ARGS},
    {"ssh", no_argument, NULL, OPT_SSH},
    {"disable-cache", no_argument, NULL, OPT_DISABLE_CACHE},
    {"fusion-threshold-mb", required_argument, NULL, OPT_TUNABLE + 0},
    {"cycle-time-ms", required_argument, NULL, OPT_TUNABLE + 1},
    {"cache-capacity", required_argument, NULL, OPT_TUNABLE + 2},
    {"timeline-filename", required_argument, NULL, OPT_TUNABLE + 3},
    {"no-stall-check", no_argument, NULL, OPT_TUNABLE + 4},
    {"stall-check-warning-time-seconds", required_argument, NULL, OPT_TUNABLE + 5},
    {"stall-check-shutdown-time-seconds", required_argument, NULL, OPT_TUNABLE + 6},
    {NULL, 0, NULL, 0},
};

int elastic_opts_defaults(launch_opts *o) {
    o->reset_limit = -1;
    o->elastic_timeout_s = HVD_ELASTIC_TIMEOUT_DEFAULT_S;
    o->cooldown_min_s = HVD_BLACKLIST_COOLDOWN_MIN_S;
    o->cooldown_max_s = HVD_BLACKLIST_COOLDOWN_MAX_S;
    const char *t = getenv(HVD_ELASTIC_TIMEOUT_ENV);
    if (t && *t)
        return launch_opts_number(HVD_ELASTIC_TIMEOUT_ENV, t, 1, 1 << 30, &o->elastic_timeout_s);
    return 0;
}

/* --blacklist-cooldown-range MIN MAX: MAX is the next word (Horovod takes two values). */
static int cooldown(const char *v, int argc, char **argv, launch_opts *o) {
    if (optind >= argc) return launch_opts_usage_error("--blacklist-cooldown-range needs MIN MAX");
    const char *max = argv[optind++];
    if (launch_opts_number("--blacklist-cooldown-range MIN", v, 1, 3600, &o->cooldown_min_s) ||
        launch_opts_number("--blacklist-cooldown-range MAX", max, 1, 3600, &o->cooldown_max_s))
        return 2;
    if (o->cooldown_max_s < o->cooldown_min_s)
        return launch_opts_usage_error("--blacklist-cooldown-range needs MIN <= MAX");
    return 0;
}

/* path made absolute against the current directory (malloc'd), or NULL. */
static char *absolute(const char *path) {
    if (path[0] == '/') return strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return NULL;
    size_t n = strlen(cwd) + strlen(path) + 2;
    char *abs = malloc(n);
    if (abs) snprintf(abs, n, "%s/%s", cwd, path);
    return abs;
}

/* "NAME=..." printf-style, malloc'd; NULL on out of memory. */
static char *env_entry(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *env_entry(const char *fmt, ...) {
    char buf[PATH_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return strdup(buf);
}

/* A tunable's value, checked, as its HOROVOD_* variable in o->tunables (a repeated flag: the
 * last one). Returns 0, or the exit status. */
static int tunable(int i, const char *v, launch_opts *o) {
    char opt[64], *entry = NULL;
    snprintf(opt, sizeof opt, "--%s", TUNABLES[i].opt);
    if (TUNABLES[i].kind == TUNE_MB) {
        int mb;
        if (launch_opts_number(opt, v, 0, (int)TUNABLES[i].max, &mb)) return 2;
        entry = env_entry("%s=%lld", TUNABLES[i].env, (long long)mb << 20);
    } else if (TUNABLES[i].kind == TUNE_NUM) {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= 0 && x <= TUNABLES[i].max)) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s must be a number between 0 and %g, not \"%.40s\"", opt,
                     TUNABLES[i].max, v);
            return launch_opts_usage_error(msg);
        }
        entry = env_entry("%s=%s", TUNABLES[i].env, v);
    } else if (TUNABLES[i].kind == TUNE_PATH) {
        char *abs = *v ? absolute(v) : NULL;
        if (!*v) return launch_opts_usage_error("--timeline-filename needs a file name");
        entry = abs ? env_entry("%s=%s", TUNABLES[i].env, abs) : NULL;
        free(abs);
    } else {
        entry = env_entry("%s=1", TUNABLES[i].env);
    }
    if (!entry) return launch_opts_usage_error("out of memory");
    free(o->tunables[i]);
    o->tunables[i] = entry;
    return 0;
}

/* --mpi-args "A B": its words, split as a shell does, as mpirun's extra words. */
static int mpi_words(const char *v, launch_opts *o) {
    const char *why;
    char **words = hvd_strv_split_shell(v, &why); /* horovodrun's go through a shell */
    if (!words && why) {
        char msg[HVD_ERR_MAX];
        snprintf(msg, sizeof msg, "--mpi-args '%.200s' has %s", v, why);
        return launch_opts_usage_error(msg);
    }
    if (!words) return launch_opts_usage_error("out of memory");
    for (size_t i = 0; words[i]; i++)
        hvd_strb_add(&o->mpi_argb, words[i]);
    hvd_strv_free(words);
    return 0;
}

int elastic_opts_take(int c, const char *v, int argc, char **argv, launch_opts *o) {
    if (c >= OPT_TUNABLE && c < OPT_TUNABLE + LAUNCH_TUNABLES && TUNABLES[c - OPT_TUNABLE].opt)
        return tunable(c - OPT_TUNABLE, v, o);
    switch (c) {
    case OPT_MIN_NP:
        o->elastic = true;
        return launch_opts_number("--min-np", v, 1, 1 << 20, &o->min_np);
    case OPT_MAX_NP:
        o->elastic = true;
        return launch_opts_number("--max-np", v, 1, 1 << 20, &o->max_np);
    case OPT_DISCOVERY:
        o->elastic = true;
        o->discovery_script = v;
        return 0;
    case OPT_SLOTS:
        return launch_opts_number("--slots", v, 1, 1 << 20, &o->slots);
    case OPT_RESET_LIMIT:
        return launch_opts_number("--reset-limit", v, 0, 1 << 30, &o->reset_limit);
    case OPT_ELASTIC_TIMEOUT:
        return launch_opts_number("--elastic-timeout", v, 1, 1 << 30, &o->elastic_timeout_s);
    case OPT_COOLDOWN:
        return cooldown(v, argc, argv, o);
    case OPT_HOSTS:
        o->hosts = v;
        return 0;
    case OPT_HOSTFILE:
        o->hostfile = v;
        return 0;
    case OPT_PORT:
        return launch_opts_number("-p", v, 1, 65535, &o->ssh_port);
    case OPT_NETWORK_INTERFACES:
        o->nics = v;
        return 0;
    case OPT_OUTPUT_FILENAME:
        o->output_dir = v;
        return 0;
    case OPT_MPI_ARGS:
        return mpi_words(v, o);
    case OPT_SSH:
        o->ssh_discovered = true;
        return 0;
    case OPT_DISABLE_CACHE: /* horovodrun caches its ssh and interface checks; nothing here */
        return 0;
    default: /* an option in a table without a case */
        return launch_opts_usage_error("an option is not handled (a bug in hvd-driver)");
    }
}

/* ---- horovodrun's hosts ---------------------------------------------------------------------- */

/* Horovod's hostfile: "host slots=N" per line (# comments), as "host:N,...". */
static int read_hostfile(launch_opts *o) {
    hvd_err err;
    if (hvd_hostfile_read(o->hostfile, &o->hosts_buf, &err) != 0)
        return launch_opts_usage_error(err.msg);
    o->hosts = o->hosts_buf;
    return 0;
}

/* Whether name is this machine. */
static bool is_this_machine(const char *name) {
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    return !strcmp(name, "localhost") || !strcmp(name, "127.0.0.1") || !strcmp(name, me);
}

/* -H localhost:N (or this machine's name): N local task services; else ssh hosts. */
static int take_hosts(launch_opts *o) {
    if (o->hostfile && o->hosts)
        return launch_opts_usage_error("give -H/--hosts or --hostfile, not both");
    if (o->hostfile && read_hostfile(o) != 0) return 2;
    if (!o->hosts) return 0;
    if (o->ssh_hosts || o->local_hosts)
        return launch_opts_usage_error("-H/--hosts excludes --ssh-hosts and --local");
    hvd_hostspec hs;
    hvd_err err;
    if (!strchr(o->hosts, ',') &&
        hvd_hostspec_parse(o->hosts, strlen(o->hosts), "slots", 1, 1 << 20, &hs, &err) == 0 &&
        is_this_machine(hs.host)) {
        /* horovodrun uses no ssh for this machine: its -p and -i have nothing to do */
        o->ssh_port = 0;
        o->ssh_identity = NULL;
        o->local_hosts = 1;
        if (o->np == 0) o->np = hs.number > 0 ? (int)hs.number : 1;
        long slots = hs.number > 0 ? hs.number : 1; /* "localhost": one slot, as for ssh */
        if (o->np > slots) {
            char msg[160];
            snprintf(msg, sizeof msg, "-np %d is more than the %ld slots of -H %s", o->np, slots,
                     o->hosts);
            return launch_opts_usage_error(msg);
        }
        return 0;
    }
    o->ssh_hosts = o->hosts;
    return 0;
}

/* --output-filename DIR, absolute (mpirun runs in another directory than the user typed it
 * in): hvd_launch_config.output_dir, or hvd_elastic_config's (a directory per launch). */
static int take_output(launch_opts *o) {
    if (!o->output_dir) return 0;
    if (!(o->output_arg = absolute(o->output_dir)))
        return launch_opts_usage_error("cannot make --output-filename an absolute path");
    return 0;
}

/* The tunables given, in the table's order, as the ranks' environment. */
static void take_tunables(launch_opts *o) {
    for (size_t i = 0; i < LAUNCH_TUNABLES; i++)
        if (o->tunables[i]) hvd_strb_add(&o->rank_envb, o->tunables[i]);
}

/* ---- elastic ----------------------------------------------------------------------------- */

static int check_elastic(launch_opts *o) {
    if (!o->elastic) {
        if (o->max_np || o->slots || o->reset_limit >= 0)
            return launch_opts_usage_error(
                "--max-np, --slots and --reset-limit go with --min-np or --host-discovery-script");
        return 0;
    }
    if (o->serve) return launch_opts_usage_error("serve runs no elastic jobs: use run");
    if (o->min_np == 0) o->min_np = o->np;
    if (o->min_np == 0) return launch_opts_usage_error("an elastic job needs -np N or --min-np N");
    if (o->np == 0) o->np = o->min_np;
    if (o->max_np && (o->max_np < o->min_np || o->max_np < o->np))
        return launch_opts_usage_error("--max-np must be at least --min-np and -np");
    if (o->np < o->min_np) return launch_opts_usage_error("-np must be at least --min-np");
    if (o->discovery_script && o->ssh_hosts)
        return launch_opts_usage_error(
            "give the hosts with -H/--hostfile/--ssh-hosts or with --host-discovery-script, not "
            "both (--ssh starts task services over ssh on the hosts the script names)");
    if (o->ssh_discovered && (!o->discovery_script || o->local_hosts))
        return launch_opts_usage_error("--ssh goes with --host-discovery-script, without --local");
    return 0;
}

int elastic_opts_finish(launch_opts *o) {
    int rc = take_hosts(o);
    if (rc == 0) rc = take_output(o);
    if (rc == 0) take_tunables(o);
    if (rc == 0) rc = check_elastic(o);
    return rc;
}

int launch_task_slots(const launch_opts *o) {
    if (!o->elastic) return o->np;
    if ((o->local_hosts || o->ssh_discovered) && o->discovery_script)
        return HVD_ELASTIC_LOCAL_TASKS_MAX;
    return o->max_np > o->np ? o->max_np : o->np;
}

void elastic_opts_free(launch_opts *o) {
    free(o->hosts_buf);
    free(o->output_arg);
    o->hosts_buf = o->output_arg = NULL;
    for (size_t i = 0; i < LAUNCH_TUNABLES; i++) {
        free(o->tunables[i]);
        o->tunables[i] = NULL;
    }
}
