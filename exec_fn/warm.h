/* hvd-exec's side of a task service's warm interpreter (python/hvd_bridge/_warm.py has the
 * protocol; docs/elastic.md, "Warm Python ranks"). */
#ifndef HVD_EXEC_WARM_H
#define HVD_EXEC_WARM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Whether argv[0] (found through envp's PATH) is the same file as python, the warm
 * interpreter's path, once links are resolved: only then is the interpreter asked (it
 * decides; a venv's python and its base interpreter are the same file but not the same
 * Python). Other programs start at once, without waiting for the interpreter's imports. */
bool warm_may_run(const char *python, char *const *argv, char *const *envp);

/* Asks the warm interpreter listening at path to fork a rank running argv with envp, in the
 * current directory, with stdout_fd as its stdout, stderr_fd as its stderr and fds[i] as its
 * descriptor 3 + i. Returns the connection (the rank's lifeline: closing it stops the rank),
 * or -1 with why (not reachable: run the program cold). */
int warm_request(const char *path, char *const *argv, char *const *envp, int stdout_fd,
                 int stderr_fd, const int *fds, int nfds, char *why, size_t cap);

/* Reads the answer to a request: 1 with *pid when the rank was forked, 0 with why when the
 * interpreter says to run it cold (not its interpreter, options it does not take), -1 with
 * why when the interpreter went away. */
int warm_answer(int conn, pid_t *pid, char *why, size_t cap);

/* Waits for a forked rank's end. Returns 0 with its status (128 + N: killed by signal N), or
 * -1 with why when the interpreter went away first. */
int warm_wait(int conn, int *status, char *why, size_t cap);

/* Stops a forked rank: its interpreter sends SIGTERM to the rank's process group, SIGKILL
 * after the task service's grace period (also what happens when hvd-exec dies). */
void warm_stop(int conn);

#endif
