/* The process runner, owner side (hvd_proc_*). See proc.h for the design; the keeper and the
 * command child are in keeper.c. */
#include "common/proc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/io.h"
#include "keeper.h"

extern char **environ;

/* waitid() id type for a pidfd (Linux 5.4); spelled out for C libraries that predate it. */
#define WAIT_P_PIDFD ((idtype_t)3)

/* How long start waits for the keeper to report the shell's pid. The keeper does a few
 * system calls, an exec and one fork, so this only fires if the machine is in deep trouble. */
#define KEEPER_REPORT_TIMEOUT_MS 10000

struct hvd_proc {
    pid_t keeper;    /* the keeper (our child) */
    pid_t shell;     /* /bin/sh: leader of the command's session and process group */
    int ctl;         /* our end of the control socket: abort out, pid/exit records in */
    int out_fd;      /* read end of the command's stdout pipe, or -1 once closed */
    int err_fd;      /* read end of the command's stderr pipe, or -1 once closed */
    int exit_fd;     /* pidfd of the keeper, or the done pipe's read end */
    int exit_pidfd;  /* exit_fd is a pidfd */
    int ended;       /* reaped: exit_code is final */
    int exit_code;   /* valid once ended */
    int exit_record; /* exit code the keeper sent over ctl, or -1 */
    int exit_signal; /* the signal that ended the command, as the keeper sent it; 0: none */
};

static atomic_int force_fallbacks;

void hvd_proc_force_fallbacks(int on) {
    atomic_store(&force_fallbacks, on);
}

/* Whether pidfd_open and waitid(P_PIDFD) work here (Linux 5.4+). Probed once. */
static int pidfd_usable(void) {
    static atomic_int cached = -1;
    int v = atomic_load(&cached);
    if (v >= 0) return v;
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (fd < 0) {
        if (errno != ENOSYS) return 0; /* out of descriptors, say: don't cache */
        atomic_store(&cached, 0);
        return 0;
    }
    siginfo_t si;
    memset(&si, 0, sizeof si);
    /* We are not our own child: ECHILD if P_PIDFD is known, EINVAL on 5.3. */
    int r = waitid(WAIT_P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG);
    v = r < 0 && errno == ECHILD;
    close(fd);
    atomic_store(&cached, v);
    return v;
}

static const char *step_name(int step) {
    switch (step) {
    case STEP_FDS:
        return "arrange its descriptors";
    case STEP_DEVNULL:
        return "open /dev/null";
    case STEP_SIGNALFD:
        return "create a signalfd";
    case STEP_FORK:
        return "fork the command's process";
    case STEP_EXEC:
        return "start (exec) the keeper program";
    case STEP_ARGS:
        return "read its arguments (an hvd-keeper of another version? set HVD_KEEPER)";
    default:
        return "start";
    }
}

/* Reads the keeper's messages that are queued on ctl; records the exit code. */
static void drain_ctl(hvd_proc *c) {
    struct ctl_msg m;
    while (c->ctl >= 0 && recv(c->ctl, &m, sizeof m, MSG_DONTWAIT) == (ssize_t)sizeof m)
        if (m.tag == MSG_EXIT) {
            c->exit_record = m.value;
            c->exit_signal = m.err;
        }
}

/* Waits for the keeper to report the shell's pid. Returns 0, or -1 with err filled (the
 * keeper has then exited or been killed, and is reaped). */
static int await_shell(hvd_proc *c, const char *path, const char *program, hvd_err *err) {
    struct ctl_msg m = {0, 0, 0};
    int64_t deadline = hvd_now_ms() + KEEPER_REPORT_TIMEOUT_MS;
    ssize_t n = -1;
    for (;;) {
        int64_t left = deadline - hvd_now_ms();
        struct pollfd pf = {.fd = c->ctl, .events = POLLIN};
        int r = poll(&pf, 1, left < 0 ? 0 : (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n = recv(c->ctl, &m, sizeof m, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        break;
    }
    if (n == (ssize_t)sizeof m && m.tag == MSG_PID) {
        c->shell = m.value;
        return 0;
    }
    if (n == (ssize_t)sizeof m && m.tag == MSG_FAIL && m.value == STEP_EXEC) {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "cannot start the command: its keeper program %s did not start: %s (set "
                    "HVD_KEEPER to the right hvd-keeper, or to 'none' to keep commands without it)",
                    program ? program : "?", strerror(m.err));
    } else if (n == (ssize_t)sizeof m && m.tag == MSG_FAIL) {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "cannot start the command: its keeper process could not %s%s%s",
                    step_name(m.value), m.err ? ": " : "", m.err ? strerror(m.err) : "");
    } else {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "cannot start the command: its keeper process (pid %d) %s before starting %s",
                    (int)c->keeper, n == 0 ? "exited" : "did not answer", path);
        kill(c->keeper, SIGKILL);
    }
    while (waitpid(c->keeper, NULL, 0) < 0 && errno == EINTR) {
    }
    return -1;
}

