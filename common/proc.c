/* The process runner: owner side (hvd_proc_*), keeper and command child. See proc.h for
 * the design. Everything from `keeper_main` down runs in forked children of a possibly
 * multithreaded process: only async-signal-safe calls (raw system calls) there, no malloc, no
 * stdio, no locks. The memory those children use is allocated by the owner before fork. */
#include "common/proc.h"

#include <dirent.h>
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

extern char **environ;

/* waitid() id type for a pidfd (Linux 5.4); spelled out for C libraries that predate it. */
#define WAIT_P_PIDFD ((idtype_t)3)

/* How long start waits for the keeper to report the shell's pid. The keeper does a few
 * system calls and one fork, so this only fires if the machine is in deep trouble. */
#define KEEPER_REPORT_TIMEOUT_MS 10000

/* While killing: how often the keeper re-walks /proc for processes forked in the meantime. */
#define KILL_REWALK_MS 50

/* Descendants the keeper tracks during one /proc walk. Beyond this it still signals what it
 * finds, and later rounds pick up the rest as their parents die and they are re-parented. */
#define KEEPER_MAX_TRACKED 8192

/* Bound on /proc walk passes (a pass finds one more level of the tree, in the worst case). */
#define WALK_MAX_PASSES 64

/* Control socket messages (SOCK_SEQPACKET, one struct per packet). */
enum {
    MSG_ABORT = 'A', /* owner -> keeper: abort the command */
    MSG_KILL = 'K',  /* owner -> keeper: kill the command now (no grace period) */
    MSG_PID = 'P',   /* keeper -> owner: value = the shell's pid */
    MSG_FAIL = 'F',  /* keeper -> owner: setup step `value` failed with errno `err` */
    MSG_EXIT = 'X',  /* keeper -> owner: value = exit code, err = the signal that ended the
                        command (0: it exited); sent just before the keeper exits */
};

/* The keeper setup steps that can fail, as reported in MSG_FAIL. */
enum { STEP_FDS, STEP_DEVNULL, STEP_SIGNALFD, STEP_FORK };

struct ctl_msg {
    int32_t tag;   /* MSG_* */
    int32_t value; /* pid, exit code or STEP_* */
    int32_t err;   /* errno for MSG_FAIL */
};

/* Everything the keeper and the command child need, prepared by the owner before fork. */
struct keeper {
    char *sh_argv[4];        /* {"sh", "-c", command, NULL} for a shell command */
    const char *path;        /* the program to exec: "/bin/sh", or argv[0] found in PATH */
    char *const *argv;       /* its arguments: sh_argv, or the spec's argv */
    char *const *envp;       /* the command's environment */
    const char *cwd;         /* working directory or NULL */
    const char *hostname;    /* the command's own hostname (a new UTS namespace), or NULL */
    const char *cleanup_dir; /* emptied and removed by the keeper at the end, or NULL */
    int grace_ms;            /* SIGTERM -> SIGKILL */
    pid_t owner;             /* the owner's pid: the keeper's parent while the owner lives */
    int fallbacks;           /* don't use close_range / pidfd (tests) */
    int ctl;                 /* keeper's end of the control socket (the lifeline) */
    int out_w, err_w;        /* the child's stdout/stderr: pipe write ends, or passed fds */
    int done_w;              /* write end of the done pipe (exit fd without pidfd), or -1 */
    int extra[HVD_PROC_MAX_EXTRA_FDS]; /* the command's descriptors 3.. (spec.extra_fds) */
    int n_extra;
    pid_t self;                        /* the keeper's own pid */
    pid_t shell;                       /* the command child's pid */
    size_t n_tracked;                  /* used entries of tracked[] */
    pid_t tracked[KEEPER_MAX_TRACKED]; /* the keeper and its descendants found so far */
    _Alignas(8) char dents[8192];      /* getdents64 buffer */
};

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

