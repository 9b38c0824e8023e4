/* Task services on plain hosts, started over ssh, for `hvd-driver run --ssh-hosts h1:2,h2:2`.
 *
 * One ssh session per host (libssh2, ssh/include/ssh/transport.h), run by a thread per host,
 * starts that host's hvd-task processes (one per slot; indices host by host, in the order of
 * the list) and stays attached: their log lines come back on our stderr, and the session ends
 * when they do. From then on the job runs as on executors: the tasks register, mpirun reaches
 * them through hvd-rsh over RPC, hvd-exec runs the ranks.
 *
 * The remote command (run by /bin/sh on the host; the login shell only execs it):
 *
 *   IFS= read -r HVD_SECRET; export HVD_SECRET          <- first line of the session's stdin
 *   HVD_SSH_JOB=<token>; export HVD_SSH_JOB              <- marks every process of the job
 *   d=${TMPDIR:-/tmp}/hvd-ssh.<token>.<k>; mkdir -m 700 "$d"; TMPDIR=$d; export TMPDIR
 *   [--ssh-fake-hosts: OMPI_MCA_btl_vader_backing_directory=$d]
 *   mkdir "$d/task<i>" ...
 *   (cd <driver's cwd> || cd "$d/task<i>" && exec <bin>/hvd-task --driver <addrs> --index <i>
 *    ...) &  per task
 *   wait for each; rm -rf "$d"; exit with the first failure
 *
 * The secret never appears on a command line: it travels in the session's stdin. TMPDIR is a
 * private directory per host and job (Open MPI's session directories land there), and each
 * task gets a work directory in it.
 *
 * Stopping: after the driver told the tasks to shut down, the sessions normally end by
 * themselves. Those still running after the grace period are interrupted: a second channel
 * sends SIGTERM to the session's process group (the shell and its hvd-tasks; each hvd-task
 * takes its command's processes down with it), then the session is closed. Last, a short
 * "sweep" session per host SIGKILLs any process whose environment still holds
 * HVD_SSH_JOB=<token> (found through /proc) and removes the job's directory. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/hostspec.h"
#include "common/io.h"
#include "common/sig.h"
#include "hvd/net.h"
#include "hvd/proto.h"
#include "launcher.h"
#include "ssh/transport.h"

#define SSH_CONNECT_TIMEOUT_MS 15000 /* per setup step, capped by --start-timeout */
#define SSH_STOP_GRACE_MS      8000  /* interrupted session: wait this long for its status */
#define SWEEP_TIMEOUT_MS       5000  /* per setup step of the sweep session */
#define HOST_HASH_MAX          127   /* hvd-task's limit for --host-hash */
#define SSH_DISCOVERED_MAX     256   /* sessions of an elastic job's discovered hosts */

/* One entry of --ssh-hosts and its session. */
typedef struct ssh_host {
    char name[256]; /* host name or address to connect to */
    char user[64];  /* from user@host, or "" */
    int slots;      /* from host:slots (default 1) */
    int first_task; /* index of its first task */
    int ntasks;     /* tasks started there (<= slots; 0: none, no session) */
    char hash[160]; /* --ssh-fake-hosts: its host hash; else "" (hvd-task computes it) */
    char *command;  /* the remote command */
    pthread_t thread;
    bool has_thread;
    int started;   /* the session's command runs (hvd_ssh_options.started) */
    int ended;     /* the session ended (atomic) */
    int rc;        /* hvd_ssh_run's return value */
    int exit_code; /* the remote exit status (255: ssh failed) */
    hvd_err err;   /* hvd_ssh_run's error */
    bool reported; /* its end was the reason given to hvd_driver_abort */
    int swept;     /* processes the sweep killed, or -1 if it failed */
    struct ssh_tasks *owner;
} ssh_host;

