/* Termination signals turned into readable bytes (the self-pipe trick), for programs whose
 * main loop polls descriptors. A process has one: main() installs it and passes its read end
 * down to whatever has to wake up on a signal (the mpirun runner, the ssh sessions). Libraries
 * never install signal handlers themselves: inside a JVM that would take the JVM's. */
#ifndef HVD_COMMON_SIG_H
#define HVD_COMMON_SIG_H

#include <sys/types.h>

#include "hvd/error.h"

/* Installs handlers for SIGINT, SIGTERM and SIGHUP that write the signal number as one byte to
 * a non-blocking close-on-exec pipe, and sets SIGPIPE to ignored (writes to a closed socket or
 * pipe fail with EPIPE instead). Call once, from main, before starting threads. Returns the
 * read end, or -1 with err. */
int hvd_signals_install(hvd_err *err);

/* Reads one pending signal number from the read end: the number, or 0 when none is pending. */
int hvd_signals_next(int fd);

/* The same, with the process id of the sender in *sender (0 when the kernel sent it or it
 * cannot be known): a child tells its parent's signal (orted ending the job) from anyone
 * else's. */
int hvd_signals_next_from(int fd, pid_t *sender);

/* The number of the first signal received since hvd_signals_install, or 0: for threads that
 * must not consume the pipe's bytes but want to know whether the process is being stopped. */
int hvd_signals_first(void);

#endif
