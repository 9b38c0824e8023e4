/* The timeline (HOROVOD_TIMELINE=file.json): a Chrome-trace JSON array written by rank 0 as
 * events happen. Used from the background thread only. Every function accepts tl == NULL
 * (no timeline) and does nothing then. */
#ifndef HVD_RUNTIME_TIMELINE_H
#define HVD_RUNTIME_TIMELINE_H

#include "hvd/error.h"

typedef struct rt_timeline rt_timeline;

/* Opens path for writing a Chrome-trace JSON array. Returns NULL with err on failure. */
rt_timeline *rt_timeline_open(const char *path, hvd_err *err);
/* Writes the closing bracket and closes the file. */
void rt_timeline_close(rt_timeline *tl);
/* Negotiation of a tensor: starts once (later calls are ignored while it is open). */
void rt_timeline_negotiate_start(rt_timeline *tl, const char *name, int optype);
/* A rank's request arrived at the coordinator (instant event named after the rank). */
void rt_timeline_negotiate_rank(rt_timeline *tl, const char *name, int rank);
void rt_timeline_negotiate_end(rt_timeline *tl, const char *name);
/* Nested activity spans on the tensor's row ("ALLREDUCE", "QUEUE", "MPI_ALLREDUCE", ...). */
void rt_timeline_start(rt_timeline *tl, const char *name, const char *activity);
void rt_timeline_end(rt_timeline *tl, const char *name);
/* An instant event on the tensor's row (e.g. an error). */
void rt_timeline_mark(rt_timeline *tl, const char *name, const char *what);
/* Flushes buffered events to the file. */
void rt_timeline_flush(rt_timeline *tl);

#endif