/* Checks what can be checked before forking. Returns 0, or -1 with err. */
static int check_spec(const hvd_proc_spec *spec, hvd_err *err) {
    if (!spec || (!spec->command && (!spec->argv || !spec->argv[0] || !spec->argv[0][0])))
        return hvd_err_set(err, HVD_E_INVALID, "cannot start a command: no command line given");
    if (spec->grace_ms < 0)
        return hvd_err_set(err, HVD_E_INVALID,
                           "cannot start a command: negative grace period %d ms", spec->grace_ms);
    if ((spec->pass_stdout && spec->stdout_fd < 0) || (spec->pass_stderr && spec->stderr_fd < 0))
        return hvd_err_set(err, HVD_E_INVALID, "cannot start a command: bad output descriptor");
    if (spec->n_extra_fds < 0 || spec->n_extra_fds > HVD_PROC_MAX_EXTRA_FDS ||
        (spec->n_extra_fds && !spec->extra_fds))
        return hvd_err_set(err, HVD_E_INVALID, "cannot start a command: %d extra descriptors",
                           spec->n_extra_fds);
    for (int i = 0; i < spec->n_extra_fds; i++)
        if (spec->extra_fds[i] < 0)
            return hvd_err_set(err, HVD_E_INVALID, "cannot start a command: bad extra descriptor");
    if (!spec->cwd) return 0;
    struct stat st;
    const char *why = NULL;
    if (stat(spec->cwd, &st) != 0 || access(spec->cwd, X_OK) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(st.st_mode))
        why = "not a directory";
    if (why)
        return hvd_err_set(err, HVD_E_INVALID,
                           "cannot start the command in working directory '%s': %s", spec->cwd,
                           why);
    return 0;
}

/* The value of PATH in envp, or the default search path. */
static const char *env_path(char *const *envp) {
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], "PATH=", 5) == 0) return envp[i] + 5;
    return "/usr/local/bin:/usr/bin:/bin";
}

/* Finds a program the way execvp does (a name with '/' as is, else the first executable file
 * of that name in the command's PATH), before fork: the child may not allocate. Returns a
 * malloc'd path, or NULL with err. */
static char *find_program(const char *name, char *const *envp, hvd_err *err) {
    if (strchr(name, '/')) {
        if (access(name, X_OK) == 0) return strdup(name);
        hvd_err_set(err, HVD_E_INVALID, "cannot run %s: %s", name, strerror(errno));
        return NULL;
    }
    const char *path = env_path(envp);
    while (*path) {
        size_t n = strcspn(path, ":");
        char *cand = NULL;
        if (asprintf(&cand, "%.*s/%s", (int)n, n ? path : ".", name) < 0) break;
        struct stat st;
        if (access(cand, X_OK) == 0 && stat(cand, &st) == 0 && S_ISREG(st.st_mode)) return cand;
        free(cand);
        path += n + (path[n] == ':');
    }
    hvd_err_set(err, HVD_E_INVALID, "cannot run %s: not found in PATH (%s)", name, env_path(envp));
    return NULL;
}

/* The descriptors of one start: control socket, output pipes, done pipe. */
typedef struct channels {
    int sv[2], out[2], errp[2], done[2];
} channels;

static void channels_close(channels *ch) {
    for (int i = 0; i < 2; i++) {
        hvd_close_fd(&ch->sv[i]);
        hvd_close_fd(&ch->out[i]);
        hvd_close_fd(&ch->errp[i]);
        hvd_close_fd(&ch->done[i]);
    }
}

static int channels_open(channels *ch, const hvd_proc_spec *spec, int use_pidfd, hvd_err *err) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch->sv) != 0 ||
        (!spec->pass_stdout && pipe2(ch->out, O_CLOEXEC) != 0) ||
        (!spec->pass_stderr && pipe2(ch->errp, O_CLOEXEC) != 0) ||
        (!use_pidfd && pipe2(ch->done, O_CLOEXEC) != 0))
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "cannot start the command: creating pipes failed: %s", strerror(errno));
    return 0;
}

