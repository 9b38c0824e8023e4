/* The descendants of a process, found by walking /proc, and signals to them: what is left of a
 * command after its own process ended (a background child, a `setsid` daemon, a double-forked
 * process). Only raw system calls (async-signal-safe): the keeper runs this in a forked child
 * of an owner that may have other threads. The walk finds what descends from `root` through
 * parent links, so processes re-parented away from the tree are found only when `root` is
 * their child subreaper (prctl PR_SET_CHILD_SUBREAPER): the keeper, and hvd-exec around a
 * shared-object entry point, are. */
#ifndef HVD_COMMON_PROCTREE_H
#define HVD_COMMON_PROCTREE_H

#include <stddef.h>
#include <sys/types.h>

/* Descendants tracked during one walk. Beyond this the walk still signals what it finds, and
 * later walks pick up the rest as their parents die and they are re-parented. */
#define HVD_PROCTREE_MAX_TRACKED 8192

/* One walk's state (about 40 KiB: allocate it before fork, or statically). */
typedef struct hvd_proctree {
    pid_t root;    /* whose descendants */
    int fallbacks; /* signal by pid only, without pinning the process first (no pidfd) */
    size_t n_tracked;
    pid_t tracked[HVD_PROCTREE_MAX_TRACKED]; /* root and the descendants found so far */
    _Alignas(8) char dents[8192];            /* getdents64 buffer */
} hvd_proctree;

/* Sends sig to every live descendant of t->root: scans /proc for processes whose parent is
 * the root or an already found descendant, until a pass finds no new one. With a pidfd, each
 * process is pinned and re-checked first, so a recycled pid is never signalled. SIGCONT goes
 * only to stopped processes: a running one has no use for it, and some (Open MPI's mpirun)
 * forward it to their job with a line of output. Returns how many processes were signalled
 * (zombies, and running processes passed over by SIGCONT, are found but not counted). */
int hvd_proctree_signal(hvd_proctree *t, int sig);

#endif