struct ssh_tasks {
    const launch_opts *o;
    hvd_driver *d;
    ssh_host *hosts;
    size_t nhosts; /* in use (atomic: the watcher reads it while hosts are added) */
    size_t cap;    /* room in hosts (never moved: sessions point into it) */
    const char *driver_addrs;
    char token[17];         /* random job mark, hex */
    char bin_dir[PATH_MAX]; /* where hvd-task is on the hosts */
    char secret_line[64];   /* base64 secret + '\n', the sessions' stdin */
    char *warm_python;      /* $HVD_WARM_PYTHON and $HVD_WARM_IMPORTS of the driver, passed */
    char *warm_imports;     /* on to the hosts' hvd-tasks (NULL: not set) */
    char *cwd;              /* the driver's working directory: the ranks' where it exists */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running;      /* sessions not yet ended */
    bool stopping;    /* ssh_tasks_stop began: session ends are expected */
    int intr_pipe[2]; /* the interrupt of every session: written by ssh_tasks_interrupt, never
                         read (hvd_ssh_run polls it, level-triggered) */
};

/* ---- text ------------------------------------------------------------------------------- */

/* A growing string; on out of memory it stays NULL-safe and sets oom. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* Appends s as one POSIX shell word: '...', with each ' written as '\''. */
static void sb_quote(sbuf *b, const char *s) {
    sb_add(b, "'");
    for (const char *q; (q = strchr(s, '\'')) != NULL; s = q + 1)
        sb_add(b, "%.*s'\\''", (int)(q - s), s);
    sb_add(b, "%s'", s);
}

/* "exec /bin/sh -c '<script>'": the login shell (whatever it is) only starts a POSIX shell. */
static char *sh_command(sbuf *script) {
    if (script->oom) {
        free(script->p);
        return NULL;
    }
    sbuf cmd = {0};
    sb_add(&cmd, "exec /bin/sh -c ");
    sb_quote(&cmd, script->p);
    free(script->p);
    if (cmd.oom) {
        free(cmd.p);
        return NULL;
    }
    return cmd.p;
}

/* ---- the host list ---------------------------------------------------------------------- */

/* Parses "[user@]host[:slots],..." (an IPv6 address as [addr][:slots]). Returns the count, or
 * -1 with err. */
static int parse_hosts(const char *list, ssh_host **out, hvd_err *err) {
    *out = NULL;
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    ssh_host *hosts = calloc(n, sizeof *hosts);
    if (!hosts) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    int k = 0;
    for (const char *e = list; *e; e += *e == ',') {
        size_t len = strcspn(e, ",");
        if (len == 0) continue;
        hvd_hostspec hs;
        if (hvd_hostspec_parse(e, len, "slots", 1, HVD_HOST_MAX_SLOTS, &hs, err) != 0 ||
            strlen(hs.user) >= sizeof hosts[k].user || strlen(hs.host) >= sizeof hosts[k].name) {
            if (err && !err->msg[0]) hvd_err_set(err, HVD_E_INVALID, "host name too long");
            hvd_err_prefix(err, "--ssh-hosts: ");
            free(hosts);
            return -1;
        }
        snprintf(hosts[k].user, sizeof hosts[k].user, "%s", hs.user);
        snprintf(hosts[k].name, sizeof hosts[k].name, "%s", hs.host);
        hosts[k].slots = hs.number > 0 ? (int)hs.number : 1;
        k++;
        e += len;
    }
    if (k == 0) {
        free(hosts);
        return hvd_err_set(err, HVD_E_INVALID, "--ssh-hosts names no host");
    }
    *out = hosts;
    return k;
}

/* Gives tasks 0..np-1 to the hosts in order, filling each host's slots. */
static int assign_tasks(ssh_host *hosts, int n, int np, hvd_err *err) {
    int total = 0, task = 0;
    for (int i = 0; i < n; i++)
        total += hosts[i].slots;
    if (np > total)
        return hvd_err_set(err, HVD_E_INVALID,
                           "-np %d is more than the %d slots of --ssh-hosts (one task per slot)",
                           np, total);
    for (int i = 0; i < n; i++) {
        int k = np - task < hosts[i].slots ? np - task : hosts[i].slots;
        hosts[i].first_task = task;
        hosts[i].ntasks = k;
        task += k;
    }
    return 0;
}