/* Whether path names an executable regular file. */
static int is_program(const char *path) {
    struct stat st;
    return access(path, X_OK) == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Looks for hvd-keeper in dir, dir/bin and dir/../bin (the programs beside a program, a Python
 * package's bin/ beside its extension, the build's or the prefix's bin/ beside lib/). */
static int keeper_beside(const char *dir, char *out, size_t cap) {
    static const char *const where[] = {"%s/hvd-keeper", "%s/bin/hvd-keeper",
                                        "%s/../bin/hvd-keeper"};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        int n = snprintf(out, cap, where[i], dir);
        if (n > 0 && (size_t)n < cap && is_program(out)) return 1;
    }
    return 0;
}

/* The keeper program to exec, in out; or NULL: keep the command in place (a forked copy of this
 * process). HVD_KEEPER names it ('none': in place); else hvd-keeper in $HVD_BIN_DIR, then beside
 * the object that holds this code (a program, libhvd_jni.so, the Python extension). */
static const char *keeper_program(char *out, size_t cap) {
    const char *env = getenv("HVD_KEEPER");
    if (env && strcmp(env, "none") == 0) return NULL;
    if (env && *env) return snprintf(out, cap, "%s", env) < (int)cap ? out : NULL;
    const char *bin = getenv("HVD_BIN_DIR");
    if (bin && *bin && keeper_beside(bin, out, cap)) return out;
    char dir[PATH_MAX];
    Dl_info info;
    const char *obj = NULL;
    if (dladdr((void *)hvd_proc_start, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        obj = realpath(info.dli_fname, dir);
    if (!obj) { /* a symbol of the main program: dladdr may give its name without a path */
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (n <= 0) return NULL;
        dir[n] = '\0';
    }
    char *slash = strrchr(dir, '/');
    if (!slash) return NULL;
    *slash = '\0';
    return keeper_beside(dir, out, cap) ? out : NULL;
}

/* Fills the keeper's instructions from the spec and the channels; with a keeper program, also
 * its arguments. Returns 0, or -1 when out of memory. */
static int keeper_prepare(struct keeper *k, const hvd_proc_spec *spec, char *path,
                          const channels *ch, int fallbacks, const char *program) {
    memset(k, 0, offsetof(struct keeper, tree));
    if (spec->command) {
        k->sh_argv[0] = "sh";
        k->sh_argv[1] = "-c";
        k->sh_argv[2] = (char *)spec->command;
        k->argv = k->sh_argv;
    } else {
        k->argv = spec->argv;
    }
    k->path = path;
    k->envp = spec->envp ? spec->envp : environ;
    k->cwd = spec->cwd;
    k->hostname = spec->uts_hostname;
    k->cleanup_dir = spec->cleanup_dir;
    k->grace_ms = spec->grace_ms ? spec->grace_ms : HVD_PROC_DEFAULT_GRACE_MS;
    k->owner = getpid();
    k->fallbacks = fallbacks;
    k->end_with_command = spec->end_with_program;
    k->ctl = ch->sv[1];
    k->out_w = spec->pass_stdout ? spec->stdout_fd : ch->out[1];
    k->err_w = spec->pass_stderr ? spec->stderr_fd : ch->errp[1];
    k->done_w = ch->done[1];
    k->n_extra = spec->n_extra_fds;
    for (int i = 0; i < k->n_extra; i++)
        k->extra[i] = spec->extra_fds[i];
    k->env_fd = -1;
    k->program = program;
    if (!program) return 0;
    if (!(k->program_argv = hvd_keeper_argv(k))) return -1;
    return (k->env_fd = hvd_keeper_env_fd(k->envp)) < 0 ? -1 : 0;
}

/* Frees what keeper_prepare made: the keeper program's arguments and environment memfd. */
static void keeper_release(struct keeper *k) {
    free(k->program_argv);
    if (k->env_fd >= 0) close(k->env_fd);
    free(k);
}

/* Forks the keeper with every signal blocked (no handler of ours may run in the child before
 * it has reset them). Returns its pid, or -1 with errno. */
static pid_t fork_keeper(struct keeper *k) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) hvd_keeper_start(k);
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = saved;
    return pid;
}

/* Takes the owner's ends of the channels into p, once the keeper runs. Returns 0, or -1 with
 * err (the keeper is then told to abort and reaped). */
static int adopt_channels(hvd_proc *c, channels *ch, int use_pidfd, hvd_err *err) {
    c->ctl = ch->sv[0];
    c->out_fd = ch->out[0];
    c->err_fd = ch->errp[0];
    ch->sv[0] = ch->out[0] = ch->errp[0] = -1;
    if (use_pidfd) {
        c->exit_fd = (int)syscall(SYS_pidfd_open, c->keeper, 0);
        c->exit_pidfd = 1;
    } else {
        c->exit_fd = ch->done[0];
        ch->done[0] = -1;
    }
    if (c->exit_fd >= 0 && (c->out_fd < 0 || hvd_set_nonblock(c->out_fd) == 0) &&
        (c->err_fd < 0 || hvd_set_nonblock(c->err_fd) == 0) &&
        (c->exit_pidfd || hvd_set_nonblock(c->exit_fd) == 0))
        return 0;
    hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: %s", strerror(errno));
    hvd_close_fd(&c->ctl); /* the keeper sees the lifeline cut and aborts */
    while (waitpid(c->keeper, NULL, 0) < 0 && errno == EINTR) {
    }
    return -1;
}

hvd_proc *hvd_proc_start(const hvd_proc_spec *spec, hvd_err *err) {
    if (check_spec(spec, err) != 0) return NULL;
    char *const *envp = spec->envp ? spec->envp : environ;
    char *path = spec->command ? strdup("/bin/sh") : find_program(spec->argv[0], envp, err);
    if (!path) {
        if (spec->command) hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    int fallbacks = atomic_load(&force_fallbacks);
    int use_pidfd = !fallbacks && pidfd_usable();
    channels ch = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
    hvd_proc *c = calloc(1, sizeof *c);
    struct keeper *k = malloc(sizeof *k);
    if (!c || !k) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: out of memory");
        goto fail;
    }
    c->ctl = c->out_fd = c->err_fd = c->exit_fd = -1;
    c->exit_record = -1;
    if (channels_open(&ch, spec, use_pidfd, err) != 0) goto fail;
    char program_buf[PATH_MAX];
    const char *program = keeper_program(program_buf, sizeof program_buf);
    if (keeper_prepare(k, spec, path, &ch, fallbacks, program) != 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: preparing its keeper: %s",
                    strerror(errno));
        keeper_release(k);
        k = NULL;
        goto fail;
    }
    c->keeper = fork_keeper(k);
    int fork_errno = errno;
    keeper_release(k);
    k = NULL;
    hvd_close_fd(&ch.sv[1]);
    hvd_close_fd(&ch.out[1]);
    hvd_close_fd(&ch.errp[1]);
    hvd_close_fd(&ch.done[1]);
    if (c->keeper < 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: fork failed: %s",
                    strerror(fork_errno));
        goto fail;
    }
    if (adopt_channels(c, &ch, use_pidfd, err) != 0 || await_shell(c, path, program, err) != 0)
        goto fail;
    free(path);
    return c;

