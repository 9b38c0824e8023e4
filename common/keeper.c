/* The keeper of one command: everything from its start in the owner's forked child to its
 * exit, exec'd as hvd-keeper (keeper_main.c) or in place (keeper.h). Only async-signal-safe
 * calls (raw system calls) in the code the forked child runs: no malloc, no stdio, no locks.
 * The memory it uses is allocated by the owner before fork. */
#include "keeper.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/io.h"
#include "common/num.h"

extern char **environ;

/* While killing: how often the keeper re-walks /proc for processes forked in the meantime. */
#define KILL_REWALK_MS 50

static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 255;
}

/* ------------------------------------------------------------------------------------------
 * Async-signal-safe helpers, used in the forked children. */

/* _exit, as the raw system call: sanitizers intercept _exit and may replace a status of 0
 * with their own (TSan: 66 after a report inherited from the owner). */
__attribute__((noreturn)) static void child_exit(int code) {
    for (;;)
        syscall(SYS_exit_group, code);
}

static size_t str_len(const char *s) {
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

/* Writes "hvd-task: cannot <what> <arg>: errno <e>\n" to fd. */
static void child_report(int fd, const char *what, const char *arg, int e) {
    char num[16];
    size_t i = sizeof num;
    unsigned v = (unsigned)e;
    do {
        num[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    (void)hvd_write_all(fd, "hvd-task: cannot ", 17);
    (void)hvd_write_all(fd, what, str_len(what));
    (void)hvd_write_all(fd, " ", 1);
    (void)hvd_write_all(fd, arg, str_len(arg));
    (void)hvd_write_all(fd, ": errno ", 8);
    (void)hvd_write_all(fd, num + i, sizeof num - i);
    (void)hvd_write_all(fd, "\n", 1);
}

/* Closes every descriptor >= lowfd. */
static void close_from(int lowfd, int fallbacks) {
#ifdef SYS_close_range
    if (!fallbacks && syscall(SYS_close_range, (unsigned)lowfd, ~0U, 0) == 0) return;
#endif
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        _Alignas(8) char buf[1024];
        long n;
        while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
                off += d->d_reclen;
                long fd = hvd_parse_digits(d->d_name);
                if (fd >= lowfd && fd != dir) close((int)fd);
            }
        }
        close(dir);
        return;
    }
    struct rlimit rl;
    long max = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) max = (long)rl.rlim_cur;
    if (max > (1L << 20)) max = 1L << 20;
    for (long fd = lowfd; fd < max; fd++)
        close((int)fd);
}

static void send_msg(int fd, int tag, int value, int err) {
    struct ctl_msg m = {tag, value, err};
    while (send(fd, &m, sizeof m, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

/* Moves fds[0..n) (entries < 0 are skipped) to descriptors 3..3+n-1, close-on-exec, closes
 * every other descriptor >= 3, and points 0, 1 and 2 at /dev/null. */
static int keeper_fds(int *fds, int n, int fallbacks) {
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3 + n);
        if (fds[i] < 0) return -1;
    }
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) {
            close(3 + i);
            continue;
        }
        if (dup3(fds[i], 3 + i, O_CLOEXEC) < 0) return -1;
        fds[i] = 3 + i;
    }
    close_from(3 + n, fallbacks);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0) return -2;
    for (int fd = 0; fd <= 2; fd++)
        if (null != fd && dup2(null, fd) < 0) return -2;
    if (null > 2) close(null);
    return 0;
}

/* The command child: new session, stdio, no other descriptor, exec the program (/bin/sh for a
 * shell command). `sync` is closed once the session exists. */
__attribute__((noreturn)) static void shell_main(const struct keeper *k, int sync) {
    setsid(); /* cannot fail: a fresh child is no process group leader */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sync);                               /* tells the keeper that we are in our own session */
    if (getppid() != k->self) child_exit(127); /* the keeper died already */
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, 0) < 0 || dup2(k->out_w, 1) < 0 || dup2(k->err_w, 2) < 0) {
        child_report(k->err_w, "set up stdio for", k->path, errno);
        child_exit(127);
    }
    /* The extra descriptors sit above the keeper's four (keeper_fds), so moving them down in
     * order never overwrites one not yet moved. dup2 clears close-on-exec. */
    for (int i = 0; i < k->n_extra; i++)
        if (dup2(k->extra[i], 3 + i) < 0) {
            child_report(2, "pass a descriptor to", k->path, errno);
            child_exit(127);
        }
    close_from(3 + k->n_extra, k->fallbacks);
    if (k->cwd && chdir(k->cwd) != 0) {
        child_report(2, "change to directory", k->cwd, errno);
        child_exit(127);
    }
    if (k->hostname &&
        (unshare(CLONE_NEWUTS) != 0 || sethostname(k->hostname, strlen(k->hostname)) != 0)) {
        child_report(2, "give a hostname of its own (UTS namespace) to", k->path, errno);
        child_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(k->path, k->argv, k->envp);
    child_report(2, "run", k->path, errno);
    child_exit(127);
}

