/* The process runner: owner side (hvd_command_*), keeper and shell child. See command.h for
 * the design. Everything from `keeper_main` down runs in forked children of a possibly
 * multithreaded process: only async-signal-safe calls (raw system calls) there, no malloc, no
 * stdio, no locks. The memory those children use is allocated by the owner before fork. */
#include "command.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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
    MSG_PID = 'P',   /* keeper -> owner: value = the shell's pid */
    MSG_FAIL = 'F',  /* keeper -> owner: setup step `value` failed with errno `err` */
    MSG_EXIT = 'X',  /* keeper -> owner: value = exit code; sent just before the keeper exits */
};

/* The keeper setup steps that can fail, as reported in MSG_FAIL. */
enum { STEP_FDS, STEP_DEVNULL, STEP_SIGNALFD, STEP_FORK };

struct ctl_msg {
    int32_t tag;   /* MSG_* */
    int32_t value; /* pid, exit code or STEP_* */
    int32_t err;   /* errno for MSG_FAIL */
};

/* Everything the keeper and the shell child need, prepared by the owner before fork. */
struct keeper {
    char *argv[4];           /* {"sh", "-c", command, NULL} */
    char *const *envp;       /* the command's environment */
    const char *cwd;         /* working directory or NULL */
    const char *cleanup_dir; /* emptied and removed by the keeper at the end, or NULL */
    int grace_ms;            /* SIGTERM -> SIGKILL */
    pid_t owner;             /* the owner's pid: the keeper's parent while the owner lives */
    int fallbacks;           /* don't use close_range / pidfd (tests) */
    int ctl;                 /* keeper's end of the control socket (the lifeline) */
    int out_w, err_w;        /* write ends of the stdout/stderr pipes, for the shell */
    int done_w;              /* write end of the done pipe (exit fd without pidfd), or -1 */
    pid_t self;              /* the keeper's own pid */
    pid_t shell;             /* the shell's pid */
    size_t n_tracked;        /* used entries of tracked[] */
    pid_t tracked[KEEPER_MAX_TRACKED]; /* the keeper and its descendants found so far */
    _Alignas(8) char dents[8192];      /* getdents64 buffer */
};

struct hvd_command {
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
};

static atomic_int force_fallbacks;

void hvd_command_force_fallbacks(int on) {
    atomic_store(&force_fallbacks, on);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

static void write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
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
    write_all(fd, "hvd-task: cannot ", 17);
    write_all(fd, what, str_len(what));
    write_all(fd, " ", 1);
    write_all(fd, arg, str_len(arg));
    write_all(fd, ": errno ", 8);
    write_all(fd, num + i, sizeof num - i);
    write_all(fd, "\n", 1);
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

/* The shell child: new session, stdio, no other descriptor, exec /bin/sh. `sync` is closed
 * once the session exists. */
__attribute__((noreturn)) static void shell_main(const struct keeper *k, int sync) {
    setsid(); /* cannot fail: a fresh child is no process group leader */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sync);                               /* tells the keeper that we are in our own session */
    if (getppid() != k->self) child_exit(127); /* the keeper died already */
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, 0) < 0 || dup2(k->out_w, 1) < 0 || dup2(k->err_w, 2) < 0) {
        child_report(k->err_w, "set up stdio for", "/bin/sh", errno);
        child_exit(127);
    }
    close_from(3, k->fallbacks);
    if (k->cwd && chdir(k->cwd) != 0) {
        child_report(2, "change to directory", k->cwd, errno);
        child_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve("/bin/sh", k->argv, k->envp);
    child_report(2, "run", "/bin/sh", errno);
    child_exit(127);
}

enum { K_RUNNING, K_TERMINATING, K_KILLING };

/* The keeper. Signals arrive blocked (the owner blocked them all around fork) and stay
 * blocked: SIGCHLD and the parent-death signal are read through a signalfd, the rest stay
 * pending forever, which is how the keeper ignores SIGINT, SIGTERM and SIGHUP. */
/* Removes everything below the directory open as dir (at most 8 levels deep), with system
 * calls only and a buffer per level on the stack. Stops when a pass removes nothing. */