fail:
    if (c) {
        hvd_close_fd(&c->ctl);
        hvd_close_fd(&c->out_fd);
        hvd_close_fd(&c->err_fd);
        hvd_close_fd(&c->exit_fd);
    }
    channels_close(&ch);
    free(path);
    free(k);
    free(c);
    return NULL;
}

int hvd_proc_stdout_fd(const hvd_proc *c) {
    return c->out_fd;
}

int hvd_proc_stderr_fd(const hvd_proc *c) {
    return c->err_fd;
}

int hvd_proc_exit_fd(const hvd_proc *c) {
    return c->exit_fd;
}

int hvd_proc_exit_signal(const hvd_proc *c) {
    return c->ended ? c->exit_signal : 0;
}

pid_t hvd_proc_pid(const hvd_proc *c) {
    return c->shell;
}

pid_t hvd_proc_pgid(const hvd_proc *c) {
    return c->shell;
}

pid_t hvd_proc_keeper_pid(const hvd_proc *c) {
    return c->keeper;
}

/* Whether the done pipe (exit fd without pidfd) is at end-of-file: the keeper is exiting. */
static int done_pipe_closed(const hvd_proc *c) {
    char b;
    ssize_t n;
    while ((n = read(c->exit_fd, &b, 1)) < 0 && errno == EINTR) {
    }
    return n == 0;
}

