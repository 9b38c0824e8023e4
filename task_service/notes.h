/* What this task tells the driver about its command, unasked (TASK_EVENT: the command ended
 * unasked and not well, the agent that started it went away), from a thread of its own: the
 * loop thread never waits on the network (notes.c). Private to task_service/; above state.h,
 * below pump.h (see state.h). */
#ifndef HVD_TASK_NOTES_H
#define HVD_TASK_NOTES_H

#include <stdint.h>

#include "state.h"

/* Queues one TASK_EVENT for the driver (any thread; text may be NULL). The first few of a
 * task's life are sent, in order; a note that cannot be delivered is dropped with a warning. */
void task_note(hvd_task *t, uint32_t kind, int exit_code, int sig, const char *text);

/* Ends the notes thread (hvd_task_stop) once the queued notes are sent (or the driver turns
 * out unreachable: the rest are dropped). */
void task_notes_stop(hvd_task *t);

#endif
