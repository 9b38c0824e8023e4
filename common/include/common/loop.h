/* A small event loop in the spirit of Redis's ae.c: descriptors watched with epoll, one-shot
 * timers, and work posted from other threads, all run on one thread.
 *
 * The RPC server embeds one (rpc/server.c: its listening socket and connections are watched
 * descriptors here), and so does everything else that shares the server's thread: the task
 * service's output pumps, the driver's timers. Callbacks run on the loop thread and must not
 * block. Only hvd_loop_post, hvd_loop_stop and hvd_loop_on_thread may be called from other
 * threads; everything else belongs to the loop thread (or to any one thread while the loop
 * is not running). */
#ifndef HVD_COMMON_LOOP_H
#define HVD_COMMON_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "hvd/error.h"

typedef struct hvd_loop hvd_loop;
/* One watched descriptor. */
typedef struct hvd_watch hvd_watch;

/* Loop-thread callbacks: posted work, timers, and the after-batch hook. */
typedef void (*hvd_loop_fn)(void *arg);
/* A watched descriptor is ready: events are epoll's (EPOLLIN, EPOLLOUT, EPOLLHUP, ...). */
typedef void (*hvd_fd_fn)(int fd, uint32_t events, void *arg);

/* Creates a loop (not yet running). Returns NULL with err. */
hvd_loop *hvd_loop_create(hvd_err *err);

/* Starts the loop's thread. Returns 0, or -1 with err. */
int hvd_loop_start(hvd_loop *l, hvd_err *err);

/* Stops the loop thread after its current batch and joins it (not from the loop thread);
 * then refuses further posts and runs, on the calling thread, the work posted before, so
 * posted work is never silently lost. Watches and timers stay registered (not run). Safe to
 * call twice, and on a loop that never started. */
void hvd_loop_stop(hvd_loop *l);

/* Stops the loop if needed and frees it, its watches and its timers (whose callbacks do not
 * run; the watched descriptors are not closed). NULL is ignored. */
void hvd_loop_free(hvd_loop *l);

/* True when called on the loop thread. Any thread. */
bool hvd_loop_on_thread(const hvd_loop *l);

/* Runs fn(arg) on the loop thread soon, in posting order. Any thread. Returns 0, or -1 once
 * hvd_loop_stop has run (fn is then not called) or on out of memory. */
int hvd_loop_post(hvd_loop *l, hvd_loop_fn fn, void *arg);

/* Runs fn(arg) once, delay_ms from now. Returns a timer id > 0, or 0 on out of memory. */
uint64_t hvd_loop_timer(hvd_loop *l, int delay_ms, hvd_loop_fn fn, void *arg);
/* Cancels a timer that has not fired; unknown ids are ignored. */
void hvd_loop_timer_cancel(hvd_loop *l, uint64_t id);

/* Watches fd for events; fn runs on the loop thread when it is ready. A descriptor is watched
 * once at a time. Returns the watch, or NULL with err. */
hvd_watch *hvd_loop_watch(hvd_loop *l, int fd, uint32_t events, hvd_fd_fn fn, void *arg,
                          hvd_err *err);
/* Changes the events a watch waits for (0: none for now). Returns 0, or -1 with err. */
int hvd_loop_watch_events(hvd_loop *l, hvd_watch *w, uint32_t events, hvd_err *err);
/* Stops watching (an event for it still in the current batch is dropped) and frees the watch
 * after the batch. The descriptor may be closed right after. NULL is ignored. */
void hvd_loop_unwatch(hvd_loop *l, hvd_watch *w);

/* fn(arg) runs on the loop thread after each batch of events and timers: the place to free
 * objects that the batch's other events may still have pointed to. One hook per loop. */
void hvd_loop_set_after_batch(hvd_loop *l, hvd_loop_fn fn, void *arg);

#endif
