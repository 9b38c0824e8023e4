/* hvd-driver: runs an mpirun job inside task services (DESIGN.md section 2). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

static const char USAGE[] =
    "usage: hvd-driver run -np N [--local H | --ssh-hosts H:S,...] [options]\n"
    "                      (--entry LIB.so:SYMBOL [--entry-arg S] | -- COMMAND [ARGS...])\n"
    "       hvd-driver serve -np N --env-file FILE [options] (--entry ... | -- COMMAND ...)\n"
    "\n"
    "Runs an MPI job whose ranks live inside task services (executors), through mpirun and\n"
    "hvd-rsh instead of ssh.\n"
    "\n"
    "run: starts the driver service, waits for N task services to register, has them probe\n"
    "  each other for the network interfaces they share, runs\n"
    "    mpirun -H <host hash>:<slots>,... -mca plm_rsh_agent hvd-rsh ... hvd-exec\n"
    "  and waits for it. Each rank (hvd-exec) runs the entry point; its output reaches this\n"
    "  terminal with mpirun's [job,rank] prefix. At the end a table gives each rank's task,\n"
    "  host hash, status and error text.\n"
    "  With --local H the N task services are started here, on H fake hosts (the embedded\n"
    "  default for trying things out); without it, hvd-driver prints how to start them\n"
    "  elsewhere and waits.\n"
    "  With --ssh-hosts the task services are started over ssh on plain hosts (no Spark):\n"
    "  one hvd-task per slot, numbered host by host in the order given, stopped at the end.\n"
    "serve: starts the driver service, waits for the N tasks, and writes FILE for the shell:\n"
    "  HVD_DRIVER_ADDRS, HVD_SECRET_FILE, HVD_HOSTS (the -H list), HVD_IFACES, HVD_RSH,\n"
    "  HVD_EXEC, HVD_NP and HVD_MPIRUN_ARGS, so that you can type your own\n"
    "    . FILE; mpirun -np $HVD_NP -H \"$HVD_HOSTS\" -mca plm_rsh_agent \"$HVD_RSH\" \\\n"
    "        $HVD_MPIRUN_ARGS -mca btl_tcp_if_include \"$HVD_IFACES\" ... \"$HVD_EXEC\"\n"
    "  It exits once every rank reported a result (printing the table), or on Ctrl-C.\n"
    "\n"
    "Options:\n"
    "  -np N               number of tasks, and of ranks (one rank per task); with\n"
    "                      --ssh-hosts, the number of slots by default\n"
    "  --local H           start the N task services on this machine, on H fake hosts\n"
    "  --ssh-hosts LIST    start the task services over ssh: LIST is [user@]host[:slots],...\n"
    "                      (slots default 1; N must not exceed their sum). The secret goes\n"
    "                      through each session's stdin, never on a command line\n"
    "  --ssh-port P        ssh port (default 22)\n"
    "  --ssh-user U        login name (default: yours; user@host in LIST wins)\n"
    "  --ssh-identity F    private key file, tried after ssh-agent's keys (default\n"
    "                      ~/.ssh/id_ed25519, id_ecdsa, id_rsa)\n"
    "  --ssh-known-hosts F known_hosts file (default ~/.ssh/known_hosts, and\n"
    "                      /etc/ssh/ssh_known_hosts); host keys are always checked\n"
    "  --ssh-accept-new    add unknown host keys to it (a changed key is still refused)\n"
    "  --ssh-bin-dir DIR   where hvd-task and hvd-exec are on the hosts (default: the\n"
    "                      directory of this hvd-driver)\n"
    "  --ssh-fake-hosts    for tests: the hosts are all this machine (loopback addresses);\n"
    "                      give each its own host hash and Open MPI shared-memory directory\n"
    "  --entry LIB.so:SYM  entry point: a shared object shipped to the ranks as bytes, SYM an\n"
    "                      hvd_entry_fn (include/hvd/entry.h)\n"
    "  --entry-arg STR     argument bytes for the shared-object entry point\n"
    "  -- COMMAND ARGS     entry point: a program each rank runs (found in PATH)\n"
    "  --timeout S         stop the job after S seconds (default: none)\n"
    "  --start-timeout S   time for tasks to register and for commands to start (default 120)\n"
    "  --net-timeout S     a task service the driver hears nothing from for about S seconds\n"
    "                      (TCP keepalive) is lost, e.g. behind a network partition: the job\n"
    "                      stops, naming it; tasks end their command when they lose the\n"
    "                      driver that long (default 15, or HVD_NET_TIMEOUT; local and ssh\n"
    "                      tasks get it, start other tasks with --net-timeout S as well)\n"
    "  --nics a,b          use these interfaces; skip probing\n"
    "  --mpi-arg ARG       pass ARG to mpirun (repeat for several words)\n"
    "  --results-json FILE write every rank's result as JSON\n"
    "  --verbose           print the mpirun command and progress\n"
    "  --help              this text\n"
    "\n"
    "Environment: the job secret is created here and passed only in the environment\n"
    "(HVD_SECRET) and in a 0600 file; it never appears on a command line.\n"
    "\n"
    "Exit status: 0 if every rank succeeded; else the first failed rank's status (or 1), with\n"
    "a line naming that rank, its task, its host and its error text.\n"
    "\n"
    "Example:\n"
    "  hvd-driver run -np 4 --local 2 -- hostname\n"
    "  hvd-driver run -np 4 --ssh-hosts node1:2,node2:2 --entry ./train.so:train\n";

static int usage_error(const char *what) {
    fprintf(stderr, "hvd-driver: %s (see hvd-driver --help)\n", what);
    return 2;
}

static int parse(int argc, char **argv, launch_opts *o) {
    if (argc < 2) return usage_error("missing the subcommand: run or serve");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(USAGE, stdout);
        exit(0);
    }
    if (!strcmp(argv[1], "serve"))
        o->serve = true;
    else if (strcmp(argv[1], "run") != 0)
        return usage_error("the subcommand must be run or serve");
    o->start_timeout_s = 120;
    o->net_timeout_s = HVD_NET_TIMEOUT_DEFAULT_MS / 1000;
    const char *nt = getenv("HVD_NET_TIMEOUT");
    if (nt && *nt) o->net_timeout_s = atoi(nt);
    o->mpi_args = calloc((size_t)argc, sizeof(char *));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            o->command = &argv[i + 1];
            if (!o->command[0]) return usage_error("-- must be followed by a command");
            break;
        }
        if (!strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = true;
            continue;
        } else if (!strcmp(a, "--ssh-accept-new")) {
            o->ssh_accept_new = true;
            continue;
        } else if (!strcmp(a, "--ssh-fake-hosts")) {
            o->ssh_fake_hosts = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "hvd-driver: %s needs a value (see hvd-driver --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-np") || !strcmp(a, "--np"))
            o->np = atoi(v);
        else if (!strcmp(a, "--local"))
            o->local_hosts = atoi(v);
        else if (!strcmp(a, "--timeout"))
            o->timeout_s = atoi(v);
        else if (!strcmp(a, "--start-timeout"))
            o->start_timeout_s = atoi(v);
        else if (!strcmp(a, "--net-timeout"))
            o->net_timeout_s = atoi(v);
        else if (!strcmp(a, "--results-json"))
            o->results_json = v;
        else if (!strcmp(a, "--env-file"))
            o->env_file = v;
        else if (!strcmp(a, "--mpi-arg"))
            o->mpi_args[o->n_mpi_args++] = v;
        else if (!strcmp(a, "--nics"))
            o->nics = v;
        else if (!strcmp(a, "--entry"))
            o->entry = v;
        else if (!strcmp(a, "--entry-arg"))
            o->entry_arg = v;
        else if (!strcmp(a, "--ssh-hosts"))
            o->ssh_hosts = v;
        else if (!strcmp(a, "--ssh-port")) {
            o->ssh_port = atoi(v);
            if (o->ssh_port < 1 || o->ssh_port > 65535 || strspn(v, "0123456789") != strlen(v))
                return usage_error("--ssh-port must be a number from 1 to 65535");
        } else if (!strcmp(a, "--ssh-user"))
            o->ssh_user = v;
        else if (!strcmp(a, "--ssh-identity"))
            o->ssh_identity = v;
        else if (!strcmp(a, "--ssh-known-hosts"))
            o->ssh_known_hosts = v;
        else if (!strcmp(a, "--ssh-bin-dir"))
            o->ssh_bin_dir = v;
        else {
            fprintf(stderr, "hvd-driver: unknown option %s (see hvd-driver --help)\n", a);
            return 2;
        }
    }
    if (o->ssh_hosts && o->np >= 0) {
        hvd_err err;
        if (ssh_hosts_check(o, &err) != 0) return usage_error(err.msg);
    }
    if (o->np < 1) return usage_error("-np N must be at least 1");
    if (o->local_hosts < 0 || o->local_hosts > o->np)
        return usage_error("--local H must be between 1 and N");
    if (o->start_timeout_s < 1) return usage_error("--start-timeout must be at least 1 s");
    if (o->net_timeout_s < 1 || o->net_timeout_s > 3600)
        return usage_error("--net-timeout (or HVD_NET_TIMEOUT) must be 1 to 3600 s");
    if (!o->entry == !o->command)
        return usage_error("give either --entry LIB.so:SYMBOL or -- COMMAND");
    if (o->entry_arg && !o->entry) return usage_error("--entry-arg goes with --entry");
    if (o->serve && !o->env_file) return usage_error("serve needs --env-file FILE");
    if (o->serve && o->local_hosts) return usage_error("serve does not start local tasks");
    if (o->ssh_hosts && o->local_hosts)
        return usage_error("--local and --ssh-hosts exclude each other");
    if (!o->ssh_hosts && (o->ssh_port || o->ssh_user || o->ssh_identity || o->ssh_known_hosts ||
                          o->ssh_accept_new || o->ssh_bin_dir || o->ssh_fake_hosts))
        return usage_error("the --ssh-* options go with --ssh-hosts");
    return 0;
}

/* Reads the entry point into the message the driver hands to ranks. */
static int load_code(const launch_opts *o, hvd_code_msg *code) {
    memset(code, 0, sizeof *code);
    if (o->command) {
        size_t n = 0;
        while (o->command[n])
            n++;
        code->kind = HVD_CODE_ARGV;
        code->argv.v = o->command;
        code->argv.n = n;
        return 0;
    }
    const char *colon = strrchr(o->entry, ':');
    if (!colon || colon == o->entry || !colon[1]) {
        fprintf(stderr, "hvd-driver: --entry must be LIB.so:SYMBOL, got '%s'\n", o->entry);
        return -1;
    }
    char *path = strndup(o->entry, (size_t)(colon - o->entry));
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hvd-driver: cannot read the entry point %s: %s\n", path, strerror(errno));
        free(path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    code->object.data = malloc(len > 0 ? (size_t)len : 1);
    code->object.len = len > 0 ? (size_t)len : 0;
    if (fread(code->object.data, 1, code->object.len, f) != code->object.len) {
        fprintf(stderr, "hvd-driver: cannot read the entry point %s\n", path);
        free(code->object.data);
        code->object.data = NULL;
        fclose(f);
        free(path);
        return -1;
    }
    fclose(f);
    free(path);
    code->kind = HVD_CODE_SHARED_OBJECT;
    code->symbol = (char *)(colon + 1);
    code->arg.data = (uint8_t *)(o->entry_arg ? o->entry_arg : "");
    code->arg.len = o->entry_arg ? strlen(o->entry_arg) : 0;
    return 0;
}

static void log_line(void *user, const char *line) {
    const launch_opts *o = user;
    if (o->verbose) fprintf(stderr, "hvd-driver: %s\n", line);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static char **split_csv(const char *s) {
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    char **v = calloc(n + 1, sizeof *v);
    char *copy = strdup(s);
    size_t k = 0;
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ","))
        v[k++] = strdup(tok);
    free(copy);
    return v;
}