static void remove_tree(int dir, int depth) {
    _Alignas(8) char buf[4096];
    for (int pass = 0; pass < 64; pass++) { /* entries vanish while we read: re-read */
        int removed = 0;
        long n;
        lseek(dir, 0, SEEK_SET);
        while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct {
                    uint64_t ino;
                    int64_t off;
                    unsigned short reclen;
                    unsigned char type;
                    char name[];
                } *e = (void *)(buf + off);
                off += e->reclen;
                if (e->name[0] == '.' &&
                    (e->name[1] == '\0' || (e->name[1] == '.' && e->name[2] == '\0')))
                    continue;
                if (unlinkat(dir, e->name, 0) == 0) {
                    removed = 1;
                    continue;
                }
                if (depth >= 8) continue;
                int sub = openat(dir, e->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sub < 0) continue;
                remove_tree(sub, depth + 1);
                close(sub);
                if (unlinkat(dir, e->name, AT_REMOVEDIR) == 0) removed = 1;
            }
        }
        if (!removed) return;
    }
}

/* Empties and removes k->cleanup_dir (Open MPI's session and shared-memory files). */
static void remove_cleanup_dir(struct keeper *k) {
    if (!k->cleanup_dir) return;
    int dir = open(k->cleanup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir < 0) return;
    remove_tree(dir, 0);
    close(dir);
    rmdir(k->cleanup_dir);
}

__attribute__((noreturn)) static void keeper_main(struct keeper *k) {
    /* The owner's handlers must never run here, and dispositions are inherited by the
     * shell: SIG_IGN would survive exec, and SIGCHLD ignored would auto-reap our children. */
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

    int fds[4] = {k->ctl, k->out_w, k->err_w, k->done_w};
    int r = keeper_fds(fds, 4, k->fallbacks);
    k->ctl = fds[0];
    k->out_w = fds[1];
    k->err_w = fds[2];
    k->done_w = fds[3];
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

    /* The owner is told the shell's pid only once the shell leads its own session and
     * group; the shell closes its end of this pipe when it does. */
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
    close(k->out_w);
    close(k->err_w);

    int state = K_RUNNING, ctl_open = 1, shell_done = 0, shell_status = 0;
    int64_t deadline = 0;
    for (;;) {
        int abort_now = 0;
        for (;;) { /* reap everything that has exited */
            int status;
            pid_t p = waitpid(-1, &status, WNOHANG);
            if (p > 0) {
                if (p == k->shell) {
                    shell_done = 1;
                    shell_status = status;
                }
                continue;
            }
            if (p < 0 && errno == EINTR) continue;
            if (p < 0 && errno == ECHILD) { /* shell and every descendant gone: ended */
                int code = exit_code_of(shell_status);
                remove_cleanup_dir(k);
                send_msg(k->ctl, MSG_EXIT, code, 0);
                child_exit(code);
            }
            break;
        }
        if (state == K_TERMINATING && now_ms() >= deadline) state = K_KILLING;
        if (state == K_KILLING) {
            /* The shell's pid, and so its group id, stays ours until we reap the shell. */
            if (!shell_done) kill(-k->shell, SIGKILL);
            signal_tree(k, SIGKILL);
        }

        struct pollfd pf[2] = {{.fd = sfd, .events = POLLIN}, {.fd = k->ctl, .events = POLLIN}};
        int timeout = -1;
        if (state == K_TERMINATING) {
            int64_t left = deadline - now_ms();
            timeout = left < 0 ? 0 : (int)left;
        } else if (state == K_KILLING) {
            timeout = KILL_REWALK_MS;
        }
        if (poll(pf, ctl_open ? 2 : 1, timeout) < 0) continue;
        if (pf[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                /* Parent-death signal: also sent when just the forking thread exits, in
                 * which case the owner process, our parent, is still there. */
                if (si.ssi_signo == SIGUSR1 && getppid() != k->owner) abort_now = 1;
            }
        }
        if (ctl_open && pf[1].revents) {
            struct ctl_msg m;
            ssize_t n = recv(k->ctl, &m, sizeof m, MSG_DONTWAIT);
            if (n == (ssize_t)sizeof m && m.tag == MSG_ABORT) {
                abort_now = 1;
            } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                ctl_open = 0; /* lifeline cut: the owner is gone */
                abort_now = 1;
            }
        }
        if (abort_now && state == K_RUNNING) {
            state = K_TERMINATING;
            deadline = now_ms() + k->grace_ms;
            if (!shell_done) {
                kill(-k->shell, SIGTERM);
                kill(-k->shell, SIGCONT);
            }
            signal_tree(k, SIGTERM);
            signal_tree(k, SIGCONT); /* stopped processes must run to handle SIGTERM */
        }
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

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
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
        return "fork /bin/sh";
    default:
        return "start";
    }
}

