/* Held calls and aborts (held.c): the subscribers (RUN_COMMAND with attach, ATTACH) and
 * WAIT_EXIT calls the loop holds until the command ends, and the one path by which an abort
 * reaches the command and those calls. Private to task_service/; above pump.h, below
 * handlers.h and run.h (see state.h). */
#ifndef HVD_TASK_HELD_H
#define HVD_TASK_HELD_H

#include <stdbool.h>

#include "hvd/rpc.h"
#include "state.h"

/* Loop: holds call as a subscriber (active: receives output now; runner: the RUN_COMMAND
 * that started the command, whose caller going away is worth telling the driver). Fails it if
 * out of memory. */
void held_add_sub(hvd_task *t, hvd_call *call, bool active, bool runner);
/* Loop: the command started: the ATTACH calls held for it receive its output from now on. */
void held_activate_subs(hvd_task *t);
/* Loop: holds call until the command's exit code is known (answered with STATUS when status
 * is true: STOP_COMMAND, else EXIT). Fails it if out of memory. */
void held_add_waiter(hvd_task *t, hvd_call *call, bool status);

/* Records the first reason to abort, wakes hvd_task_run and aborts the command on the loop.
 * Any thread. */
void task_request_abort(hvd_task *t, task_abort why, const char *detail);
/* Loop: aborts the command if one runs; without one, refuses later commands and fails held
 * ATTACH and WAIT_EXIT calls. */
void task_loop_abort(void *arg);
/* Loop, elastic: kills the running command at once (SIGKILL, no grace period): its ranks
 * are restarted from their last commit anyway. */
void task_loop_kill(hvd_task *t);
/* Loop: fails every held call (the service stops) and signals loop_quiesced. */
void task_loop_quiesce(void *arg);

#endif