enum { K_RUNNING, K_TERMINATING, K_KILLING };

/* What the keeper's loop tracks. */
struct keeper_state {
    int state;        /* K_* */
    int ctl_open;     /* the lifeline is still connected */
    int shell_done;   /* the command child has been reaped */
    int shell_status; /* its wait status */
    int64_t deadline; /* K_TERMINATING: when SIGKILL follows */
    int sfd;          /* signalfd: SIGCHLD and the parent-death signal */
};

/* Empties and removes k->cleanup_dir (Open MPI's session and shared-memory files). */
static void remove_cleanup_dir(struct keeper *k) {
    if (!k->cleanup_dir) return;
    int dir = open(k->cleanup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir < 0) return;
    hvd_empty_dir_at(dir);
    close(dir);
    rmdir(k->cleanup_dir);
}

/* Moves the keeper's descriptors to their fixed places (KEEPER_FD_*, close-on-exec), closes
 * every other one and points 0, 1 and 2 at /dev/null; reports a failure to the owner and
 * exits. */
/* The keeper's descriptors in the order of KEEPER_FD_*, in fds; returns how many. */
static int keeper_fd_list(const struct keeper *k, int *fds) {
    fds[0] = k->ctl;
    fds[1] = k->out_w;
    fds[2] = k->err_w;
    fds[3] = k->done_w;
    fds[4] = k->env_fd;
    for (int i = 0; i < k->n_extra; i++)
        fds[KEEPER_FIXED_FDS + i] = k->extra[i];
    return KEEPER_FIXED_FDS + k->n_extra;
}

static void keeper_arrange_fds(struct keeper *k) {
    int fds[KEEPER_FIXED_FDS + HVD_PROC_MAX_EXTRA_FDS];
    int r = keeper_fds(fds, keeper_fd_list(k, fds), k->fallbacks);
    k->ctl = fds[0];
    k->out_w = fds[1];
    k->err_w = fds[2];
    k->done_w = fds[3];
    k->env_fd = fds[4];
    for (int i = 0; i < k->n_extra; i++)
        k->extra[i] = fds[KEEPER_FIXED_FDS + i];
    if (r < 0) {
        send_msg(k->ctl, MSG_FAIL, r == -1 ? STEP_FDS : STEP_DEVNULL, errno);
        child_exit(127);
    }
}

/* Leaves the owner's signal dispositions and session behind; reports a failing step to the
 * owner and exits. Returns the signalfd for SIGCHLD and the parent-death signal. Signals
 * arrive blocked (the owner blocked them all around fork, and exec keeps the mask) and stay
 * blocked: those two are read through the signalfd, the rest stay pending forever, which is
 * how the keeper ignores SIGINT, SIGTERM and SIGHUP. */
static int keeper_settle(struct keeper *k) {
    /* The owner's handlers must never run here, and dispositions are inherited by the
     * command: SIG_IGN would survive exec, and SIGCHLD ignored would auto-reap our children. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);

    setsid(); /* out of the owner's process group: group signals to the owner miss us */
    prctl(PR_SET_PDEATHSIG, SIGUSR1);
    if (getppid() != k->owner) child_exit(1); /* the owner died before we started anything */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    prctl(PR_SET_NAME, "hvd-keeper"); /* for ps/top (in place, argv still shows the owner's) */
    k->self = getpid();
    k->tree.root = k->self;
    k->tree.fallbacks = k->fallbacks;

    sigset_t watched;
    sigemptyset(&watched);
    sigaddset(&watched, SIGCHLD);
    sigaddset(&watched, SIGUSR1);
    int sfd = signalfd(-1, &watched, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        send_msg(k->ctl, MSG_FAIL, STEP_SIGNALFD, errno);
        child_exit(127);
    }
    return sfd;
}

