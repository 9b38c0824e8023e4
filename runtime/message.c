/* Byte encoding of the negotiation messages exchanged over MPI (docs/runtime.md,
 * "Negotiation messages"). All integers little-endian; every read is bounds-checked, so a
 * corrupt message is an error, never an out-of-bounds access.
 *
 * Why not the project's msgpack codec (include/hvd/message.h): these messages never leave the
 * job's MPI communicator, are rebuilt every cycle with up to tens of thousands of names, and
 * the runtime is a library linked into training processes that should not need libhvd_rpc,
 * OpenSSL or msgpack. A fixed little-endian layout is smaller and cheaper here. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define RT_MSG_VERSION  1
#define RT_PARAMS_BYTES 40

/* ---- writer ------------------------------------------------------------------------- */

void rt_buf_free(rt_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static uint8_t *reserve(rt_buf *b, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->data = rt_xrealloc(b->data, cap);
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

static void put_u(rt_buf *b, uint64_t v, int bytes) {
    uint8_t *p = reserve(b, (size_t)bytes);
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_f64(rt_buf *b, double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put_u(b, u, 8);
}

static void put_str(rt_buf *b, const char *s, int len_bytes) {
    size_t n = strlen(s);
    put_u(b, n, len_bytes);
    uint8_t *p = reserve(b, n + 1);
    memcpy(p, s, n + 1); /* with its NUL, so decoded names can point into the buffer */
}

static void put_params(rt_buf *b, const rt_params *p) {
    put_u(b, p->optype, 1);
    put_u(b, p->dtype, 1);
    put_u(b, p->op, 1);
    put_u(b, p->on_device, 1);
    put_u(b, (uint32_t)p->root, 4);
    put_u(b, (uint64_t)p->count, 8);
    put_u(b, (uint64_t)p->row_elems, 8);
    put_f64(b, p->prescale);
    put_f64(b, p->postscale);
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

void rt_encode_requests(rt_buf *b, uint32_t flags, const rt_request *reqs, size_t n) {
    b->len = 0;
    put_u(b, RT_MSG_VERSION, 1);
    put_u(b, flags, 4);
    put_u(b, n, 4);
    for (size_t i = 0; i < n; i++) {
        put_str(b, reqs[i].name, 2);
        put_params(b, &reqs[i].p);
    }
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
        return rt_err(err, HVD_E_PROTOCOL, "malformed negotiation request header");
    rt_request *v = count ? rt_xmalloc(count * sizeof *v) : NULL;
    for (uint64_t i = 0; i < count && !r.bad; i++) {
        v[i].name = get_str(&r, 2);
        get_params(&r, &v[i].p);
    }
    if (r.bad || r.pos != len) {
        free(v);
        return rt_err(err, HVD_E_PROTOCOL, "malformed negotiation request body");
    }
    *reqs = v;
    *n = count;
    return 0;
}

/* ---- responses ---------------------------------------------------------------------- */

void rt_encode_responses(rt_buf *b, const rt_response_list *l) {
    b->len = 0;
    put_u(b, RT_MSG_VERSION, 1);
    put_u(b, l->n, 4);
    for (size_t i = 0; i < l->n; i++) {
        const rt_response *x = &l->v[i];
        put_str(b, x->name, 2);
        put_params(b, &x->p);
        put_u(b, x->error ? 1 : 0, 1);
        if (x->error) {
            put_u(b, (uint32_t)x->code, 4);
            put_str(b, x->error, 4);
        }
    }
}

int rt_decode_responses(const uint8_t *data, size_t len, rt_response_list *l, hvd_err *err) {
    reader r = {data, len, 0, false};
    uint64_t version = get_u(&r, 1);
    uint64_t count = get_u(&r, 4);
    if (r.bad || version != RT_MSG_VERSION || count > (len - r.pos) / (4 + RT_PARAMS_BYTES))
        return rt_err(err, HVD_E_PROTOCOL, "malformed negotiation response header");
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
        rt_responses_push(l, name, &p, error, code);
    }
    if (r.bad || r.pos != len)
        return rt_err(err, HVD_E_PROTOCOL, "malformed negotiation response body");
    return 0;
}

/* ---- response lists ----------------------------------------------------------------- */

void rt_responses_push(rt_response_list *l, const char *name, const rt_params *p, const char *error,
                       int code) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = rt_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    rt_response *x = &l->v[l->n++];
    x->name = rt_xstrdup(name);
    if (p)
        x->p = *p;
    else
        memset(&x->p, 0, sizeof x->p);
    x->error = error ? rt_xstrdup(error) : NULL;
    x->code = error ? code : 0;
}

void rt_responses_clear(rt_response_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].error);
    }
    l->n = 0;
}

void rt_responses_free(rt_response_list *l) {
    rt_responses_clear(l);
    free(l->v);
    l->v = NULL;
    l->cap = 0;
}

bool rt_params_equal(const rt_params *a, const rt_params *b) {
    return a->optype == b->optype && a->dtype == b->dtype && a->op == b->op &&
           a->on_device == b->on_device && a->root == b->root && a->count == b->count &&
           a->row_elems == b->row_elems && a->prescale == b->prescale &&
           a->postscale == b->postscale;
}

static const char *const optype_names[RT_NUM_OPTYPES] = {"allreduce", "allgather",     "broadcast",
                                                         "alltoall",  "reducescatter", "barrier"};
static const char *const optype_upper[RT_NUM_OPTYPES] = {"ALLREDUCE", "ALLGATHER",     "BROADCAST",
                                                         "ALLTOALL",  "REDUCESCATTER", "BARRIER"};

const char *rt_optype_name(int optype) {
    return optype >= 0 && optype < RT_NUM_OPTYPES ? optype_names[optype] : "?";
}

const char *rt_optype_upper_name(int optype) {
    return optype >= 0 && optype < RT_NUM_OPTYPES ? optype_upper[optype] : "?";
}
