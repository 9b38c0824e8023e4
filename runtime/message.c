/* Byte encoding of the negotiation messages exchanged over MPI (docs/runtime.md,
 * "Negotiation messages"). All integers little-endian; every read is bounds-checked, so a
 * corrupt message is an error, never an out-of-bounds access.
 *
 * Why not the project's msgpack codec (include/hvd/message.h): these messages never leave the
 * job's MPI communicator, are rebuilt every cycle with up to tens of thousands of names, and
 * the runtime is a library linked into training processes that should not need libhvd_rpc,
 * OpenSSL or msgpack. A fixed little-endian layout is smaller and cheaper here. */
#include "message.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "types.h"

#define RT_MSG_VERSION  1
#define RT_PARAMS_BYTES 40

/* ---- writer ------------------------------------------------------------------------- */

/* Appends to a buffer. Room is reserved once per record, then filled with unchecked writes;
 * after an out-of-memory `failed` stays set and nothing more is written, so encoders check
 * once at the end. */
typedef struct writer {
    hvd_buf *b;
    bool failed;
} writer;

static writer writer_start(hvd_buf *b) {
    b->off = b->len = 0;
    return (writer){b, false};
}

/* The next n bytes of the buffer, or NULL (and failed) on out of memory. */
static uint8_t *room(writer *w, size_t n) {
    if (w->failed || hvd_buf_reserve(w->b, n) != 0) {
        w->failed = true;
        return NULL;
    }
    uint8_t *p = w->b->data + w->b->len;
    w->b->len += n;
    return p;
}

static uint8_t *put_u(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + bytes;
}

static uint8_t *put_f64(uint8_t *p, double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return put_u(p, u, 8);
}

/* A string with a len_bytes length and its NUL (so decoded names can point into the buffer). */
static uint8_t *put_str(uint8_t *p, const char *s, size_t n, int len_bytes) {
    p = put_u(p, n, len_bytes);
    memcpy(p, s, n + 1);
    return p + n + 1;
}

static uint8_t *put_params(uint8_t *p, const rt_params *x) {
    p = put_u(p, x->optype, 1);
    p = put_u(p, x->dtype, 1);
    p = put_u(p, x->op, 1);
    p = put_u(p, x->on_device, 1);
    p = put_u(p, (uint32_t)x->root, 4);
    p = put_u(p, (uint64_t)x->count, 8);
    p = put_u(p, (uint64_t)x->row_elems, 8);
    p = put_f64(p, x->prescale);
    return put_f64(p, x->postscale);
}

/* ---- reader ------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *data;
    size_t len, pos;
    bool bad;
} reader;

static uint64_t get_u(reader *r, int bytes) {
    if (r->bad || r->len - r->pos < (size_t)bytes) {
        r->bad = true;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)r->data[r->pos + (size_t)i] << (8 * i);
    r->pos += (size_t)bytes;
    return v;
}

static double get_f64(reader *r) {
    uint64_t u = get_u(r, 8);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Returns a pointer to a NUL-terminated string inside the data, or NULL (and marks bad). */
static const char *get_str(reader *r, int len_bytes) {
    uint64_t n = get_u(r, len_bytes);
    if (r->bad || r->len - r->pos < n + 1 || r->data[r->pos + n] != 0 ||
        memchr(r->data + r->pos, 0, n)) {
        r->bad = true;
        return NULL;
    }
    const char *s = (const char *)r->data + r->pos;
    r->pos += n + 1;
    return s;
}

static void get_params(reader *r, rt_params *p) {
    p->optype = (uint8_t)get_u(r, 1);
    p->dtype = (uint8_t)get_u(r, 1);
    p->op = (uint8_t)get_u(r, 1);
    p->on_device = (uint8_t)get_u(r, 1);
    p->root = (int32_t)(uint32_t)get_u(r, 4);
    p->count = (int64_t)get_u(r, 8);
    p->row_elems = (int64_t)get_u(r, 8);
    p->prescale = get_f64(r);
    p->postscale = get_f64(r);
    if (p->optype >= RT_NUM_OPTYPES || !rt_dtype_valid(p->dtype) || p->op >= HVD_NUM_REDUCE_OPS)
        r->bad = true;
}