static void free_strv(char **v) {
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static int write_env_file(const launch_opts *o, const launch_dir *dir, const char *addrs,
                          const char *hosts, char *const *ifaces) {
    FILE *f = fopen(o->env_file, "w");
    if (!f) return -1;
    fprintf(f, "# written by hvd-driver serve (pid %d); source it before mpirun\n", (int)getpid());
    fprintf(f, "export HVD_DRIVER_ADDRS='%s'\n", addrs);
    fprintf(f, "export HVD_SECRET_FILE='%s'\n", dir->secret_file);
    fprintf(f, "export HVD_HOSTS='%s'\n", hosts);
    fprintf(f, "export HVD_IFACES='");
    for (size_t i = 0; ifaces && ifaces[i]; i++)
        fprintf(f, "%s%s", i ? "," : "", ifaces[i]);
    fprintf(f, "'\n");
    fprintf(f, "export HVD_RSH='%s/hvd-rsh'\n", hvd_launch_bin_dir());
    fprintf(f, "export HVD_EXEC='%s/hvd-exec'\n",
            o->ssh_bin_dir ? o->ssh_bin_dir : hvd_launch_bin_dir());
    fprintf(f, "export HVD_NP=%d\n", o->np);
    /* Arguments every hvd-bridge mpirun wants: no DNS queries for host hashes, no stdin. */
    fprintf(f, "export HVD_MPIRUN_ARGS='-mca if_base_do_not_resolve 1 --stdin none'\n");
    return fclose(f);
}

/* ---- Interrupts and lost tasks -----------------------------------------------------------
 * SIGINT, SIGTERM and SIGHUP (outside ssh mode, which handles its own) and a task service that
 * dies while the job runs end the job through the same path: the driver is aborted (so that
 * waits for registration or interfaces return at once), mpirun is stopped, and main's cleanup
 * runs (tasks shut down, the private directory with the secret file removed). */

#define LOST_TASK_GRACE_MS 2000 /* a task that ended its part also drops its connection */

static int watch_pipe[2] = {-1, -1};
/* Written by the signal handler, read by other threads: atomic (lock-free int). */
static int got_signal;
static int launch_stop;       /* hvd_launch_config.stop */
static hvd_driver *watched;   /* set once the driver runs (atomic accesses) */
static char stop_reason[512]; /* why the watcher stopped the job; "" if it did not */
static int watch_lost = 1;    /* lost tasks matter: cleared once mpirun has ended */

static void on_interrupt(int sig) {
    int saved = errno;
    __atomic_store_n(&got_signal, sig, __ATOMIC_SEQ_CST);
    if (watch_pipe[1] >= 0) (void)!write(watch_pipe[1], "s", 1);
    errno = saved;
}

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

static pthread_mutex_t stop_mu = PTHREAD_MUTEX_INITIALIZER; /* guards stop_reason */

/* Copies stop_reason (empty if the watcher did not stop the job). */
static void get_stop_reason(char *out, size_t cap) {
    pthread_mutex_lock(&stop_mu);
    snprintf(out, cap, "%s", stop_reason);
    pthread_mutex_unlock(&stop_mu);
}

static void stop_job(const char *why) {
    pthread_mutex_lock(&stop_mu);
    if (!stop_reason[0]) snprintf(stop_reason, sizeof stop_reason, "%s", why);
    pthread_mutex_unlock(&stop_mu);
    if (__atomic_exchange_n(&launch_stop, 1, __ATOMIC_SEQ_CST)) return;
    hvd_driver *d = __atomic_load_n(&watched, __ATOMIC_ACQUIRE);
    if (d) hvd_driver_abort(d, why);
}

static void *watch_main(void *arg) {
    (void)arg;
    int64_t lost_since = -1;
    for (;;) {
        struct pollfd p = {.fd = watch_pipe[0], .events = POLLIN};
        int rc = poll(&p, 1, 200);
        if (rc > 0) {
            char c;
            if (read(watch_pipe[0], &c, 1) <= 0 || c == 'q') return NULL;
            char why[64];
            snprintf(why, sizeof why, "interrupted by %s",
                     signal_name(__atomic_load_n(&got_signal, __ATOMIC_SEQ_CST)));
            stop_job(why);
        }
        hvd_driver *d = __atomic_load_n(&watched, __ATOMIC_ACQUIRE);
        if (!d || !__atomic_load_n(&watch_lost, __ATOMIC_ACQUIRE) || hvd_driver_lost_tasks(d) == 0)
            continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        if (lost_since < 0) lost_since = now;
        char why[sizeof stop_reason];
        /* A connection that timed out (network partition) is never a normal end: no grace. */
        if (hvd_driver_lost_reason(d, why, sizeof why) || now - lost_since >= LOST_TASK_GRACE_MS)
            stop_job(why[0] ? why
                            : "a task service went away while the job ran (its connection to "
                              "the driver broke: did the executor die?)");
    }
}

/* Starts the watcher. In ssh mode the ssh sessions take the signals themselves. */
static void watch_start(pthread_t *t, bool signals) {
    if (pipe2(watch_pipe, O_CLOEXEC) != 0) return;
    if (signals) {
        struct sigaction sa = {.sa_handler = on_interrupt};
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(t, NULL, watch_main, NULL) != 0) *t = 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void watch_stop(pthread_t t) {
    if (!t) return;
    (void)!write(watch_pipe[1], "q", 1);
    pthread_join(t, NULL);
}

/* Starts a small process that removes the private directory (with the secret file) when
 * hvd-driver ends, however it ends, SIGKILL included: it waits for end-of-file on a pipe
 * whose only write end hvd-driver holds, then runs rm -rf. Only async-signal-safe calls
 * after fork (a thread is running). */
static void start_cleaner(const char *dir) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction ign = {.sa_handler = SIG_IGN};
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGTERM, &ign, NULL);
        sigaction(SIGHUP, &ign, NULL);
        close(p[1]);
        char c;
        while (read(p[0], &c, 1) < 0 && errno == EINTR) {
        }
        execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(0);
    }
    close(p[0]);
    if (pid < 0) close(p[1]); /* the write end stays open (leaked on purpose) until exit */
}

