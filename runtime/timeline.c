/* The timeline (HOROVOD_TIMELINE=file.json): a Chrome-trace JSON array that Perfetto and
 * chrome://tracing open. Like Horovod's, each tensor gets its own row (a "process" named after
 * the tensor); on it, NEGOTIATE_<OP> spans the time from the first request the coordinator
 * saw until the tensor was ready on every rank (with an instant event per rank's request),
 * followed by the <OP> span with nested QUEUE, MEMCPY_IN_FUSION_BUFFER, the collective
 * (MPI_ALLREDUCE, NCCL_ALLREDUCE, ...) and MEMCPY_OUT_FUSION_BUFFER spans. Written by rank 0
 * from the background thread only, so it needs no lock. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

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
};

rt_timeline *rt_timeline_open(const char *path, hvd_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) {
        rt_err(err, HVD_E_IO,
               "cannot open the timeline file %s named by HOROVOD_TIMELINE: %m; is the "
               "directory there and writable?",
               path);
        return NULL;
    }
    rt_timeline *tl = rt_xcalloc(1, sizeof *tl);
    tl->f = f;
    tl->path = rt_xstrdup(path);
    tl->start_ns = rt_now_ns();
    rt_strmap_init(&tl->tensors);
    tl->next_pid = 1;
    tl->first = true;
    fputs("[\n", f);
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

/* Writes s as the body of a JSON string. */
static void put_json_str(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
}

static void begin_event(rt_timeline *tl) {
    if (!tl->first) fputs(",\n", tl->f);
    tl->first = false;
}

static double now_us(const rt_timeline *tl) {
    return (double)(rt_now_ns() - tl->start_ns) / 1000.0;
}

static tl_tensor *tensor(rt_timeline *tl, const char *name) {
    tl_tensor *t = rt_strmap_get(&tl->tensors, name);
    if (t) return t;
    t = rt_xcalloc(1, sizeof *t);
    t->pid = tl->next_pid++;
    rt_strmap_put(&tl->tensors, name, t);
    begin_event(tl);
    fprintf(tl->f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"",
            t->pid);
    put_json_str(tl->f, name);
    fputs("\"}}", tl->f);
    begin_event(tl);
    fprintf(tl->f,
            "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
            "{\"sort_index\": %d}}",
            t->pid, t->pid);
    return t;
}

static void span_begin(rt_timeline *tl, tl_tensor *t, const char *what) {
    begin_event(tl);
    fprintf(tl->f, "{\"name\": \"");
    put_json_str(tl->f, what);
    fprintf(tl->f, "\", \"ph\": \"B\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0}", now_us(tl), t->pid);
}

static void span_end(rt_timeline *tl, tl_tensor *t) {
    begin_event(tl);
    fprintf(tl->f, "{\"ph\": \"E\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0}", now_us(tl), t->pid);
}

void rt_timeline_negotiate_start(rt_timeline *tl, const char *name, int optype) {
    if (!tl) return;
    tl_tensor *t = tensor(tl, name);
    if (t->negotiating) return;
    t->negotiating = true;
    char what[64];
    snprintf(what, sizeof what, "NEGOTIATE_%s", rt_optype_upper_name(optype));
    span_begin(tl, t, what);
}

void rt_timeline_negotiate_rank(rt_timeline *tl, const char *name, int rank) {
    if (!tl) return;
    tl_tensor *t = tensor(tl, name);
    begin_event(tl);
    fprintf(
        tl->f,
        "{\"name\": \"%d\", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0}",
        rank, now_us(tl), t->pid);
}

void rt_timeline_negotiate_end(rt_timeline *tl, const char *name) {
    if (!tl) return;
    tl_tensor *t = tensor(tl, name);
    if (!t->negotiating) return;
    t->negotiating = false;
    span_end(tl, t);
}

void rt_timeline_start(rt_timeline *tl, const char *name, const char *activity) {
    if (!tl) return;
    span_begin(tl, tensor(tl, name), activity);
}

void rt_timeline_end(rt_timeline *tl, const char *name) {
    if (!tl) return;
    span_end(tl, tensor(tl, name));
}

void rt_timeline_mark(rt_timeline *tl, const char *name, const char *what) {
    if (!tl) return;
    tl_tensor *t = tensor(tl, name);
    begin_event(tl);
    fprintf(tl->f, "{\"name\": \"");
    put_json_str(tl->f, what);
    fprintf(tl->f, "\", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0}",
            now_us(tl), t->pid);
}
