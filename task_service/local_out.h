/* The task service's own stdout/stderr as a sink for the command's output while nobody is
 * attached (it lands in the executor's log, as in Horovod).
 *
 * Those descriptors may be pipes read by a slow log collector, so writing them from the
 * server's loop thread could stall every connection. Instead the loop queues copies here and
 * a writer thread does the blocking writes. The queue is bounded: the caller checks
 * hvd_local_out_room before queueing, and when there is no room it stops reading the
 * command's pipes and asks to be told (hvd_local_out_notify) once the queue has drained to
 * half; the command then blocks on its full pipe, which is the back-pressure. */
#ifndef HVD_TASK_LOCAL_OUT_H
#define HVD_TASK_LOCAL_OUT_H

#include <stddef.h>

#include "hvd/error.h"

typedef struct hvd_local_out hvd_local_out;

/* Creates the sink and its writer thread. on_room(arg) runs on the writer thread after
 * hvd_local_out_notify, once the queued bytes drop to max_bytes / 2 or below; it must only
 * hand off (post to a loop), not call back into the sink. Returns NULL with err. */
hvd_local_out *hvd_local_out_create(size_t max_bytes, void (*on_room)(void *), void *arg,
                                    hvd_err *err);

/* Bytes that may still be queued. Any thread. */
size_t hvd_local_out_room(hvd_local_out *o);

/* Queues a copy of data for fd. Refuses (returns -1) what does not fit or when memory runs
 * out; returns 0 otherwise. A write error on fd (EPIPE: nobody reads the log) drops the
 * data silently: output has nowhere to go, and the command must not block on it. */
int hvd_local_out_write(hvd_local_out *o, int fd, const void *data, size_t len);

/* Asks for one on_room call when the queue is at most half full (at once if it already
 * is). */
void hvd_local_out_notify(hvd_local_out *o);

/* Writes out what is queued, stops the thread and frees the sink. If the writes do not
 * finish within 2 s (nobody reads the log), the writer is left to finish on its own and
 * frees the sink then; on_room is no longer called either way. NULL is ignored. */
void hvd_local_out_destroy(hvd_local_out *o);

#endif