/* serve: waits until every rank reported, or the job is stopped. */
static void wait_for_results(hvd_driver *d, int np) {
    struct timespec tick = {0, 100 * 1000 * 1000};
    while (!__atomic_load_n(&launch_stop, __ATOMIC_SEQ_CST)) {
        hvd_rank_result *r;
        size_t n;
        hvd_err err;
        int got = 0;
        if (hvd_driver_results(d, &r, &n, &err) == 0) {
            for (size_t i = 0; i < n; i++)
                got += r[i].present;
            hvd_driver_results_free(r, n);
        }
        if (got == np) return;
        nanosleep(&tick, NULL);
    }
}

int main(int argc, char **argv) {
    launch_opts o = {0};
    int rc = parse(argc, argv, &o);
    hvd_code_msg code;
    if (rc != 0 || load_code(&o, &code) != 0) {
        free(o.mpi_args);
        return rc != 0 ? rc : 1;
    }

    hvd_err err;
    hvd_secret secret;
    launch_dir dir = {0};
    pthread_t watcher = 0;
    /* Before the secret file exists, so that an interrupt always gets to the cleanup. */
    watch_start(&watcher, !o.ssh_hosts);
    snprintf(dir.path, sizeof dir.path, "%s/hvd-driver.XXXXXX",
             getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir.path)) {
        fprintf(stderr, "hvd-driver: cannot create a private directory: %s\n", strerror(errno));
        return 1;
    }
    start_cleaner(dir.path);
    snprintf(dir.secret_file, sizeof dir.secret_file, "%s/secret", dir.path);
    if (hvd_secret_generate(&secret, &err) != 0 ||
        hvd_secret_write_file(&secret, dir.secret_file, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        nftw(dir.path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 1;
    }
    char b64[45];
    hvd_secret_to_base64(&secret, b64);
    setenv(HVD_SECRET_ENV, b64, 1); /* for mpirun, hvd-rsh and local tasks; never argv */
    memset(b64, 0, sizeof b64);
    unsetenv(HVD_SECRET_FILE_ENV);

    char **nics = o.nics ? split_csv(o.nics) : NULL;
    hvd_driver_config cfg = {.num_tasks = (uint32_t)o.np,
                             .secret = secret,
                             .code = &code,
                             .nics = (const char *const *)nics,
                             .log = log_line,
                             .log_user = &o,
                             .net_timeout_ms = o.net_timeout_s * 1000};
    char nt_text[16];
    snprintf(nt_text, sizeof nt_text, "%d", o.net_timeout_s);
    setenv("HVD_NET_TIMEOUT", nt_text, 1); /* local task services take it from here */
    hvd_driver *d = hvd_driver_start(&cfg, &err);
    __atomic_store_n(&watched, d, __ATOMIC_RELEASE);
    if (d && __atomic_load_n(&got_signal, __ATOMIC_SEQ_CST))
        stop_job("interrupted"); /* a signal before the driver existed */
    hvd_secret_wipe(&secret);
    hvd_secret_wipe(&cfg.secret);
    local_tasks lt = {0};
    ssh_tasks *sshl = NULL;
    char **ifaces = NULL, **mpi = NULL, *hosts = NULL, *addr_text = NULL;
    rc = 1;
    if (!d) {
        fprintf(stderr, "hvd-driver: cannot start the driver service: %s\n", err.msg);
        goto out;
    }
    hvd_addr *addrs;
    size_t naddrs;
    if (hvd_driver_addrs(d, &addrs, &naddrs, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        goto out;
    }
    addr_text = hvd_addrs_format(addrs, naddrs);
    free(addrs);
    setenv(HVD_DRIVER_ADDRS_ENV, addr_text, 1);

    if (o.local_hosts > 0) {
        if (local_tasks_start(&lt, &o, &dir, &err) != 0) {
            fprintf(stderr, "hvd-driver: cannot start the local task services: %s\n", err.msg);
            goto out;
        }
    } else if (o.ssh_hosts) {
        if (!(sshl = ssh_tasks_start(&o, d, addr_text, &err))) {
            fprintf(stderr, "hvd-driver: cannot start the task services over ssh: %s\n", err.msg);
            goto out;
        }
    } else {
        fprintf(stderr,
                "hvd-driver: waiting for %d task services. Start each executor's with\n"
                "  HVD_SECRET_FILE=%s hvd-task --driver '%s' --index I\n"
                "(I = 0..%d; copy the secret file there with mode 0600, never on a command "
                "line)\n",
                o.np, dir.secret_file, addr_text, o.np - 1);
    }
    if (hvd_driver_wait_registration(d, o.start_timeout_s * 1000, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        goto out;
    }
    if (hvd_driver_common_interfaces(d, o.start_timeout_s * 1000, &ifaces, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        goto out;
    }
    hosts = hvd_driver_host_list(d, &err);
    if (!hosts) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        goto out;
    }
    if (o.verbose) {
        fprintf(stderr, "hvd-driver: hosts %s; interfaces", hosts);
        for (size_t i = 0; ifaces[i]; i++)
            fprintf(stderr, " %s", ifaces[i]);
        fputc('\n', stderr);
    }
    if (o.serve) {
        if (write_env_file(&o, &dir, addr_text, hosts, ifaces) != 0) {
            fprintf(stderr, "hvd-driver: cannot write %s: %s\n", o.env_file, strerror(errno));
            goto out;
        }
        fprintf(stderr, "hvd-driver: all %d tasks are in; wrote %s. Now run mpirun with it.\n",
                o.np, o.env_file);
        wait_for_results(d, o.np);
        __atomic_store_n(&watch_lost, 0, __ATOMIC_RELEASE);
        rc = report_results(d, &o, 0, false);
        goto out;
    }
    hvd_launch_config lc = {.np = o.np,
                            .mpi_args = o.mpi_args,
                            .timeout_s = o.timeout_s,
                            .verbose = o.verbose,
                            .forward_signals = o.ssh_hosts != NULL,
                            .stop = &launch_stop};
    mpi = hvd_launch_argv(d, &lc, ifaces, &err);
    if (!mpi || ssh_tasks_fix_argv(&o, mpi, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        goto out;
    }
    bool timed_out;
    int status = hvd_launch_run(mpi, &lc, &timed_out, &err);
    /* From here on, task services end because the job did. */
    __atomic_store_n(&watch_lost, 0, __ATOMIC_RELEASE);
    if (status < 0) {
        fprintf(stderr, "hvd-driver: cannot run mpirun: %s\n", err.msg);
        goto out;
    }
    char why[sizeof stop_reason];
    get_stop_reason(why, sizeof why);
    if (why[0]) fprintf(stderr, "hvd-driver: stopping the job: %s\n", why);
    rc = report_results(d, &o, status, timed_out);
out:
    watch_stop(watcher);
    char final_why[sizeof stop_reason];
    get_stop_reason(final_why, sizeof final_why);
    int sig = __atomic_load_n(&got_signal, __ATOMIC_SEQ_CST);
    if (final_why[0] && rc == 0) rc = 1;
    if (sig && final_why[0]) rc = 128 + sig;
    if (d) hvd_driver_shutdown_tasks(d);
    if (lt.n) local_tasks_stop(&lt, 5000);
    ssh_tasks_stop(sshl, 5000);
    hvd_driver_stop(d);
    hvd_launch_free_argv(mpi);
    free_strv(ifaces);
    free_strv(nics);
    free(hosts);
    free(addr_text);
    if (code.kind == HVD_CODE_SHARED_OBJECT) free(code.object.data);
    free(o.mpi_args);
    nftw(dir.path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
