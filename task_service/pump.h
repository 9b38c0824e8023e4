/* The command's output, from its pipes to the subscribers or to our own stdout/stderr with
 * back-pressure, and the command's end (pump.c). Loop thread only. Private to task_service/;
 * above state.h, below held.h (see state.h). */
#ifndef HVD_TASK_PUMP_H
#define HVD_TASK_PUMP_H

#include <stdbool.h>

#include "hvd/error.h"
#include "hvd/rpc.h"
#include "state.h"

#define TASK_READ_MAX    (64 * 1024)  /* bytes read from an output pipe at once */
#define TASK_CHUNK_MAX   (64 * 1024)  /* largest formatted chunk handed to a sink */
#define TASK_CHUNK_SLACK 256          /* framing overhead allowed for in room checks */
#define TASK_LOCAL_MAX   (256 * 1024) /* bound of the queue to our own stdout/stderr */
#define TASK_SUB_STALL_MS                                                                          \
    2000 /* an ATTACH subscriber holding the output back this long is                              \
            dropped (the agent that ran the command never is) */

/* Watches a just-started command's pipes and exit fd. Returns 0 or -1 with err. */
int pump_start(hvd_task *t, bool prefix, bool timestamps, hvd_err *err);
/* Stops watching the command's descriptors (before freeing it). */
void pump_stop(hvd_task *t);
/* A subscriber joined or left: re-evaluate back-pressure. */
void pump_resume(hvd_task *t);
/* A held call was answered or cancelled (its pointer cleared): frees such entries and
 * re-evaluates back-pressure soon, from a posted closure, so that nothing is freed under a
 * caller that walks the lists (a failed send cancels calls from inside hvd_call_stream and
 * hvd_call_reply). */
void pump_call_gone(hvd_task *t);
/* Frees the subscribers and waiters whose call is NULL. Only with nothing walking them. */
void pump_sweep(hvd_task *t);
/* Answers a subscriber or waiter with the ended command's exit (the call pointer is cleared). */
void pump_reply_exit(const hvd_task *t, hvd_call **call);
/* Elastic: forgets the command that ended (its process, its shared-memory directory), so
 * that another can start. */
void pump_recycle(hvd_task *t);
/* Answers a waiter: EXIT for WAIT_EXIT, STATUS (ended) for STOP_COMMAND. */
void pump_reply_waiter(const hvd_task *t, task_waiter *w);

#endif