/* Forks the command child and tells the owner its pid once it leads its own session and
 * group (the child closes its end of a pipe when it does). */
static void keeper_spawn(struct keeper *k) {
    int sync[2];
    if (pipe2(sync, O_CLOEXEC) != 0) {
        send_msg(k->ctl, MSG_FAIL, STEP_FDS, errno);
        child_exit(127);
    }
    k->shell = fork();
    if (k->shell == 0) {
        close(sync[0]);
        shell_main(k, sync[1]);
    }
    if (k->shell < 0) {
        send_msg(k->ctl, MSG_FAIL, STEP_FORK, errno);
        child_exit(127);
    }
    close(sync[1]);
    char b;
    while (read(sync[0], &b, 1) < 0 && errno == EINTR) {
    }
    close(sync[0]);
    send_msg(k->ctl, MSG_PID, k->shell, 0);
    /* Only the command holds its output and extra descriptors now: their readers see
     * end-of-file when it and its descendants are done with them. */
    close(k->out_w);
    close(k->err_w);
    for (int i = 0; i < k->n_extra; i++)
        close(k->extra[i]);
}

/* Reaps everything that has exited; once the command child and every descendant are gone, the
 * command has ended: cleans up, reports the exit code and exits. */
static void keeper_reap(struct keeper *k, struct keeper_state *ks) {
    for (;;) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            if (p == k->shell) {
                ks->shell_done = 1;
                ks->shell_status = status;
            }
            continue;
        }
        if (p < 0 && errno == EINTR) continue;
        if (p < 0 && errno == ECHILD) {
            int code = exit_code_of(ks->shell_status);
            int sig = WIFSIGNALED(ks->shell_status) ? WTERMSIG(ks->shell_status) : 0;
            remove_cleanup_dir(k);
            send_msg(k->ctl, MSG_EXIT, code, sig);
            child_exit(code);
        }
        return;
    }
}

/* Waits for a signal, an owner message or the next kill round. Returns the grace period (ms)
 * of an abort when the command must be aborted: the owner asked (with its grace, or ours),
 * or is gone (lifeline cut, or our parent changed); -1 otherwise. An owner that asks for the
 * command's end now (MSG_KILL) moves the keeper to its killing state directly. */
static int keeper_wait(struct keeper *k, struct keeper_state *ks) {
    struct pollfd pf[2] = {{.fd = ks->sfd, .events = POLLIN}, {.fd = k->ctl, .events = POLLIN}};
    int timeout = ks->state == K_TERMINATING ? hvd_ms_left(ks->deadline)
                  : ks->state == K_KILLING   ? KILL_REWALK_MS
                                             : -1;
    if (poll(pf, ks->ctl_open ? 2 : 1, timeout) < 0) return -1;
    int grace = -1;
    if (pf[0].revents) {
        struct signalfd_siginfo si;
        while (read(ks->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            /* Parent-death signal: also sent when just the forking thread exits, in which
             * case the owner process, our parent, is still there. */
            if (si.ssi_signo == SIGUSR1 && getppid() != k->owner) grace = k->grace_ms;
        }
    }
    if (ks->ctl_open && pf[1].revents) {
        struct ctl_msg m;
        ssize_t n = recv(k->ctl, &m, sizeof m, MSG_DONTWAIT);
        if (n == (ssize_t)sizeof m && m.tag == MSG_ABORT) {
            grace = m.value >= 0 ? m.value : k->grace_ms;
        } else if (n == (ssize_t)sizeof m && m.tag == MSG_KILL) {
            ks->state = K_KILLING; /* SIGKILL in the next round, right away */
        } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            ks->ctl_open = 0; /* lifeline cut: the owner is gone */
            grace = k->grace_ms;
        }
    }
    return grace;
}

/* SIGTERM to the command's group and every descendant, and SIGCONT to the stopped ones among
 * the descendants (they must run to handle it; the command's group descends from the keeper
 * too); SIGKILL follows after grace_ms. */
static void keeper_terminate(struct keeper *k, struct keeper_state *ks, int grace_ms) {
    ks->state = K_TERMINATING;
    ks->deadline = hvd_now_ms() + grace_ms;
    if (!ks->shell_done) kill(-k->shell, SIGTERM);
    hvd_proctree_signal(&k->tree, SIGTERM);
    hvd_proctree_signal(&k->tree, SIGCONT);
}

