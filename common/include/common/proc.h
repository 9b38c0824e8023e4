/* The one process runner of hvd-bridge: runs one command (`/bin/sh -c <command>`, or a program
 * with its arguments) in its own session and process group, and guarantees that no process of
 * it outlives the command's end, an abort, or the death of the process that started it. The
 * task service runs orted through it, hvd-driver runs mpirun and its local task services
 * through it, and hvd-exec a program entry point.
 *
 * How it works (DESIGN.md section 4; Horovod's safe_shell_exec with its defects fixed):
 *
 *   owner (this process) --fork--> keeper --fork--> /bin/sh -c <command> (or the program)
 *                                                     --> descendants...
 *
 * The keeper is the small program hvd-keeper, forked and exec'd, so that it costs its own
 * megabyte and not a copy of a large owner (a JVM executor) in the eyes of a memory check that
 * sums VmRSS; without the program (HVD_KEEPER=none, or none found) the forked child itself is
 * the keeper, running only async-signal-safe code (keeper.h says where the program is looked
 * for). It makes itself a child subreaper, so every orphaned descendant of the command (double
 * forks, daemons, setsid'd processes) is re-parented to it, and it blocks every signal it
 * does not read itself, so terminal and group signals (SIGINT, SIGTERM, SIGHUP) cannot kill
 * it. The owner and the keeper share a control socket, which is also the lifeline: when the
 * owner dies for any reason, SIGKILL included, the keeper reads end-of-file and aborts the
 * command. PR_SET_PDEATHSIG on the keeper covers the case where a forked copy of the owner
 * still holds the socket; the shell gets PR_SET_PDEATHSIG(SIGKILL) in case the keeper dies, and
 * the owner SIGKILLs the command's process group when it reaps a keeper that died without
 * reporting the command's end.
 *
 * Abort: SIGTERM to the command's process group and to every descendant of the keeper (found
 * by walking /proc), SIGCONT to the stopped ones among them (only to those: mpirun would
 * forward it to its job with a line), then, after the grace period, SIGKILL to the group and to
 * every descendant, repeated until none is left. The shell is never stopped, so TERM
 * handlers run.
 *
 * The command has ENDED when the shell has exited and no descendant is left: a daemon the
 * command started keeps it running until the daemon exits; or, with end_with_program, what
 * is left when the shell (the program) exits is stopped as in an abort (SIGTERM, SIGKILL after
 * the grace period) and the command has ended once it is gone. The exit code is the shell's
 * status, or 128 + signal number if the shell was killed by a signal.
 *
 * Threads: start and free may be called from any thread, also concurrently for different
 * commands; one command object must be used by one thread at a time. The library forks from
 * the calling thread and runs only async-signal-safe code in the children before they exec, so it
 * is safe in a multithreaded process such as a JVM. All descriptors it creates are close-on-exec;
 * the command's stdin is /dev/null and it inherits no descriptor of this process other than its
 * stdout and stderr (pipes, or descriptors the caller passes) and the extra descriptors the
 * spec names. */
#ifndef HVD_COMMON_PROC_H
#define HVD_COMMON_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#include "hvd/error.h"

/* Time between SIGTERM and SIGKILL on abort when the spec leaves grace_ms at 0. */
#define HVD_PROC_DEFAULT_GRACE_MS 5000

typedef struct hvd_proc_spec {
    const char *command;     /* shell command line, run as `/bin/sh -c command`; or NULL: */
    char *const *argv;       /* the program (searched in the PATH of envp) and its arguments */
    char *const *envp;       /* the command's environment; NULL: this process's environ */
    const char *cwd;         /* working directory; NULL: this process's */
    int grace_ms;            /* abort: SIGTERM, then SIGKILL after this many ms; 0: the default */
    const char *cleanup_dir; /* or NULL: a directory the keeper empties (8 levels deep) and
                                removes once the command has ended, even if this process was
                                killed (Open MPI's session and shared-memory files, say) */
    bool pass_stdout;        /* false: stdout is a pipe (hvd_proc_stdout_fd); true: stdout_fd */
    int stdout_fd;           /* with pass_stdout: the command's stdout (1: this process's) */
    bool pass_stderr;        /* the same for stderr */
    int stderr_fd;
    const int *extra_fds;  /* more descriptors for the command: extra_fds[i] becomes its
                              descriptor 3 + i (a payload to read, a result pipe to write) */
    int n_extra_fds;       /* 0 to HVD_PROC_MAX_EXTRA_FDS */
    bool end_with_program; /* what the program leaves running is stopped when it exits, not
                              waited for (a rank: a daemon it started would hold the job) */

    /* Or NULL: the command runs in a UTS namespace of its own whose hostname this is (needs
     * CAP_SYS_ADMIN: root). For fake hosts of one machine (hvd-driver --local) under Open
     * MPI 5, whose daemons tell hosts apart by gethostname(). */
    const char *uts_hostname;
} hvd_proc_spec;