/* Reads the keeper's messages that are queued on ctl; records the exit code. */
static void drain_ctl(hvd_command *c) {
    struct ctl_msg m;
    while (c->ctl >= 0 && recv(c->ctl, &m, sizeof m, MSG_DONTWAIT) == (ssize_t)sizeof m)
        if (m.tag == MSG_EXIT) c->exit_record = m.value;
}

/* Waits for the keeper to report the shell's pid. Returns 0, or -1 with err filled (the
 * keeper has then exited or been killed, and is reaped). */
static int await_shell(hvd_command *c, hvd_err *err) {
    struct ctl_msg m = {0, 0, 0};
    int64_t deadline = now_ms() + KEEPER_REPORT_TIMEOUT_MS;
    ssize_t n = -1;
    for (;;) {
        int64_t left = deadline - now_ms();
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
                    "cannot start the command: its keeper process (pid %d) %s before starting "
                    "/bin/sh",
                    (int)c->keeper, n == 0 ? "exited" : "did not answer");
        kill(c->keeper, SIGKILL);
    }
    while (waitpid(c->keeper, NULL, 0) < 0 && errno == EINTR) {
    }
    return -1;
}

hvd_command *hvd_command_start(const hvd_command_spec *spec, hvd_err *err) {
    if (!spec || !spec->command) {
        hvd_err_set(err, HVD_E_INVALID, "cannot start a command: no command line given");
        return NULL;
    }
    if (spec->grace_ms < 0) {
        hvd_err_set(err, HVD_E_INVALID, "cannot start a command: negative grace period %d ms",
                    spec->grace_ms);
        return NULL;
    }
    if (spec->cwd) {
        struct stat st;
        const char *why = NULL;
        if (stat(spec->cwd, &st) != 0 || access(spec->cwd, X_OK) != 0)
            why = strerror(errno);
        else if (!S_ISDIR(st.st_mode))
            why = "not a directory";
        if (why) {
            hvd_err_set(err, HVD_E_INVALID,
                        "cannot start the command in working directory '%s': %s", spec->cwd, why);
            return NULL;
        }
    }
    int fallbacks = atomic_load(&force_fallbacks);
    int use_pidfd = !fallbacks && pidfd_usable();

    hvd_command *c = calloc(1, sizeof *c);
    struct keeper *k = malloc(sizeof *k);
    int sv[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, done[2] = {-1, -1};
    if (!c || !k) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: out of memory");
        goto fail;
    }
    c->ctl = c->out_fd = c->err_fd = c->exit_fd = -1;
    c->exit_record = -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0 ||
        pipe2(out, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 ||
        (!use_pidfd && pipe2(done, O_CLOEXEC) != 0)) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: creating pipes failed: %s",
                    strerror(errno));
        goto fail;
    }

    memset(k, 0, offsetof(struct keeper, tracked));
    k->argv[0] = "sh";
    k->argv[1] = "-c";
    k->argv[2] = (char *)spec->command;
    k->argv[3] = NULL;
    k->envp = spec->envp ? spec->envp : environ;
    k->cwd = spec->cwd;
    k->cleanup_dir = spec->cleanup_dir;
    k->grace_ms = spec->grace_ms ? spec->grace_ms : HVD_COMMAND_DEFAULT_GRACE_MS;
    k->owner = getpid();
    k->fallbacks = fallbacks;
    k->ctl = sv[1];
    k->out_w = out[1];
    k->err_w = errp[1];
    k->done_w = done[1];

    /* No handler of ours may run in the child before it has reset them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) keeper_main(k);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    free(k);
    k = NULL;
    close_fd(&sv[1]);
    close_fd(&out[1]);
    close_fd(&errp[1]);
    close_fd(&done[1]);
    if (pid < 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: fork failed: %s",
                    strerror(fork_errno));
        goto fail;
    }
    c->keeper = pid;
    c->ctl = sv[0];
    c->out_fd = out[0];
    c->err_fd = errp[0];
    sv[0] = out[0] = errp[0] = -1;
    if (use_pidfd) {
        c->exit_fd = (int)syscall(SYS_pidfd_open, pid, 0);
        c->exit_pidfd = 1;
    } else {
        c->exit_fd = done[0];
        done[0] = -1;
    }
    if (c->exit_fd < 0 || set_nonblock(c->out_fd) != 0 || set_nonblock(c->err_fd) != 0 ||
        (!c->exit_pidfd && set_nonblock(c->exit_fd) != 0)) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the command: %s", strerror(errno));
        close_fd(&c->ctl); /* the keeper sees the lifeline cut and aborts */
        while (waitpid(c->keeper, NULL, 0) < 0 && errno == EINTR) {
        }
        goto fail;
    }
    if (await_shell(c, err) != 0) goto fail;
    return c;