/* Parses a decimal process id or descriptor number; -1 if s is not one. */
static long parse_num(const char *s) {
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 0x7fffffff / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
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
                long fd = parse_num(d->d_name);
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

/* Reads the parent pid and state letter of process `name` (a /proc entry) through the
 * /proc directory descriptor. Returns 0, or -1 if the process is gone. */
static int read_stat(int proc, const char *name, pid_t *ppid, char *state) {
    char path[32];
    size_t n = str_len(name);
    if (n > sizeof path - 6) return -1;
    for (size_t i = 0; i < n; i++)
        path[i] = name[i];
    const char *tail = "/stat";
    for (size_t i = 0; i <= 5; i++)
        path[n + i] = tail[i];
    int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[512];
    ssize_t len;
    do {
        len = read(fd, buf, sizeof buf - 1);
    } while (len < 0 && errno == EINTR);
    close(fd);
    if (len <= 0) return -1;
    /* "pid (comm) S ppid ...": comm may contain anything, so look for the last ')'. */
    ssize_t r = len - 1;
    while (r >= 0 && buf[r] != ')')
        r--;
    if (r < 0 || r + 4 >= len) return -1;
    *state = buf[r + 2];
    long v = 0;
    for (ssize_t i = r + 4; i < len && buf[i] >= '0' && buf[i] <= '9'; i++)
        v = v * 10 + (buf[i] - '0');
    *ppid = (pid_t)v;
    return 0;
}

static int is_tracked(const struct keeper *k, pid_t pid) {
    for (size_t i = 0; i < k->n_tracked; i++)
        if (k->tracked[i] == pid) return 1;
    return 0;
}

/* Sends sig to pid, which a /proc read just showed to be a descendant. With a pidfd, the
 * process is pinned first and re-checked, so a recycled pid is never signalled. */
static void signal_descendant(struct keeper *k, int proc, const char *name, pid_t pid, int sig) {
    if (!k->fallbacks) {
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pfd >= 0) {
            pid_t ppid;
            char state;
            if (read_stat(proc, name, &ppid, &state) == 0 && is_tracked(k, ppid))
                syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0);
            close(pfd);
            return;
        }
        if (errno == ESRCH) return;
    }
    kill(pid, sig);
}

/* Sends sig to every live descendant of the keeper: scans /proc for processes whose parent is
 * the keeper or an already found descendant, until a pass finds no new one. Returns how many
 * processes were signalled. */
