/* Bounded queue to our own stdout/stderr with a writer thread: see local_out.h. */
#include "local_out.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/io.h"

/* How long destroy waits for queued output to be written before leaving the writer behind
 * (a log pipe nobody reads would otherwise hold up the service's stop forever). */
#define FLUSH_MS 2000

typedef struct chunk {
    struct chunk *next;
    int fd;
    size_t len;
    uint8_t data[]; /* len bytes */
} chunk;

struct hvd_local_out {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    chunk *head, *tail;
    size_t queued; /* bytes in the queue, including the chunk being written */
    size_t max;
    bool want_room; /* hvd_local_out_notify is pending */
    bool stop;      /* destroy began: drain and exit */
    bool exited;    /* the writer is done */
    bool orphaned;  /* destroy gave up waiting: the writer frees the sink itself */
    void (*on_room)(void *);
    void *arg;
};

static void free_sink(hvd_local_out *o) {
    while (o->head) {
        chunk *c = o->head;
        o->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

static void *writer_main(void *arg) {
    hvd_local_out *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->head && !o->stop)
            pthread_cond_wait(&o->cv, &o->mu);
        if (!o->head) break; /* stopping and drained */
        chunk *c = o->head;
        o->head = c->next;
        if (!o->head) o->tail = NULL;
        pthread_mutex_unlock(&o->mu);
        (void)hvd_write_all(c->fd, c->data, c->len); /* an error drops it: see the header */
        pthread_mutex_lock(&o->mu);
        o->queued -= c->len;
        free(c);
        if (o->want_room && o->queued <= o->max / 2) {
            o->want_room = false;
            pthread_mutex_unlock(&o->mu);
            o->on_room(o->arg);
            pthread_mutex_lock(&o->mu);
        }
    }
    o->exited = true;
    bool orphaned = o->orphaned;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (orphaned) free_sink(o);
    return NULL;
}

hvd_local_out *hvd_local_out_create(size_t max_bytes, void (*on_room)(void *), void *arg,
                                    hvd_err *err) {
    hvd_local_out *o = calloc(1, sizeof *o);
    if (!o) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    o->max = max_bytes;
    o->on_room = on_room;
    o->arg = arg;
    pthread_mutex_init(&o->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&o->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&o->thread, NULL, writer_main, o);
    if (rc != 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot start the output writer thread: %s", strerror(rc));
        pthread_cond_destroy(&o->cv);
        pthread_mutex_destroy(&o->mu);
        free(o);
        return NULL;
    }
    return o;
}

size_t hvd_local_out_room(hvd_local_out *o) {
    pthread_mutex_lock(&o->mu);
    size_t room = o->queued >= o->max ? 0 : o->max - o->queued;
    pthread_mutex_unlock(&o->mu);
    return room;
}

int hvd_local_out_write(hvd_local_out *o, int fd, const void *data, size_t len) {
    if (len == 0) return 0;
    chunk *c = malloc(sizeof *c + len);
    if (!c) return -1;
    c->next = NULL;
    c->fd = fd;
    c->len = len;
    memcpy(c->data, data, len);
    pthread_mutex_lock(&o->mu);
    if (o->queued + len > o->max) {
        pthread_mutex_unlock(&o->mu);
        free(c);
        return -1;
    }
    if (o->tail)
        o->tail->next = c;
    else
        o->head = c;
    o->tail = c;
    o->queued += len;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}

void hvd_local_out_notify(hvd_local_out *o) {
    pthread_mutex_lock(&o->mu);
    bool now = o->queued <= o->max / 2;
    o->want_room = !now;
    pthread_mutex_unlock(&o->mu);
    if (now) o->on_room(o->arg);
}

void hvd_local_out_destroy(hvd_local_out *o) {
    if (!o) return;
    struct timespec until = hvd_ms_to_timespec(hvd_now_ms() + FLUSH_MS); /* cv: monotonic */
    pthread_mutex_lock(&o->mu);
    o->stop = true;
    o->want_room = false; /* on_room's target may be going away */
    pthread_cond_broadcast(&o->cv);
    while (!o->exited && pthread_cond_timedwait(&o->cv, &o->mu, &until) != ETIMEDOUT) {
    }
    if (!o->exited) {
        /* Stuck in write(): leave it; it frees the sink if it ever gets out (so o must not
         * be touched once the lock is released). */
        o->orphaned = true;
        pthread_t th = o->thread;
        pthread_mutex_unlock(&o->mu);
        pthread_detach(th);
        return;
    }
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    free_sink(o);
}