fail:
    if (c) {
        close_fd(&c->ctl);
        close_fd(&c->out_fd);
        close_fd(&c->err_fd);
        close_fd(&c->exit_fd);
    }
    for (int i = 0; i < 2; i++) {
        close_fd(&sv[i]);
        close_fd(&out[i]);
        close_fd(&errp[i]);
        close_fd(&done[i]);
    }
    free(k);
    free(c);
    return NULL;
}

int hvd_command_stdout_fd(const hvd_command *c) {
    return c->out_fd;
}

int hvd_command_stderr_fd(const hvd_command *c) {
    return c->err_fd;
}

int hvd_command_exit_fd(const hvd_command *c) {
    return c->exit_fd;
}

pid_t hvd_command_pid(const hvd_command *c) {
    return c->shell;
}

pid_t hvd_command_pgid(const hvd_command *c) {
    return c->shell;
}

pid_t hvd_command_keeper_pid(const hvd_command *c) {
    return c->keeper;
}

/* Whether the done pipe (exit fd without pidfd) is at end-of-file: the keeper is exiting. */
static int done_pipe_closed(const hvd_command *c) {
    char b;
    ssize_t n;
    while ((n = read(c->exit_fd, &b, 1)) < 0 && errno == EINTR) {
    }
    return n == 0;
}

int hvd_command_reap(hvd_command *c, int *exit_code) {
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
        if (r == 0) {
            c->exit_code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
        } else if (saved == ECHILD && c->exit_record >= 0) {
            /* Reaped by someone else (SIGCHLD ignored in this process, say). */
            c->exit_code = c->exit_record;
        } else {
            errno = saved;
            return -1;
        }
        c->ended = 1;
    }
    if (exit_code) *exit_code = c->exit_code;
    return 0;
}

int hvd_command_wait(hvd_command *c, int timeout_ms, int *exit_code) {
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int r = hvd_command_reap(c, exit_code);
        if (r <= 0) return r;
        int wait_ms = -1;
        if (timeout_ms >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0) return 1;
            wait_ms = (int)left;
        }
        struct pollfd pf = {.fd = c->exit_fd, .events = POLLIN};
        if (poll(&pf, 1, wait_ms) < 0 && errno != EINTR) return -1;
    }
}

void hvd_command_abort(hvd_command *c) {
    if (c->ended || c->ctl < 0) return;
    struct ctl_msg m = {MSG_ABORT, 0, 0};
    /* Fails harmlessly (EPIPE, no SIGPIPE) if the keeper has already exited. */
    while (send(c->ctl, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EINTR) {
    }
}

void hvd_command_free(hvd_command *c) {
    if (!c) return;
    if (!c->ended) {
        /* Closing the pipes first unblocks writers (EPIPE) so that they end sooner. */
        close_fd(&c->out_fd);
        close_fd(&c->err_fd);
        hvd_command_abort(c);
        while (hvd_command_wait(c, -1, NULL) > 0) {
        }
    }
    close_fd(&c->ctl);
    close_fd(&c->out_fd);
    close_fd(&c->err_fd);
    close_fd(&c->exit_fd);
    free(c);
}