void hvd_keeper_run(struct keeper *k) {
    struct keeper_state ks = {.state = K_RUNNING, .ctl_open = 1};
    ks.sfd = keeper_settle(k);
    keeper_spawn(k);
    for (;;) {
        keeper_reap(k, &ks);
        /* The command's own process ended and something of it is left (keeper_reap returned):
         * with end_with_command, that is stopped instead of waited for. */
        if (k->end_with_command && ks.shell_done && ks.state == K_RUNNING)
            keeper_terminate(k, &ks, k->grace_ms);
        if (ks.state == K_TERMINATING && hvd_now_ms() >= ks.deadline) ks.state = K_KILLING;
        if (ks.state == K_KILLING) {
            /* The child's pid, and so its group id, stays ours until we reap it. */
            if (!ks.shell_done) kill(-k->shell, SIGKILL);
            hvd_proctree_signal(&k->tree, SIGKILL);
        }
        int grace = keeper_wait(k, &ks);
        if (grace >= 0 && ks.state == K_RUNNING)
            keeper_terminate(k, &ks, grace);
        else if (grace >= 0 && ks.state == K_TERMINATING && hvd_now_ms() + grace < ks.deadline)
            ks.deadline = hvd_now_ms() + grace; /* a second abort that cannot wait as long */
    }
}

/* Clears close-on-exec on the keeper's descriptors, for the keeper program. */
static int keep_across_exec(const struct keeper *k) {
    int fds[KEEPER_FIXED_FDS + HVD_PROC_MAX_EXTRA_FDS];
    int n = keeper_fd_list(k, fds);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0 && fcntl(fds[i], F_SETFD, 0) != 0) return -1;
    return 0;
}

void hvd_keeper_start(struct keeper *k) {
    keeper_arrange_fds(k);
    if (!k->program) hvd_keeper_run(k);
    /* The keeper's own environment is the owner's, as for a forked keeper. */
    if (keep_across_exec(k) == 0) execve(k->program, k->program_argv, environ);
    send_msg(k->ctl, MSG_FAIL, STEP_EXEC, errno);
    child_exit(127);
}

/* ------------------------------------------------------------------------------------------
 * The keeper program's arguments:
 *   hvd-keeper --owner PID --grace-ms MS --extra-fds N [--done-pipe] [--fallbacks]
 *              [--end-with-command] [--cwd DIR] [--hostname NAME] [--cleanup-dir DIR]
 *              -- PROGRAM ARGV0 [ARG...]
 * and its descriptors KEEPER_FD_* (--done-pipe: KEEPER_FD_DONE is open; the command's
 * environment comes through KEEPER_FD_ENV). */

#define NUMBERS_LEN 64 /* room for the three numbers' text */

char **hvd_keeper_argv(const struct keeper *k) {
    size_t argc = 0;
    while (k->argv[argc])
        argc++;
    size_t n = 1 + 6 + 3 + 6 + 2 + argc + 1;
    char **v = malloc(n * sizeof *v + NUMBERS_LEN);
    if (!v) return NULL;
    char *num = (char *)(v + n);
    size_t i = 0;
    v[i++] = "hvd-keeper";
    const char *names[3] = {"--owner", "--grace-ms", "--extra-fds"};
    long values[3] = {(long)k->owner, (long)k->grace_ms, (long)k->n_extra};
    for (int j = 0; j < 3; j++) {
        v[i++] = (char *)names[j];
        v[i++] = num;
        num += snprintf(num, NUMBERS_LEN / 3, "%ld", values[j]) + 1;
    }
    if (k->done_w >= 0) v[i++] = "--done-pipe";
    if (k->fallbacks) v[i++] = "--fallbacks";
    if (k->end_with_command) v[i++] = "--end-with-command";
    const char *opt_names[3] = {"--cwd", "--hostname", "--cleanup-dir"};
    const char *opt_values[3] = {k->cwd, k->hostname, k->cleanup_dir};
    for (int j = 0; j < 3; j++)
        if (opt_values[j]) {
            v[i++] = (char *)opt_names[j];
            v[i++] = (char *)opt_values[j];
        }
    v[i++] = "--";
    v[i++] = (char *)k->path;
    for (size_t j = 0; j < argc; j++)
        v[i++] = k->argv[j];
    v[i] = NULL;
    return v;
}

