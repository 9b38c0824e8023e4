/* Notes to the driver (notes.h): a queue under its own lock and one thread that sends each
 * note on a connection of its own, started at the first note. */
#include "notes.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/proto.h"
#include "hvd/rpc.h"

#define NOTES_MAX     8    /* notes a task sends in its life; later ones are dropped */
#define NOTE_CALL_MS  2000 /* how long one note may take to be taken */
#define NOTE_TEXT_MAX 256

typedef struct note {
    uint32_t kind;
    int exit_code, sig;
    char text[NOTE_TEXT_MAX];
    bool has_text;
} note;

struct task_notes {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    note q[NOTES_MAX];
    size_t head, n, queued; /* queued: notes ever queued (bounded by NOTES_MAX) */
    bool stop;
    bool running;
    pthread_t thread;
};

/* Returns 0 once the driver took the note, -1 if not (said in the log). */
static int send_note(hvd_task *t, const note *n) {
    hvd_task_event_msg m = {.index = t->cfg.index,
                            .kind = n->kind,
                            .exit_code = n->exit_code,
                            .signal = n->sig,
                            .text = n->has_text ? (char *)n->text : NULL};
    hvd_err err;
    hvd_client *c = task_driver_connect(t, TASK_DRIVER_PROBE_MS, &err);
    int rc =
        c ? hvd_client_call(c, &hvd_task_event_desc, &m, &hvd_ack_desc, NULL, NOTE_CALL_MS, 0, &err)
          : -1;
    if (rc != 0)
        task_log(t, HVD_LOG_WARN, "could not tell the driver what happened to the command: %s",
                 err.msg);
    hvd_client_close(c);
    return rc;
}

static void *notes_main(void *arg) {
    hvd_task *t = arg;
    struct task_notes *q = t->notes;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->n == 0)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->n == 0) break; /* stopping, and everything was sent */
        note n = q->q[q->head];
        q->head = (q->head + 1) % NOTES_MAX;
        q->n--;
        pthread_mutex_unlock(&q->mu);
        int rc = send_note(t, &n);
        pthread_mutex_lock(&q->mu);
        if (rc != 0 && q->stop) q->n = 0; /* no driver to wait for */
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* The queue, made at the first note (t->notes_mu held). NULL on out of memory. */
static struct task_notes *notes_of(hvd_task *t) {
    if (t->notes) return t->notes;
    struct task_notes *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    t->notes = q;
    q->running = pthread_create(&q->thread, NULL, notes_main, t) == 0;
    return q;
}

void task_note(hvd_task *t, uint32_t kind, int exit_code, int sig, const char *text) {
    pthread_mutex_lock(&t->notes_mu);
    struct task_notes *q = t->notes_closed ? NULL : notes_of(t);
    pthread_mutex_unlock(&t->notes_mu);
    if (!q || !q->running) return;
    pthread_mutex_lock(&q->mu);
    if (!q->stop && q->queued < NOTES_MAX) {
        note *n = &q->q[(q->head + q->n) % NOTES_MAX];
        *n = (note){.kind = kind, .exit_code = exit_code, .sig = sig, .has_text = text != NULL};
        if (text) snprintf(n->text, sizeof n->text, "%s", text);
        q->n++;
        q->queued++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
}

void task_notes_stop(hvd_task *t) {
    pthread_mutex_lock(&t->notes_mu);
    struct task_notes *q = t->notes;
    t->notes_closed = true;
    pthread_mutex_unlock(&t->notes_mu);
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->running) pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
    t->notes = NULL;
}
