/* The keeper of one command (proc.h has the design): what the owner (proc.c) prepares for it,
 * the messages they exchange over the control socket, and the two ways it runs.
 *
 *   exec'd    the owner forks, the child moves the keeper's descriptors to their fixed places
 *             and execs the small program hvd-keeper (keeper_main.c), which reads the rest from
 *             its arguments. A fork of a large owner (a JVM executor) would otherwise stay
 *             as large as the owner on paper for the whole command: YARN's process-tree memory
 *             check sums VmRSS and would count the executor twice.
 *   in place  without the program (HVD_KEEPER=none, or none found), the forked child is the
 *             keeper: the same code, run without exec.
 *
 * The program is HVD_KEEPER when set; else hvd-keeper in $HVD_BIN_DIR; else hvd-keeper in the
 * directory of the object holding this code (a program, libhvd_jni.so, the Python extension),
 * its bin/ or its ../bin/. A library loaded from a temporary copy (the JVM's from the jar) finds
 * none there: set HVD_BIN_DIR.
 *
 * Everything the forked child runs is async-signal-safe (raw system calls, no malloc, no
 * stdio, no locks): the owner may have other threads. */
#ifndef HVD_COMMON_KEEPER_H
#define HVD_COMMON_KEEPER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/proc.h"
#include "common/proctree.h"

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
enum { STEP_FDS, STEP_DEVNULL, STEP_SIGNALFD, STEP_FORK, STEP_EXEC, STEP_ARGS };

struct ctl_msg {
    int32_t tag;   /* MSG_* */
    int32_t value; /* pid, exit code or STEP_* */
    int32_t err;   /* errno for MSG_FAIL */
};

/* The exec'd keeper's descriptors: the control socket, the command's stdout and stderr, the
 * done pipe's write end (closed when the owner uses a pidfd), the command's environment (a
 * memfd of NUL-terminated strings: not the keeper's own environment, which stays the owner's,
 * and never its command line, which every user can read), then the command's extra ones. */
enum {
    KEEPER_FD_CTL = 3,
    KEEPER_FD_OUT,
    KEEPER_FD_ERR,
    KEEPER_FD_DONE,
    KEEPER_FD_ENV,
    KEEPER_FD_EXTRA
};

/* How many of the keeper's descriptors come before the extra ones. */
#define KEEPER_FIXED_FDS (KEEPER_FD_EXTRA - KEEPER_FD_CTL)

/* Everything the keeper and the command child need, prepared by the owner before fork (or, in
 * the exec'd keeper, read from its arguments). */
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
    int end_with_command;    /* the command child's exit stops what is left (proc.h) */
    int ctl;                 /* keeper's end of the control socket (the lifeline) */
    int out_w, err_w;        /* the child's stdout/stderr: pipe write ends, or passed fds */
    int done_w;              /* write end of the done pipe (exit fd without pidfd), or -1 */
    int env_fd;              /* the exec'd keeper's: the command's environment (memfd), or -1 */
    int extra[HVD_PROC_MAX_EXTRA_FDS]; /* the command's descriptors 3.. (spec.extra_fds) */
    int n_extra;
    const char *program; /* the keeper program to exec (hvd-keeper), or NULL: in place */
    char **program_argv; /* its arguments (hvd_keeper_argv) */
    pid_t self;          /* the keeper's own pid */
    pid_t shell;         /* the command child's pid */
    hvd_proctree tree;   /* the walk over the keeper's descendants (root: self) */
};

/* In the owner's forked child: becomes the keeper, exec'd or in place. Never returns. */
__attribute__((noreturn)) void hvd_keeper_start(struct keeper *k);

/* In the exec'd keeper (its descriptors already in place): runs the command. Never returns. */
__attribute__((noreturn)) void hvd_keeper_run(struct keeper *k);

/* The owner side: the keeper program's arguments for k (the fields up to n_extra filled),
 * malloc'd as one block (free it at once). NULL when out of memory. */
char **hvd_keeper_argv(const struct keeper *k);

/* The owner side: a memfd holding envp for KEEPER_FD_ENV. Returns it, or -1 with errno. */
int hvd_keeper_env_fd(char *const *envp);

/* The keeper program's side: fills k from its arguments and the fixed descriptors. Returns 0,
 * or -1 with a one-line reason in why. */
int hvd_keeper_parse_argv(struct keeper *k, int argc, char **argv, char *why, size_t why_len);

#endif