int hvd_keeper_env_fd(char *const *envp) {
    int fd = memfd_create("hvd-keeper-env", MFD_CLOEXEC);
    if (fd < 0) return -1;
    for (size_t i = 0; envp[i]; i++)
        if (hvd_write_all(fd, envp[i], strlen(envp[i]) + 1) != 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    return fd;
}

/* Reads the command's environment from fd (hvd_keeper_env_fd): a malloc'd NULL-terminated
 * array into one malloc'd block of strings, kept for the keeper's life. NULL on failure. */
static char **read_env(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0) return NULL;
    size_t len = (size_t)st.st_size;
    char *block = malloc(len + 1);
    if (!block) return NULL;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, block + got, len - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(block);
            return NULL;
        }
        got += (size_t)n;
    }
    block[len] = '\0';
    size_t count = 0;
    for (size_t i = 0; i < len; i++)
        count += block[i] == '\0';
    char **env = malloc((count + 1) * sizeof *env);
    if (!env) {
        free(block);
        return NULL;
    }
    size_t j = 0;
    for (size_t i = 0; i < len; i += strlen(block + i) + 1)
        env[j++] = block + i;
    env[j] = NULL;
    return env;
}

/* A whole decimal number in [0, max]; -1 if s is not one. */
static long arg_num(const char *s, long max) {
    long v = hvd_parse_digits(s);
    return v > max ? -1 : v;
}

int hvd_keeper_parse_argv(struct keeper *k, int argc, char **argv, char *why, size_t why_len) {
    memset(k, 0, offsetof(struct keeper, tree));
    k->owner = -1;
    k->grace_ms = -1;
    k->n_extra = -1;
    int done_pipe = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--done-pipe") == 0) {
            done_pipe = 1;
            continue;
        }
        if (strcmp(o, "--fallbacks") == 0) {
            k->fallbacks = 1;
            continue;
        }
        if (strcmp(o, "--end-with-command") == 0) {
            k->end_with_command = 1;
            continue;
        }
        if (!v) break;
        i++;
        if (strcmp(o, "--owner") == 0)
            k->owner = (pid_t)arg_num(v, INT_MAX);
        else if (strcmp(o, "--grace-ms") == 0)
            k->grace_ms = (int)arg_num(v, INT_MAX);
        else if (strcmp(o, "--extra-fds") == 0)
            k->n_extra = (int)arg_num(v, HVD_PROC_MAX_EXTRA_FDS);
        else if (strcmp(o, "--cwd") == 0)
            k->cwd = v;
        else if (strcmp(o, "--hostname") == 0)
            k->hostname = v;
        else if (strcmp(o, "--cleanup-dir") == 0)
            k->cleanup_dir = v;
        else {
            snprintf(why, why_len, "unknown option '%s'", o);
            return -1;
        }
    }
    if (k->owner <= 0 || k->grace_ms < 0 || k->n_extra < 0 || i + 2 >= argc ||
        strcmp(argv[i], "--") != 0) {
        snprintf(why, why_len, "needs --owner, --grace-ms, --extra-fds and '-- PROGRAM ARGV0'");
        return -1;
    }
    k->path = argv[i + 1];
    k->argv = argv + i + 2;
    if (!(k->envp = read_env(KEEPER_FD_ENV))) {
        snprintf(why, why_len, "cannot read the command's environment from descriptor %d: %s",
                 KEEPER_FD_ENV, strerror(errno));
        return -1;
    }
    close(KEEPER_FD_ENV);
    k->env_fd = -1;
    k->ctl = KEEPER_FD_CTL;
    k->out_w = KEEPER_FD_OUT;
    k->err_w = KEEPER_FD_ERR;
    k->done_w = done_pipe ? KEEPER_FD_DONE : -1;
    for (int j = 0; j < k->n_extra; j++)
        k->extra[j] = KEEPER_FD_EXTRA + j;
    for (int fd = KEEPER_FD_CTL; fd < KEEPER_FD_EXTRA + k->n_extra; fd++)
        if ((fd != KEEPER_FD_DONE || done_pipe) && fd != KEEPER_FD_ENV &&
            fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
            snprintf(why, why_len, "descriptor %d is not open (%s)", fd, strerror(errno));
            return -1;
        }
    return 0;
}
