/* The timeline (timeline.h). Like Horovod's, each tensor gets its own row (a "process" named
 * after the tensor); on it, NEGOTIATE_<OP> spans the time from the first request the
 * coordinator saw until the tensor was ready on every rank (with an instant event per rank's
 * request), followed by the <OP> span with nested QUEUE, MEMCPY_IN_FUSION_BUFFER, the
 * collective (MPI_ALLREDUCE, NCCL_ALLREDUCE, ...) and MEMCPY_OUT_FUSION_BUFFER spans.
 *
 * The file stays a stream: each event is built as one jansson object and dumped at once, so a
 * long run never holds its trace in memory, and jansson does the escaping of tensor names.
 * The timeline is a diagnostic: when memory or the disk fails, events are dropped (and the
 * loss is logged once) rather than the collectives failing. */
#include "timeline.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "log.h"
#include "params.h"
#include "strmap.h"

/* Timestamps are microseconds since the file was opened, printed to the nanosecond (13
 * significant digits cover more than a day). */
#define TL_DUMP_FLAGS (JSON_REAL_PRECISION(13))

typedef struct tl_tensor {
    int pid;
    bool negotiating;
} tl_tensor;

struct rt_timeline {
    FILE *f;
    char *path;
    int64_t start_ns;
    rt_strmap tensors; /* name -> tl_tensor* */
    int next_pid;
    bool first; /* no event written yet (no leading comma) */
    bool lossy; /* an event was dropped (logged once) */
};

rt_timeline *rt_timeline_open(const char *path, hvd_err *err) {
    rt_timeline *tl = calloc(1, sizeof *tl);
    if (tl) tl->path = strdup(path);
    if (!tl || !tl->path) {
        free(tl);
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory opening the timeline %s", path);
        return NULL;
    }
    tl->f = fopen(path, "w");
    if (!tl->f) {
        hvd_err_set(err, HVD_E_IO,
                    "cannot open the timeline file %s named by HOROVOD_TIMELINE: %s; is the "
                    "directory there and writable?",
                    path, strerror(errno));
        free(tl->path);
        free(tl);
        return NULL;
    }
    tl->start_ns = hvd_now_ns();
    rt_strmap_init(&tl->tensors);
    tl->next_pid = 1;
    tl->first = true;
    fputs("[\n", tl->f);
    return tl;
}

void rt_timeline_close(rt_timeline *tl) {
    if (!tl) return;
    fputs("\n]\n", tl->f);
    if (fclose(tl->f) != 0) rt_log("writing the timeline %s failed: %m", tl->path);
    size_t pos = 0;
    void *v;
    while (rt_strmap_next(&tl->tensors, &pos, NULL, &v) >= 0)
        free(v);
    rt_strmap_free(&tl->tensors);
    free(tl->path);
    free(tl);
}

void rt_timeline_flush(rt_timeline *tl) {
    if (tl) fflush(tl->f);
}

static void lost(rt_timeline *tl, const char *why) {
    if (!tl->lossy) rt_log("timeline %s: %s; some events are missing from it", tl->path, why);
    tl->lossy = true;
}

/* Writes one event (and releases it): the array's separator, then the object. */
static void emit(rt_timeline *tl, json_t *ev) {
    if (!ev) {
        lost(tl, "out of memory");
        return;
    }
    if (!tl->first) fputs(",\n", tl->f);
    if (json_dumpf(ev, tl->f, TL_DUMP_FLAGS) != 0)
        lost(tl, "writing an event failed");
    else
        tl->first = false;
    json_decref(ev);
}

static double now_us(const rt_timeline *tl) {
    return (double)(hvd_now_ns() - tl->start_ns) / 1000.0;
}

/* A tensor name as a JSON string. JSON text is UTF-8; a name that is not valid UTF-8 is shown
 * with '?' for each byte outside ASCII rather than losing its row. */
static json_t *name_value(const char *name) {
    json_t *v = json_string(name);
    if (v) return v;
    char *copy = strdup(name);
    if (!copy) return NULL;
    for (char *c = copy; *c; c++)
        if ((unsigned char)*c >= 0x80) *c = '?';
    v = json_string(copy);
    free(copy);
    return v;
}

/* The tensor's row, created (with its name and sort order) on first use; NULL when out of
 * memory. */
static tl_tensor *tensor(rt_timeline *tl, const char *name) {
    tl_tensor *t = rt_strmap_get(&tl->tensors, name);
    if (t) return t;
    t = calloc(1, sizeof *t);
    if (!t || rt_strmap_put(&tl->tensors, name, t) != 0) {
        free(t);
        lost(tl, "out of memory");
        return NULL;
    }
    t->pid = tl->next_pid++;
    emit(tl, json_pack("{s:s, s:s, s:i, s:{s:o}}", "name", "process_name", "ph", "M", "pid", t->pid,
                       "args", "name", name_value(name)));
    emit(tl, json_pack("{s:s, s:s, s:i, s:{s:i}}", "name", "process_sort_index", "ph", "M", "pid",
                       t->pid, "args", "sort_index", t->pid));
    return t;
}

static void span_begin(rt_timeline *tl, tl_tensor *t, const char *what) {
    emit(tl, json_pack("{s:s, s:s, s:f, s:i, s:i}", "name", what, "ph", "B", "ts", now_us(tl),
                       "pid", t->pid, "tid", 0));
}

static void span_end(rt_timeline *tl, tl_tensor *t) {
    emit(tl,
         json_pack("{s:s, s:f, s:i, s:i}", "ph", "E", "ts", now_us(tl), "pid", t->pid, "tid", 0));
}

static void instant(rt_timeline *tl, tl_tensor *t, const char *what) {
    emit(tl, json_pack("{s:s, s:s, s:s, s:f, s:i, s:i}", "name", what, "ph", "i", "s", "t", "ts",
                       now_us(tl), "pid", t->pid, "tid", 0));
}

void rt_timeline_negotiate_start(rt_timeline *tl, const char *name, int optype) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (!t || t->negotiating) return;
    t->negotiating = true;
    char what[64];
    snprintf(what, sizeof what, "NEGOTIATE_%s", rt_optype_upper_name(optype));
    span_begin(tl, t, what);
}

void rt_timeline_negotiate_rank(rt_timeline *tl, const char *name, int rank) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (!t) return;
    char what[16];
    snprintf(what, sizeof what, "%d", rank);
    instant(tl, t, what);
}

void rt_timeline_negotiate_end(rt_timeline *tl, const char *name) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (!t || !t->negotiating) return;
    t->negotiating = false;
    span_end(tl, t);
}

void rt_timeline_start(rt_timeline *tl, const char *name, const char *activity) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (t) span_begin(tl, t, activity);
}

void rt_timeline_end(rt_timeline *tl, const char *name) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (t) span_end(tl, t);
}

void rt_timeline_mark(rt_timeline *tl, const char *name, const char *what) {
    tl_tensor *t = tl ? tensor(tl, name) : NULL;
    if (t) instant(tl, t, what);
}