/* ---- requests ----------------------------------------------------------------------- */

int rt_encode_requests(hvd_buf *b, uint32_t flags, const rt_request *reqs, size_t n) {
    writer w = writer_start(b);
    uint8_t *p = room(&w, 9);
    if (p) put_u(put_u(put_u(p, RT_MSG_VERSION, 1), flags, 4), n, 4);
    for (size_t i = 0; i < n && !w.failed; i++) {
        size_t len = strlen(reqs[i].name);
        p = room(&w, 2 + len + 1 + RT_PARAMS_BYTES);
        if (p) put_params(put_str(p, reqs[i].name, len, 2), &reqs[i].p);
    }
    return w.failed ? -1 : 0;
}

int rt_decode_requests(const uint8_t *data, size_t len, uint32_t *flags, rt_request **reqs,
                       size_t *n, hvd_err *err) {
    reader r = {data, len, 0, false};
    *reqs = NULL;
    *n = 0;
    uint64_t version = get_u(&r, 1);
    *flags = (uint32_t)get_u(&r, 4);
    uint64_t count = get_u(&r, 4);
    /* Each request takes at least 3 + RT_PARAMS_BYTES bytes: reject counts the data cannot
     * hold before allocating for them. */
    if (r.bad || version != RT_MSG_VERSION || count > (len - r.pos) / (3 + RT_PARAMS_BYTES))
        return hvd_err_set(err, HVD_E_PROTOCOL, "malformed negotiation request header");
    rt_request *v = count ? malloc(count * sizeof *v) : NULL;
    if (count && !v)
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory decoding %llu negotiation requests",
                           (unsigned long long)count);
    for (uint64_t i = 0; i < count && !r.bad; i++) {
        v[i].name = get_str(&r, 2);
        get_params(&r, &v[i].p);
    }
    if (r.bad || r.pos != len) {
        free(v);
        return hvd_err_set(err, HVD_E_PROTOCOL, "malformed negotiation request body");
    }
    *reqs = v;
    *n = count;
    return 0;
}

/* ---- responses ---------------------------------------------------------------------- */

int rt_encode_responses(hvd_buf *b, const rt_response_list *l) {
    writer w = writer_start(b);
    uint8_t *p = room(&w, 5);
    if (p) put_u(put_u(p, RT_MSG_VERSION, 1), l->n, 4);
    for (size_t i = 0; i < l->n && !w.failed; i++) {
        const rt_response *x = &l->v[i];
        size_t len = strlen(x->name), elen = x->error ? strlen(x->error) : 0;
        p = room(&w, 2 + len + 1 + RT_PARAMS_BYTES + 1 + (x->error ? 4 + 4 + elen + 1 : 0));
        if (!p) break;
        p = put_u(put_params(put_str(p, x->name, len, 2), &x->p), x->error ? 1 : 0, 1);
        if (x->error) put_str(put_u(p, (uint32_t)x->code, 4), x->error, elen, 4);
    }
    return w.failed ? -1 : 0;
}

int rt_decode_responses(const uint8_t *data, size_t len, rt_response_list *l, hvd_err *err) {
    reader r = {data, len, 0, false};
    uint64_t version = get_u(&r, 1);
    uint64_t count = get_u(&r, 4);
    if (r.bad || version != RT_MSG_VERSION || count > (len - r.pos) / (4 + RT_PARAMS_BYTES))
        return hvd_err_set(err, HVD_E_PROTOCOL, "malformed negotiation response header");
    for (uint64_t i = 0; i < count; i++) {
        rt_params p;
        const char *name = get_str(&r, 2);
        get_params(&r, &p);
        bool is_error = get_u(&r, 1) != 0;
        int code = 0;
        const char *error = NULL;
        if (is_error) {
            code = (int)get_u(&r, 4);
            error = get_str(&r, 4);
        }
        if (r.bad) break;
        if (rt_responses_push(l, name, &p, error, code) != 0)
            return hvd_err_set(err, HVD_E_INTERNAL, "out of memory decoding %llu responses",
                               (unsigned long long)count);
    }
    if (r.bad || r.pos != len)
        return hvd_err_set(err, HVD_E_PROTOCOL, "malformed negotiation response body");
    return 0;
}
