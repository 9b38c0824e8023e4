/* The descendants of a process, found by walking /proc (proctree.h). Raw system calls only. */
#include "common/proctree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/num.h"

/* Bound on walk passes (a pass finds one more level of the tree, in the worst case). */
#define WALK_MAX_PASSES 64

/* Reads the parent pid and state letter of process `name` (a /proc entry) through the /proc
 * directory descriptor. Returns 0, or -1 if the process is gone. */
static int read_stat(int proc, const char *name, pid_t *ppid, char *state) {
    static const char tail[] = "/stat";
    char path[32];
    size_t n = 0;
    for (; name[n]; n++) {
        if (n + sizeof tail > sizeof path) return -1;
        path[n] = name[n];
    }
    for (size_t i = 0; i < sizeof tail; i++)
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

static int is_tracked(const hvd_proctree *t, pid_t pid) {
    for (size_t i = 0; i < t->n_tracked; i++)
        if (t->tracked[i] == pid) return 1;
    return 0;
}

/* Sends sig to pid, which a /proc read just showed to be a descendant. With a pidfd, the
 * process is pinned first and re-checked, so a recycled pid is never signalled. */
static void signal_descendant(const hvd_proctree *t, int proc, const char *name, pid_t pid,
                              int sig) {
    if (!t->fallbacks) {
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pfd >= 0) {
            pid_t ppid;
            char state;
            if (read_stat(proc, name, &ppid, &state) == 0 && is_tracked(t, ppid))
                syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0);
            close(pfd);
            return;
        }
        if (errno == ESRCH) return;
    }
    kill(pid, sig);
}

/* One pass over /proc: tracks and signals the processes whose parent is tracked. Returns
 * whether it found any, and adds to *signalled; -1 if /proc cannot be read. */
static int walk_once(hvd_proctree *t, int sig, int *signalled) {
    int found = 0;
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0) return -1;
    long n;
    while ((n = syscall(SYS_getdents64, proc, t->dents, sizeof t->dents)) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(void *)(t->dents + off);
            off += d->d_reclen;
            long pid = hvd_parse_digits(d->d_name);
            pid_t ppid;
            char state;
            if (pid <= 0 || is_tracked(t, (pid_t)pid)) continue;
            if (read_stat(proc, d->d_name, &ppid, &state) != 0 || !is_tracked(t, ppid)) continue;
            if (t->n_tracked < HVD_PROCTREE_MAX_TRACKED) t->tracked[t->n_tracked++] = (pid_t)pid;
            found = 1;
            if (state == 'Z' || state == 'X') continue; /* dead, waiting to be reaped */
            if (sig == SIGCONT && state != 'T' && state != 't') continue; /* not stopped */
            signal_descendant(t, proc, d->d_name, (pid_t)pid, sig);
            (*signalled)++;
        }
    }
    close(proc);
    return found;
}

int hvd_proctree_signal(hvd_proctree *t, int sig) {
    int signalled = 0;
    t->tracked[0] = t->root;
    t->n_tracked = 1;
    for (int pass = 0; pass < WALK_MAX_PASSES; pass++)
        if (walk_once(t, sig, &signalled) != 1) break;
    return signalled;
}