int hvd_proc_reap(hvd_proc *c, int *exit_code) {
    if (!c->ended) {
        siginfo_t si;
        int r;
        for (;;) {
            memset(&si, 0, sizeof si);
            if (c->exit_pidfd)
                r = waitid(WAIT_P_PIDFD, (id_t)c->exit_fd, &si, WEXITED | WNOHANG);
            else
                r = waitid(P_PID, (id_t)c->keeper, &si, WEXITED | WNOHANG);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0 && si.si_pid == 0) {
                if (c->exit_pidfd || !done_pipe_closed(c)) return 1;
                /* The keeper has closed its descriptors, so it is in _exit: wait the few
                 * microseconds until it is a zombie. */
                r = waitid(P_PID, (id_t)c->keeper, &si, WEXITED);
                if (r < 0 && errno == EINTR) continue;
            }
            break;
        }
        int saved = errno;
        drain_ctl(c);
        if ((r == 0 || saved == ECHILD) && c->exit_record >= 0) {
            /* The keeper's report of the command's code, sent just before it exits: it
             * survives someone else reaping the keeper (SIGCHLD ignored in this process,
             * say), and a tool that rewrites the keeper's own exit status (valgrind's
             * --error-exitcode, a sanitizer's exitcode in a forked child). */
            c->exit_code = c->exit_record;
        } else if (r == 0 && si.si_code == CLD_EXITED) {
            c->exit_code = si.si_status; /* the keeper exits with the command's code */
        } else if (r == 0) {
            /* The keeper was killed (it blocks every other signal: SIGKILL, or a crash): its
             * command may live on, re-parented away from us, a job process nobody watches. Its
             * process group goes down now, and the command counts as killed by that SIGKILL. */
            if (c->shell > 0) kill(-c->shell, SIGKILL);
            c->exit_code = 128 + SIGKILL;
            c->exit_signal = SIGKILL;
        } else {
            errno = saved;
            return -1;
        }
        c->ended = 1;
    }
    if (exit_code) *exit_code = c->exit_code;
    return 0;
}

int hvd_proc_wait(hvd_proc *c, int timeout_ms, int *exit_code) {
    int64_t deadline = hvd_now_ms() + timeout_ms;
    for (;;) {
        int r = hvd_proc_reap(c, exit_code);
        if (r <= 0) return r;
        int wait_ms = -1;
        if (timeout_ms >= 0) {
            int64_t left = deadline - hvd_now_ms();
            if (left <= 0) return 1;
            wait_ms = (int)left;
        }
        struct pollfd pf = {.fd = c->exit_fd, .events = POLLIN};
        if (poll(&pf, 1, wait_ms) < 0 && errno != EINTR) return -1;
    }
}

static void send_owner_msg(hvd_proc *c, int32_t tag, int32_t value) {
    if (c->ended || c->ctl < 0) return;
    struct ctl_msg m = {tag, value, 0};
    /* Fails harmlessly (EPIPE, no SIGPIPE) if the keeper has already exited. */
    while (send(c->ctl, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EINTR) {
    }
}

void hvd_proc_abort(hvd_proc *c) {
    hvd_proc_abort_within(c, -1);
}

void hvd_proc_abort_within(hvd_proc *c, int grace_ms) {
    send_owner_msg(c, MSG_ABORT, grace_ms < 0 ? -1 : grace_ms);
}

void hvd_proc_kill(hvd_proc *c) {
    send_owner_msg(c, MSG_KILL, 0);
}

void hvd_proc_free(hvd_proc *c) {
    if (!c) return;
    if (!c->ended) {
        /* Closing the pipes first unblocks writers (EPIPE) so that they end sooner. */
        hvd_close_fd(&c->out_fd);
        hvd_close_fd(&c->err_fd);
        hvd_proc_abort(c);
        while (hvd_proc_wait(c, -1, NULL) > 0) {
        }
    }
    hvd_close_fd(&c->ctl);
    hvd_close_fd(&c->out_fd);
    hvd_close_fd(&c->err_fd);
    hvd_close_fd(&c->exit_fd);
    free(c);
}

long hvd_nofile_ensure(long want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    if (rl.rlim_cur == RLIM_INFINITY) return LONG_MAX;
    if ((long)rl.rlim_cur >= want) return (long)rl.rlim_cur;
    rlim_t to = (rlim_t)want;
    if (rl.rlim_max != RLIM_INFINITY && to > rl.rlim_max) to = rl.rlim_max;
    struct rlimit nl = {to, rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &nl) == 0) rl.rlim_cur = to;
    return (long)rl.rlim_cur;
}