/* Most extra descriptors a command can be given. */
#define HVD_PROC_MAX_EXTRA_FDS 4

typedef struct hvd_proc hvd_proc;

/* Starts the command. Returns once the child process leads its own session and process group
 * (it may still be about to exec: a failing chdir or exec is reported on the command's stderr
 * and as exit code 127; a program not found in PATH is an error here). Blocks only for the keeper's
 * start-up, which is a few system calls and a fork. Returns NULL and fills err on failure (invalid
 * spec, missing working directory, program not found, out of descriptors or processes). */
hvd_proc *hvd_proc_start(const hvd_proc_spec *spec, hvd_err *err);

/* Non-blocking read ends of the command's stdout and stderr pipes (-1 for a passed stream); they
 * reach end-of-file when every process of the command holding them has exited. The pipe is the only
 * buffer: a command whose output is not read blocks (back-pressure). Owned by the command object:
 * do not close them; remove them from any poll set before hvd_proc_free. */
int hvd_proc_stdout_fd(const hvd_proc *p);
int hvd_proc_stderr_fd(const hvd_proc *p);

/* A descriptor that becomes readable (POLLIN) when the command has ended: a pidfd of the
 * keeper, or on kernels without pidfd_open (before 5.4) the read end of a pipe that
 * reaches end-of-file when the keeper exits. Owned by the command object. */
int hvd_proc_exit_fd(const hvd_proc *p);

/* Collects the exit code without blocking. Returns 0 and sets *exit_code (may be NULL) once
 * the command has ended (calling it again returns the same code); 1 while it is still
 * running; -1 with errno set if the code cannot be known (ECHILD: the keeper was killed and
 * reaped by someone else). */
int hvd_proc_reap(hvd_proc *p, int *exit_code);

/* Waits up to timeout_ms (-1: forever) for the command to end, then reaps it. Returns 0 with
 * the code, 1 on timeout, -1 on error as hvd_proc_reap. Does not read the output pipes:
 * drain them, or a command that writes more than a pipe holds never ends. */
int hvd_proc_wait(hvd_proc *p, int timeout_ms, int *exit_code);

/* Asks the keeper to abort: SIGTERM to everything, SIGKILL after the grace period. Returns
 * at once; the exit descriptor becomes readable when everything is gone. Aborting a command
 * that has already ended, or aborting twice, does nothing. */
void hvd_proc_abort(hvd_proc *p);

/* hvd_proc_abort with its own grace period (ms, >= 0; < 0: the spec's). Called again while
 * the command is being terminated, it may shorten the grace period, never lengthen it: a job
 * whose stop turns urgent (a host was lost) can cut short the wait it started. */
void hvd_proc_abort_within(hvd_proc *p, int grace_ms);

/* Once the command has ended: the signal that killed its shell (or program), telling "killed
 * by signal 9" from "exited with status 137"; 0 if it exited, or if that cannot be known (the
 * keeper itself was killed). */
int hvd_proc_exit_signal(const hvd_proc *p);

/* Like hvd_proc_abort without the grace period: SIGKILL to the command's group and every
 * descendant now (also when an abort is under way). For commands that need no chance to
 * clean up, such as an elastic job's ranks, restarted from their last commit anyway. */
void hvd_proc_kill(hvd_proc *p);

/* The child's (the shell's, or the program's) process id; it is also the command's process group
 * and session id. */
pid_t hvd_proc_pid(const hvd_proc *p);
pid_t hvd_proc_pgid(const hvd_proc *p);

/* The keeper's process id (a child of this process). */
pid_t hvd_proc_keeper_pid(const hvd_proc *p);

/* Releases the command. If it is still running: closes the output pipes, aborts it and
 * waits (blocking, up to the grace period plus the time the kernel takes to kill) until it
 * has ended. NULL is ignored. */
void hvd_proc_free(hvd_proc *p);

/* For tests: when on, behave as on old kernels (no pidfd_open, no close_range), so that the
 * fallback paths get exercised. Affects commands started afterwards. */
void hvd_proc_force_fallbacks(int on);

/* Makes sure this process may open at least `want` descriptors: raises the soft
 * RLIMIT_NOFILE towards `want` (never above the hard limit, never lowers it; children
 * inherit it, so it is raised only as far as asked). Returns the soft limit now (or
 * LONG_MAX when unlimited), which is below `want` when the hard limit is. */
long hvd_nofile_ensure(long want);

#endif
