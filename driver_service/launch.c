/* The mpirun command line (DESIGN.md section 2, step 4) and running it (include/hvd/launch.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd/launch.h"

typedef struct argv_b {
    char **v;
    size_t n, cap;
} argv_b;

static void add(argv_b *a, const char *s) {
    if (a->n + 2 > a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        if (!a->v) abort();
    }
    a->v[a->n++] = strdup(s);
    a->v[a->n] = NULL;
}

static void add2(argv_b *a, const char *x, const char *y) {
    add(a, x);
    add(a, y);
}

const char *hvd_launch_bin_dir(void) {
    static char dir[PATH_MAX];
    if (dir[0]) return dir;
    const char *env = getenv("HVD_BIN_DIR");
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s", env);
        return dir;
    }
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
        snprintf(dir, sizeof dir, ".");
        return dir;
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    return dir;
}

char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err) {
    char *hosts = hvd_driver_host_list(d, err);
    if (!hosts) return NULL;
    const char *bin = cfg->bin_dir ? cfg->bin_dir : hvd_launch_bin_dir();
    argv_b a = {0};
    char np[16], path[PATH_MAX + 16];
    snprintf(np, sizeof np, "%d", cfg->np);
    add(&a, "mpirun");
    if (geteuid() == 0) add(&a, "--allow-run-as-root");
    add(&a, "--tag-output");
    add2(&a, "-np", np);
    add2(&a, "-H", hosts);
    add2(&a, "-bind-to", "none");
    add2(&a, "-map-by", "slot");
    /* Rank 0 reads no stdin: large stdin crashes remote orteds (openmpi_rsh_agent.md §9). */
    add2(&a, "--stdin", "none");
    /* Host hashes never resolve: without this mpirun sends a DNS query for each of them
     * (seen with strace: 4 queries for one host) to whatever resolver the machine has. */
    add(&a, "-mca");
    add(&a, "if_base_do_not_resolve");
    add(&a, "1");
    add(&a, "-mca");
    add(&a, "pml");
    add(&a, "ob1");
    add(&a, "-mca");
    add(&a, "btl");
    add(&a, "self,vader,tcp");
    snprintf(path, sizeof path, "%s/hvd-rsh", bin);
    add(&a, "-mca");
    add(&a, "plm_rsh_agent");
    add(&a, path);
    if (ifaces && ifaces[0]) {
        char list[1024] = "";
        for (size_t i = 0; ifaces[i]; i++) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%s", i ? "," : "", ifaces[i]);
        }
        add(&a, "-mca");
        add(&a, "btl_tcp_if_include");
        add(&a, list);
        add(&a, "-mca");
        add(&a, "oob_tcp_if_include");
        add(&a, list);
        char nccl[1100];
        /* NCCL_SOCKET_IFNAME is a prefix list: '=' asks for exact names (eth1 not eth10). */
        snprintf(nccl, sizeof nccl, "NCCL_SOCKET_IFNAME==%s", list);
        add2(&a, "-x", nccl);
    }
    for (size_t i = 0; cfg->mpi_args && cfg->mpi_args[i]; i++)
        add(&a, cfg->mpi_args[i]);
    snprintf(path, sizeof path, "%s/hvd-exec", bin);
    add(&a, path);
    free(hosts);
    if (cfg->verbose) {
        fprintf(stderr, "hvd-driver: running");
        for (size_t i = 0; a.v[i]; i++)
            fprintf(stderr, " %s", a.v[i]);
        fputc('\n', stderr);
    }
    return a.v;
}

void hvd_launch_free_argv(char **argv) {
    if (!argv) return;
    for (size_t i = 0; argv[i]; i++)
        free(argv[i]);
    free(argv);
}

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (sig_pipe[1] >= 0) (void)!write(sig_pipe[1], &b, 1);
    errno = saved;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int hvd_launch_run(char **argv, const hvd_launch_config *cfg, bool *timed_out, hvd_err *err) {
    int timeout_s = cfg->timeout_s;
    *timed_out = false;
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term, old_hup;
    if (cfg->forward_signals) {
        if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
            return hvd_err_set(err, HVD_E_IO, "pipe: %s", strerror(errno));
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGINT, &sa, &old_int);
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGHUP, &sa, &old_hup);
    }
    /* The child's environment is built before fork: after fork in a multithreaded process
     * (a JVM) only async-signal-safe calls are allowed. */
    extern char **environ;
    size_t nenv = 0, nextra = 0;
    while (environ[nenv])
        nenv++;
    while (cfg->extra_env && cfg->extra_env[nextra])
        nextra++;
    char **envp = calloc(nenv + nextra + 1, sizeof *envp);
    if (!envp) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < nextra; i++)
        envp[k++] = (char *)cfg->extra_env[i];
    for (size_t i = 0; i < nenv; i++) {
        /* An extra entry wins over the same name in environ. */
        size_t len = strcspn(environ[i], "=");
        bool dup = false;
        for (size_t j = 0; j < nextra && !dup; j++)
            dup = strncmp(cfg->extra_env[j], environ[i], len) == 0 && cfg->extra_env[j][len] == '=';
        if (!dup) envp[k++] = environ[i];
    }
    pid_t pid = fork();
    if (pid < 0) {
        free(envp);
        return hvd_err_set(err, HVD_E_INTERNAL, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        /* The child starts with default dispositions and no blocked signals, whatever the
         * parent (a JVM, say) had. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        execvpe(argv[0], argv, envp);
        fprintf(stderr, "hvd-driver: cannot run %s: %s (is Open MPI installed?)\n", argv[0],
                strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    free(envp);
    int64_t deadline = timeout_s > 0 ? now_ms() + (int64_t)timeout_s * 1000 : -1;
    int64_t kill_at = -1;
    bool stopping = false;
    int status = -1;
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) {
            status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            break;
        }
        int64_t now = now_ms();
        if (deadline >= 0 && now >= deadline && !*timed_out) {
            *timed_out = true;
            fprintf(stderr, "hvd-driver: the job ran past --timeout %d s; stopping mpirun\n",
                    timeout_s);
            kill(-pid, SIGTERM);
            kill_at = now + 10000;
        }
        if (cfg->stop && !stopping && __atomic_load_n(cfg->stop, __ATOMIC_ACQUIRE)) {
            stopping = true; /* the caller gave up on the job (include/hvd/launch.h) */
            kill(-pid, SIGTERM);
            if (kill_at < 0) kill_at = now + 10000;
        }
        if (kill_at >= 0 && now >= kill_at) {
            kill(-pid, SIGKILL);
            kill_at = -1;
        }
        struct pollfd p = {.fd = cfg->forward_signals ? sig_pipe[0] : -1, .events = POLLIN};
        if (poll(&p, 1, 50) > 0) {
            unsigned char sig;
            while (read(sig_pipe[0], &sig, 1) == 1) {
                /* mpirun turns one SIGINT/SIGTERM into an orderly abort of the job; a second
                 * one is passed on as well, then SIGKILL follows 10 s later. */
                kill(pid, sig);
                if (kill_at < 0) kill_at = now + 10000;
            }
        }
    }
    if (cfg->forward_signals) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGHUP, &old_hup, NULL);
    }
    return status;
}