int ssh_hosts_check(launch_opts *o, hvd_err *err) {
    ssh_host *hosts;
    int n = parse_hosts(o->ssh_hosts, &hosts, err);
    if (n < 0) return -1;
    if (o->np == 0)
        for (int i = 0; i < n; i++)
            o->np += hosts[i].slots;
    int rc = assign_tasks(hosts, n, o->np, err);
    free(hosts);
    return rc;
}

/* Whether c may stand in a host hash as it is ([A-Za-z0-9_]; '-' separates). */
static bool hash_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* --ssh-fake-hosts: a host hash from the entry's position and name ("hvdssh001-127-0-0-3"):
 * distinct per entry, never resolvable, only [A-Za-z0-9_-], and sorted like the list (the
 * driver sorts host hashes for mpirun's -H, so that rank r stays task r). */
static void fake_hash(ssh_host *h, int k) {
    int n = snprintf(h->hash, sizeof h->hash, "hvdssh%03d-", k);
    for (const char *p = h->name; *p && n < HOST_HASH_MAX; p++, n++)
        h->hash[n] = hash_char(*p) ? *p : '-';
    h->hash[n] = '\0';
}

/* ---- remote commands -------------------------------------------------------------------- */

/* A task service started over ssh inherits nothing of the driver's environment: the warm
 * interpreter's settings (docs/elastic.md, "Warm Python ranks") go on its command line. */
static void add_warm_options(sbuf *s, const ssh_tasks *st) {
    if (st->warm_python) {
        sb_add(s, " --warm-python ");
        sb_quote(s, st->warm_python);
    }
    if (st->warm_python && st->warm_imports) {
        sb_add(s, " --warm-imports ");
        sb_quote(s, st->warm_imports);
    }
}

static char *launch_command(const ssh_tasks *st, const ssh_host *h, int k,
                            const char *driver_addrs) {
    const launch_opts *o = st->o;
    sbuf s = {0};
    sb_add(&s, "IFS= read -r HVD_SECRET || { echo 'hvd-driver: no job secret on stdin' >&2; "
               "exit 2; }; export HVD_SECRET; ");
    sbuf bin = {0};
    sb_add(&bin, "%s/hvd-task", st->bin_dir);
    sb_add(&s, "b=");
    sb_quote(&s, bin.oom ? "" : bin.p);
    free(bin.p);
    s.oom = s.oom || bin.oom;
    sb_add(&s, "; [ -x \"$b\" ] || { echo \"hvd-driver: $b is missing on $(uname -n) (see "
               "--ssh-bin-dir)\" >&2; exit 127; }; ");
    sb_add(&s, "HVD_SSH_JOB=%s; export HVD_SSH_JOB; ", st->token);
    sb_add(&s, "d=\"${TMPDIR:-/tmp}/hvd-ssh.%s.%d\"; mkdir -m 700 \"$d\" || exit 1; ", st->token,
           k);
    sb_add(&s, "TMPDIR=$d; export TMPDIR; ");
    if (o->ssh_fake_hosts)
        sb_add(&s, "OMPI_MCA_btl_vader_backing_directory=$d; "
                   "export OMPI_MCA_btl_vader_backing_directory; ");
    sb_add(&s, "mkdir -m 700");
    for (int t = h->first_task; t < h->first_task + h->ntasks; t++)
        sb_add(&s, " \"$d/task%d\"", t);
    sb_add(&s, " || exit 1; pids=; ");
    for (int t = h->first_task; t < h->first_task + h->ntasks; t++) {
        /* In the driver's directory where the host has it, as mpirun and horovodrun start
         * remote ranks; else in the task's own. */
        sb_add(&s, "(");
        if (st->cwd) {
            sb_add(&s, "cd ");
            sb_quote(&s, st->cwd);
            sb_add(&s, " 2>/dev/null || ");
        }
        sb_add(&s, "cd \"$d/task%d\" && exec \"$b\" --driver ", t);
        sb_quote(&s, driver_addrs);
        sb_add(&s, " --index %d --start-timeout %d --net-timeout %d --log-level %s", t,
               o->start_timeout_s, o->net_timeout_s, o->verbose ? "info" : "warn");
        if (h->hash[0]) sb_add(&s, " --host-hash %s", h->hash);
        if (o->many_commands) sb_add(&s, " --elastic");
        add_warm_options(&s, st);
        sb_add(&s, ") & pids=\"$pids $!\"; ");
    }
    sb_add(&s, "rc=0; for p in $pids; do wait \"$p\" || { r=$?; [ \"$rc\" -ne 0 ] || rc=$r; }; "
               "done; rm -rf \"$d\"; exit $rc");
    return sh_command(&s);
}

/* SIGKILLs every process of the job left on the host (found by HVD_SSH_JOB in /proc) and
 * removes the job's directory; exits with the number killed (at most 200). */
static char *sweep_command(const ssh_tasks *st, int k) {
    sbuf s = {0};
    sb_add(&s,
           "n=0; for e in $(grep -lsxz 'HVD_SSH_JOB=%s' /proc/[0-9]*/environ 2>/dev/null); do "
           "p=${e#/proc/}; p=${p%%/environ}; kill -KILL \"$p\" 2>/dev/null && n=$((n+1)); "
           "done; rm -rf \"${TMPDIR:-/tmp}/hvd-ssh.%s.%d\"; [ $n -le 200 ] || n=200; exit $n",
           st->token, st->token, k);
    return sh_command(&s);
}

static void base_options(const ssh_tasks *st, const ssh_host *h, hvd_ssh_options *opt) {
    const launch_opts *o = st->o;
    hvd_ssh_options_init(opt);
    opt->host = h->name;
    opt->port = o->ssh_port;
    opt->user = h->user[0] ? h->user : o->ssh_user;
    if (o->ssh_identity) {
        opt->identity_files = &o->ssh_identity;
        opt->n_identity_files = 1;
    }
    if (o->ssh_known_hosts) {
        opt->user_known_hosts = &o->ssh_known_hosts;
        opt->n_user_known_hosts = 1;
    }
    opt->accept_new_host_keys = o->ssh_accept_new;
}

/* ---- sessions --------------------------------------------------------------------------- */

static void *session_main(void *arg) {
    ssh_host *h = arg;
    ssh_tasks *st = h->owner;
    hvd_ssh_options opt;
    base_options(st, h, &opt);
    int start_s = st->o->start_timeout_s;
    opt.connect_timeout_ms =
        start_s < SSH_CONNECT_TIMEOUT_MS / 1000 ? start_s * 1000 : SSH_CONNECT_TIMEOUT_MS;
    opt.stdin_data = st->secret_line;
    opt.stdin_len = strlen(st->secret_line);
    opt.started = &h->started;
    opt.interrupt_kill_exec = true; /* libssh2 1.10 cannot send signal requests */
    opt.interrupt_grace_ms = SSH_STOP_GRACE_MS;
    int code = HVD_SSH_EXIT_FAILURE;
    hvd_err err = {0};
    int rc =
        hvd_ssh_run(&opt, h->command, STDOUT_FILENO, STDERR_FILENO, st->intr_pipe[0], &code, &err);

    pthread_mutex_lock(&st->mu);
    h->rc = rc;
    h->exit_code = code;
    h->err = err;
    st->running--;
    bool expected = st->stopping;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    __atomic_store_n(&h->ended, 1, __ATOMIC_RELEASE);
    if (expected) return NULL;
    if (st->o->elastic) { /* a host going: the elastic loop resets without it */
        fprintf(stderr, "hvd-driver: ssh host %s (tasks %d-%d): %s%s; the job goes on without it\n",
                h->name, h->first_task, h->first_task + h->ntasks - 1,
                rc != 0 ? "" : "its task services ended", rc != 0 ? err.msg : "");
        return NULL;
    }

    /* An end before ssh_tasks_stop: fatal while the job starts (the reason goes to
     * hvd_driver_wait_registration), harmless once the tasks ran their part. */
    char why[HVD_ERR_MAX + 300];
    int sig = hvd_signals_first();
    int last = h->first_task + h->ntasks - 1;
    if (sig)
        snprintf(why, sizeof why, "interrupted by %s",
                 sig == SIGINT    ? "SIGINT"
                 : sig == SIGTERM ? "SIGTERM"
                                  : "SIGHUP");
    else if (rc != 0)
        snprintf(why, sizeof why, "ssh host %s (tasks %d-%d): %s", h->name, h->first_task, last,
                 err.msg);
    else
        snprintf(why, sizeof why,
                 "ssh host %s: its task services (tasks %d-%d) ended with status %d before the "
                 "job was done (their messages are above%s)",
                 h->name, h->first_task, last, code,
                 code == 126 || code == 127 ? "; is hvd-task there? see --ssh-bin-dir" : "");
    h->reported = true;
    hvd_driver_abort(st->d, why);
    if (rc != 0 && !sig && __atomic_load_n(&h->started, __ATOMIC_ACQUIRE))
        fprintf(stderr, "hvd-driver: lost the ssh session of host %s: %s\n", h->name, err.msg);
    return NULL;
}

static void *sweep_main(void *arg) {
    ssh_host *h = arg;
    ssh_tasks *st = h->owner;
    hvd_ssh_options opt;
    base_options(st, h, &opt);
    opt.connect_timeout_ms = SWEEP_TIMEOUT_MS;
    opt.quiet = true;
    char *cmd = sweep_command(st, (int)(h - st->hosts));
    int code = HVD_SSH_EXIT_FAILURE;
    hvd_err err = {0};
    h->swept = -1;
    if (cmd && hvd_ssh_run(&opt, cmd, -1, STDERR_FILENO, -1, &code, &err) == 0) h->swept = code;
    if (!cmd) snprintf(err.msg, sizeof err.msg, "out of memory");
    if (h->swept < 0)
        fprintf(stderr,
                "hvd-driver: warning: could not check host %s for processes left by the job: "
                "%s\n",
                h->name, err.msg);
    else if (h->swept > 0)
        fprintf(stderr, "hvd-driver: warning: killed %d leftover process%s of the job on %s\n",
                h->swept, h->swept == 1 ? "" : "es", h->name);
    free(cmd);
    return NULL;
}

/* Starts fn(h) on a thread that takes no signals (the handlers belong to the main thread). */
static int start_thread(pthread_t *t, void *(*fn)(void *), ssh_host *h) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

size_t ssh_tasks_starting(ssh_tasks *st, char *buf, size_t cap) {
    size_t n = 0, used = 0;
    if (cap) buf[0] = '\0';
    size_t nhosts = st ? __atomic_load_n(&st->nhosts, __ATOMIC_ACQUIRE) : 0;
    for (size_t i = 0; i < nhosts; i++) {
        const ssh_host *h = &st->hosts[i];
        if (h->ntasks == 0 || __atomic_load_n(&h->started, __ATOMIC_ACQUIRE)) continue;
        int w = snprintf(buf + used, cap > used ? cap - used : 0, "%s%s (tasks %d-%d)",
                         n ? ", " : "", h->name, h->first_task, h->first_task + h->ntasks - 1);
        if (w > 0 && used + (size_t)w < cap) used += (size_t)w;
        n++;
    }
    return n;
}

void ssh_tasks_interrupt(ssh_tasks *st) {
    (void)!write(st->intr_pipe[1], "x", 1);
}

static void free_tasks(ssh_tasks *st) {
    for (size_t i = 0; i < st->nhosts; i++)
        free(st->hosts[i].command);
    free(st->hosts);
    hvd_close_fd(&st->intr_pipe[0]);
    hvd_close_fd(&st->intr_pipe[1]);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    memset(st->secret_line, 0, sizeof st->secret_line);
    free(st->warm_python);
    free(st->warm_imports);
    free(st->cwd);
    free(st);
}

/* The value of NAME in a "NAME=VALUE" vector, or NULL. */
static const char *job_var(char *const *env, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (!strncmp(env[i], name, n) && env[i][n] == '=') return env[i] + n + 1;
    return NULL;
}

/* The handle without hosts: the job's secret and token, where hvd-task is. NULL with err. */
static ssh_tasks *tasks_new(const launch_opts *o, hvd_driver *d, char *const *job_env,
                            hvd_err *err) {
    const char *secret = job_var(job_env, HVD_SECRET_ENV);
    const char *driver_addrs = job_var(job_env, HVD_DRIVER_ADDRS_ENV);
    if (!secret || !*secret || strlen(secret) > 60 || !driver_addrs) {
        hvd_err_set(err, HVD_E_INTERNAL, "no job secret or driver addresses to pass on");
        return NULL;
    }
    ssh_tasks *st = calloc(1, sizeof *st);
    if (!st) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    if (pipe2(st->intr_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        hvd_err_set(err, HVD_E_IO, "pipe: %s", strerror(errno));
        free(st);
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->o = o;
    st->d = d;
    st->driver_addrs = driver_addrs;
    snprintf(st->secret_line, sizeof st->secret_line, "%s\n", secret);
    snprintf(st->bin_dir, sizeof st->bin_dir, "%s",
             o->ssh_bin_dir ? o->ssh_bin_dir : hvd_launch_bin_dir());
    const char *warm = getenv(HVD_WARM_PYTHON_ENV), *imports = getenv(HVD_WARM_IMPORTS_ENV);
    st->cwd = getcwd(NULL, 0); /* NULL (removed, too long): the task directories */
    if ((warm && *warm && !(st->warm_python = strdup(warm))) ||
        (imports && !(st->warm_imports = strdup(imports)))) { /* "": import nothing */
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        free_tasks(st);
        return NULL;
    }
    uint8_t rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        hvd_err_set(err, HVD_E_INTERNAL, "getrandom: %s", strerror(errno));
        free_tasks(st);
        return NULL;
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(st->token + 2 * i, 3, "%02x", rnd[i]);
    return st;
}

/* Starts the session of host h (its command made). Returns 0, or -1 with err. */
static int start_session(ssh_tasks *st, ssh_host *h, hvd_err *err) {
    if (st->o->verbose)
        fprintf(stderr, "hvd-driver: ssh %s: starting tasks %d-%d%s%s\n", h->name, h->first_task,
                h->first_task + h->ntasks - 1, h->hash[0] ? " as " : "", h->hash);
    pthread_mutex_lock(&st->mu);
    st->running++;
    pthread_mutex_unlock(&st->mu);
    int rc = start_thread(&h->thread, session_main, h);
    if (rc != 0) {
        pthread_mutex_lock(&st->mu);
        st->running--;
        pthread_mutex_unlock(&st->mu);
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot start a thread: %s", strerror(rc));
    }
    h->has_thread = true;
    return 0;
}

ssh_tasks *ssh_tasks_start(const launch_opts *o, hvd_driver *d, char *const *job_env,
                           hvd_err *err) {
    ssh_tasks *st = tasks_new(o, d, job_env, err);
    if (!st) return NULL;
    int n = parse_hosts(o->ssh_hosts, &st->hosts, err);
    if (n < 0 || assign_tasks(st->hosts, n, o->np, err) != 0) {
        free_tasks(st);
        return NULL;
    }
    st->nhosts = st->cap = (size_t)n;
    for (size_t i = 0; i < st->nhosts; i++) {
        ssh_host *h = &st->hosts[i];
        h->owner = st;
        if (h->ntasks == 0) continue;
        if (o->ssh_fake_hosts) fake_hash(h, (int)i);
        if (!(h->command = launch_command(st, h, (int)i, st->driver_addrs))) {
            hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
            free_tasks(st);
            return NULL;
        }
    }
    for (size_t i = 0; i < st->nhosts; i++) {
        ssh_host *h = &st->hosts[i];
        if (h->ntasks > 0 && start_session(st, h, err) != 0) {
            ssh_tasks_stop(st, 0);
            return NULL;
        }
    }
    return st;
}

ssh_tasks *ssh_tasks_open(const launch_opts *o, hvd_driver *d, char *const *job_env, hvd_err *err) {
    ssh_tasks *st = tasks_new(o, d, job_env, err);
    if (st && !(st->hosts = calloc(SSH_DISCOVERED_MAX, sizeof *st->hosts))) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        free_tasks(st);
        return NULL;
    }
    if (st) st->cap = SSH_DISCOVERED_MAX;
    return st;
}

/* A discovered host's host hash: its name with every character but [A-Za-z0-9_-] made '-'
 * (el_host_matches matches the name with it), cut at HOST_HASH_MAX. */
static void discovered_hash(ssh_host *h) {
    size_t n = 0;
    for (const char *p = h->name; *p && n < HOST_HASH_MAX; p++)
        h->hash[n++] = hash_char(*p) ? *p : '-';
    h->hash[n] = '\0';
}

int ssh_tasks_add_host(ssh_tasks *st, const char *name, int first, int n, hvd_err *err) {
    if (st->nhosts == st->cap)
        return hvd_err_set(err, HVD_E_INVALID, "more than %zu discovered hosts", st->cap);
    ssh_host *h = &st->hosts[st->nhosts];
    memset(h, 0, sizeof *h);
    hvd_hostspec hs;
    if (hvd_hostspec_parse(name, strlen(name), "slots", 1, HVD_HOST_MAX_SLOTS, &hs, err) != 0 ||
        strlen(hs.user) >= sizeof h->user || strlen(hs.host) >= sizeof h->name || !hs.host[0])
        return err->msg[0] ? -1 : hvd_err_set(err, HVD_E_INVALID, "host name too long");
    snprintf(h->user, sizeof h->user, "%s", hs.user);
    snprintf(h->name, sizeof h->name, "%s", hs.host);
    h->slots = h->ntasks = n;
    h->first_task = first;
    h->owner = st;
    discovered_hash(h);
    if (!(h->command = launch_command(st, h, (int)st->nhosts, st->driver_addrs)))
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    __atomic_store_n(&st->nhosts, st->nhosts + 1, __ATOMIC_RELEASE);
    return start_session(st, h, err) == 0 ? (int)(st->nhosts - 1) : -1;
}

bool ssh_tasks_host_ended(ssh_tasks *st, int host) {
    return host < 0 || (size_t)host >= st->nhosts ||
           __atomic_load_n(&st->hosts[host].ended, __ATOMIC_ACQUIRE);
}

void ssh_tasks_stop(ssh_tasks *st, int grace_ms) {
    if (!st) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += grace_ms / 1000;
    until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&st->mu);
    st->stopping = true;
    while (st->running > 0 && !hvd_signals_first() &&
           pthread_cond_timedwait(&st->cv, &st->mu, &until) != ETIMEDOUT) {
    }
    int left = st->running;
    pthread_mutex_unlock(&st->mu);
    if (left > 0) {
        if (st->o->verbose)
            fprintf(stderr, "hvd-driver: %d ssh session%s still running; ending them\n", left,
                    left == 1 ? "" : "s");
        ssh_tasks_interrupt(st);
    }
    for (size_t i = 0; i < st->nhosts; i++) {
        ssh_host *h = &st->hosts[i];
        if (!h->has_thread) continue;
        pthread_join(h->thread, NULL);
        /* A host still setting up its session when the job ended (waiting for another host
         * that failed, or too slow for --start-timeout): say where it was. */
        if (h->rc != 0 && !h->started && !h->reported && !hvd_signals_first())
            fprintf(stderr, "hvd-driver: ssh host %s had not started its tasks: %s\n", h->name,
                    h->err.msg);
    }

    /* The sweep, on every host where tasks were started, all at once. */
    for (size_t i = 0; i < st->nhosts; i++) {
        ssh_host *h = &st->hosts[i];
        h->has_thread = __atomic_load_n(&h->started, __ATOMIC_ACQUIRE) &&
                        start_thread(&h->thread, sweep_main, h) == 0;
    }
    for (size_t i = 0; i < st->nhosts; i++)
        if (st->hosts[i].has_thread) pthread_join(st->hosts[i].thread, NULL);

    free_tasks(st);
}