static int signal_tree(struct keeper *k, int sig) {
    int signalled = 0;
    k->tracked[0] = k->self;
    k->n_tracked = 1;
    for (int pass = 0; pass < WALK_MAX_PASSES; pass++) {
        int found = 0;
        int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (proc < 0) return signalled;
        long n;
        while ((n = syscall(SYS_getdents64, proc, k->dents, sizeof k->dents)) > 0) {
            for (long off = 0; off < n;) {
                struct dirent64 *d = (struct dirent64 *)(void *)(k->dents + off);
                off += d->d_reclen;
                long pid = parse_num(d->d_name);
                pid_t ppid;
                char state;
                if (pid <= 0 || is_tracked(k, (pid_t)pid)) continue;
                if (read_stat(proc, d->d_name, &ppid, &state) != 0 || !is_tracked(k, ppid))
                    continue;
                if (k->n_tracked < KEEPER_MAX_TRACKED) k->tracked[k->n_tracked++] = (pid_t)pid;
                found = 1;
                if (state == 'Z' || state == 'X') continue; /* dead, waiting to be reaped */
                signal_descendant(k, proc, d->d_name, (pid_t)pid, sig);
                signalled++;
            }
        }
        close(proc);
        if (!found) break;
    }
    return signalled;
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

/* Leaves the owner's signal dispositions, session and descriptors behind; reports a failing
 * step to the owner and exits. Returns the signalfd for SIGCHLD and the parent-death signal.
 * Signals arrive blocked (the owner blocked them all around fork) and stay blocked: those two
 * are read through the signalfd, the rest stay pending forever, which is how the keeper
 * ignores SIGINT, SIGTERM and SIGHUP. */
static int keeper_setup(struct keeper *k) {
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
    prctl(PR_SET_NAME, "hvd-keeper"); /* for ps/top; argv still shows the owner's */
    k->self = getpid();

    int fds[4 + HVD_PROC_MAX_EXTRA_FDS] = {k->ctl, k->out_w, k->err_w, k->done_w};
    for (int i = 0; i < k->n_extra; i++)
        fds[4 + i] = k->extra[i];
    int r = keeper_fds(fds, 4 + k->n_extra, k->fallbacks);
    k->ctl = fds[0];
    k->out_w = fds[1];
    k->err_w = fds[2];
    k->done_w = fds[3];
    for (int i = 0; i < k->n_extra; i++)
        k->extra[i] = fds[4 + i];
    if (r < 0) {
        send_msg(k->ctl, MSG_FAIL, r == -1 ? STEP_FDS : STEP_DEVNULL, errno);
        child_exit(127);
    }
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

/* SIGTERM (and SIGCONT: stopped processes must run to handle it) to the command's group and
 * every descendant; SIGKILL follows after grace_ms. */
static void keeper_terminate(struct keeper *k, struct keeper_state *ks, int grace_ms) {
    ks->state = K_TERMINATING;
    ks->deadline = hvd_now_ms() + grace_ms;
    if (!ks->shell_done) {
        kill(-k->shell, SIGTERM);
        kill(-k->shell, SIGCONT);
    }
    signal_tree(k, SIGTERM);
    signal_tree(k, SIGCONT);
}

__attribute__((noreturn)) static void keeper_main(struct keeper *k) {
    struct keeper_state ks = {.state = K_RUNNING, .ctl_open = 1};
    ks.sfd = keeper_setup(k);
    keeper_spawn(k);
    for (;;) {
        keeper_reap(k, &ks);
        if (ks.state == K_TERMINATING && hvd_now_ms() >= ks.deadline) ks.state = K_KILLING;
        if (ks.state == K_KILLING) {
            /* The child's pid, and so its group id, stays ours until we reap it. */
            if (!ks.shell_done) kill(-k->shell, SIGKILL);
            signal_tree(k, SIGKILL);
        }
        int grace = keeper_wait(k, &ks);
        if (grace >= 0 && ks.state == K_RUNNING)
            keeper_terminate(k, &ks, grace);
        else if (grace >= 0 && ks.state == K_TERMINATING && hvd_now_ms() + grace < ks.deadline)
            ks.deadline = hvd_now_ms() + grace; /* a second abort that cannot wait as long */
    }
}

/* ------------------------------------------------------------------------------------------
 * Owner side. */

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
static int await_shell(hvd_proc *c, const char *path, hvd_err *err) {
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
    if (n == (ssize_t)sizeof m && m.tag == MSG_FAIL) {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "cannot start the command: its keeper process could not %s: %s",
                    step_name(m.value), strerror(m.err));
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

/* Fills the keeper's instructions from the spec and the channels. */
static void keeper_prepare(struct keeper *k, const hvd_proc_spec *spec, char *path,
                           const channels *ch, int fallbacks) {
    memset(k, 0, offsetof(struct keeper, tracked));
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
    k->ctl = ch->sv[1];
    k->out_w = spec->pass_stdout ? spec->stdout_fd : ch->out[1];
    k->err_w = spec->pass_stderr ? spec->stderr_fd : ch->errp[1];
    k->done_w = ch->done[1];
    k->n_extra = spec->n_extra_fds;
    for (int i = 0; i < k->n_extra; i++)
        k->extra[i] = spec->extra_fds[i];
}

/* Forks the keeper with every signal blocked (no handler of ours may run in the child before
 * it has reset them). Returns its pid, or -1 with errno. */
static pid_t fork_keeper(struct keeper *k) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) keeper_main(k);
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
    keeper_prepare(k, spec, path, &ch, fallbacks);
    c->keeper = fork_keeper(k);
    int fork_errno = errno;
    free(k);
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
    if (adopt_channels(c, &ch, use_pidfd, err) != 0 || await_shell(c, path, err) != 0) goto fail;
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
