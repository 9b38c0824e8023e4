/* Negotiation: which named tensors are ready on every rank, in one order for all ranks.
 *
 * Each cycle starts with one allreduce(BAND) of a small bit vector: flags (shutdown, "I have
 * requests the coordinator has not seen"), the response-cache slots each rank has pending,
 * and slots to invalidate. When no rank has new requests, that is all: slots pending on every
 * rank run straight from the cache. Otherwise every rank sends its new requests to the
 * coordinator (rank 0) with a gather; the coordinator keeps a table of names seen so far,
 * declares a name ready when the last rank's request arrives, checks that all ranks asked for
 * the same thing, and broadcasts the list of responses (ready names in the order they became
 * ready, and errors) to every rank. See docs/runtime.md, "Negotiation". */
#include "internal.h"

#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void rt_controller_init(rt_controller *c, MPI_Comm comm, int rank, int size, rt_timeline *tl) {
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->rank = rank;
    c->size = size;
    c->tl = tl;
    rt_strmap_init(&c->table);
}

static void table_entry_free(rt_table_entry *e) {
    free(e->name);
    free(e->params);
    free(e->present);
    free(e);
}

void rt_controller_free(rt_controller *c) {
    size_t pos = 0;
    void *v;
    while (rt_strmap_next(&c->table, &pos, NULL, &v) >= 0)
        table_entry_free(v);
    rt_strmap_free(&c->table);
    rt_responses_free(&c->backlog);
    free(c->bits);
    rt_buf_free(&c->sendbuf);
    free(c->recvbuf);
}

bool rt_controller_has_backlog(const rt_controller *c) {
    return c->backlog.n > 0;
}

int rt_mpi_wait(MPI_Request *req) {
    /* Non-blocking collectives only progress inside MPI calls, so a rank that sleeps delays
     * every other rank's negotiation by its nap. But oversubscribed jobs (more ranks than
     * cores) suffer when a waiting rank spins. So: test in a tight loop for a while, then
     * test and yield the core (cheap when nobody else wants it), and only then sleep, in
     * naps of at most 50 us. */
    long nap_ns = 5000;
    for (int i = 0;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (done) return MPI_SUCCESS;
        if (i < 128) continue;
        if (i < 4096) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 50000) nap_ns *= 2;
    }
}

int rt_controller_sync_bits(rt_controller *c, uint32_t flags, const uint64_t *hit,
                            const uint64_t *bad, size_t words, rt_bits_result *out, hvd_err *err) {
    size_t n = 1 + 3 * words;
    if (c->nbits_words < n) {
        c->bits = rt_xrealloc(c->bits, 2 * n * sizeof *c->bits);
        c->nbits_words = n;
    }
    uint64_t *in = c->bits, *res = c->bits + n;
    /* AND of complements is the complement of OR: one BAND gives both AND and OR. */
    in[0] = ~(uint64_t)flags;
    for (size_t i = 0; i < words; i++) {
        in[1 + i] = hit[i];
        in[1 + words + i] = ~hit[i];
        in[1 + 2 * words + i] = ~bad[i];
    }
    MPI_Request req;
    int rc = MPI_Iallreduce(in, res, (int)n, MPI_UINT64_T, MPI_BAND, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = rt_mpi_wait(&req);
    if (rc != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "the negotiation allreduce failed (MPI error %d)", rc);
    out->flags_or = (uint32_t)~res[0];
    for (size_t i = 0; i < words; i++) {
        res[1 + words + i] = ~res[1 + words + i];
        res[1 + 2 * words + i] = ~res[1 + 2 * words + i];
    }
    out->and_hit = res + 1;
    out->or_hit = res + 1 + words;
    out->or_bad = res + 1 + 2 * words;
    out->words = words;
    return 0;
}

/* ---- messages naming ranks --------------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->len + (size_t)n + 1) * 2;
        b->s = rt_xrealloc(b->s, b->cap);
    }
}

/* Appends "rank 3" or "ranks 0-2,5" for the ranks r with sel[r] == want. */
static void sb_ranks(strbuf *b, const int *sel, int want, int size) {
    int count = 0;
    for (int r = 0; r < size; r++)
        count += sel[r] == want;
    sb_printf(b, "%s ", count == 1 ? "rank" : "ranks");
    bool first = true;
    for (int r = 0; r < size;) {
        if (sel[r] != want) {
            r++;
            continue;
        }
        int end = r;
        while (end + 1 < size && sel[end + 1] == want)
            end++;
        sb_printf(b, "%s%d", first ? "" : ",", r);
        if (end > r) sb_printf(b, "%s%d", end == r + 1 ? "," : "-", end);
        first = false;
        r = end + 1;
    }
}

/* Describes one parameter for mismatch messages. */
typedef void (*describe_fn)(strbuf *b, const rt_params *p);

static void d_optype(strbuf *b, const rt_params *p) {
    sb_printf(b, "%s", rt_optype_name(p->optype));
}
static void d_device(strbuf *b, const rt_params *p) {
    sb_printf(b, "%s", p->on_device ? "CUDA device memory" : "host memory");
}
static void d_dtype(strbuf *b, const rt_params *p) {
    sb_printf(b, "%s", hvd_dtype_name((hvd_dtype)p->dtype));
}
static void d_count(strbuf *b, const rt_params *p) {
    sb_printf(b, "%lld elements", (long long)p->count);
}
static void d_row(strbuf *b, const rt_params *p) {
    sb_printf(b, "%lld elements per row", (long long)p->row_elems);
}
static void d_op(strbuf *b, const rt_params *p) {
    sb_printf(b, "%s", hvd_reduce_op_name((hvd_reduce_op)p->op));
}
static void d_root(strbuf *b, const rt_params *p) {
    sb_printf(b, "root %d", p->root);
}
static void d_scale(strbuf *b, const rt_params *p) {
    sb_printf(b, "prescale %g and postscale %g", p->prescale, p->postscale);
}

static bool same_optype(const rt_params *a, const rt_params *b) {
    return a->optype == b->optype;
}
static bool same_device(const rt_params *a, const rt_params *b) {
    return a->on_device == b->on_device;
}
static bool same_dtype(const rt_params *a, const rt_params *b) {
    return a->dtype == b->dtype;
}
static bool same_count(const rt_params *a, const rt_params *b) {
    return a->count == b->count;
}
static bool same_row(const rt_params *a, const rt_params *b) {
    return a->row_elems == b->row_elems;
}
static bool same_op(const rt_params *a, const rt_params *b) {
    return a->op == b->op;
}
static bool same_root(const rt_params *a, const rt_params *b) {
    return a->root == b->root;
}
static bool same_scale(const rt_params *a, const rt_params *b) {
    return a->prescale == b->prescale && a->postscale == b->postscale;
}

static const struct {
    const char *what;
    bool (*same)(const rt_params *, const rt_params *);
    describe_fn describe;
} checks[] = {
    {"operations", same_optype, d_optype},
    {"devices", same_device, d_device},
    {"types", same_dtype, d_dtype},
    {"shapes", same_count, d_count},
    {"shapes", same_row, d_row},
    {"reduce ops", same_op, d_op},
    {"broadcast roots", same_root, d_root},
    {"scaling factors", same_scale, d_scale},
};

/* Returns NULL if every rank asked for the same thing, else a malloc'd sentence naming the
 * tensor, the first parameter that differs, and which ranks asked for which value. */
static char *check_agreement(const rt_table_entry *e, int size) {
    for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++) {
        bool differ = false;
        for (int r = 1; r < size && !differ; r++)
            differ = !checks[k].same(&e->params[0], &e->params[r]);
        if (!differ) continue;
        /* Group ranks by value: group[r] = first rank with the same value. */
        int *group = rt_xmalloc((size_t)size * sizeof *group);
        for (int r = 0; r < size; r++) {
            group[r] = r;
            for (int q = 0; q < r; q++)
                if (checks[k].same(&e->params[q], &e->params[r])) {
                    group[r] = q;
                    break;
                }
        }
        strbuf b = {0};
        sb_printf(&b, "tensor '%s' was submitted with mismatched %s across ranks: ", e->name,
                  checks[k].what);
        bool first = true;
        for (int r = 0; r < size; r++) {
            if (group[r] != r) continue;
            sb_printf(&b, "%s", first ? "" : "; ");
            checks[k].describe(&b, &e->params[r]);
            sb_printf(&b, " on ");
            sb_ranks(&b, group, r, size);
            first = false;
        }
        sb_printf(&b, ". Every rank must submit a name with the same parameters");
        free(group);
        return b.s;
    }
    return NULL;
}

/* Error for a name still pending when some rank shut down. */
static char *shutdown_message(const rt_table_entry *e, const int *shut, int size) {
    strbuf b = {0};
    sb_printf(&b, "the runtime was shut down (hvd_shutdown on ");
    sb_ranks(&b, shut, 1, size);
    sb_printf(&b, ") while tensor '%s' was pending: submitted by ", e->name);
    int *pres = rt_xmalloc((size_t)size * sizeof *pres);
    for (int r = 0; r < size; r++)
        pres[r] = e->present[r];
    sb_ranks(&b, pres, 1, size);
    if (e->nranks < size) {
        sb_printf(&b, ", never submitted by ");
        sb_ranks(&b, pres, 0, size);
    }
    free(pres);
    return b.s;
}

static char *stall_message(const rt_table_entry *e, int size, double seconds) {
    strbuf b = {0};
    int *pres = rt_xmalloc((size_t)size * sizeof *pres);
    for (int r = 0; r < size; r++)
        pres[r] = e->present[r];
    sb_printf(&b,
              "tensor '%s' waited more than %.0f s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): "
              "submitted by ",
              e->name, seconds);
    sb_ranks(&b, pres, 1, size);
    sb_printf(&b, ", never submitted by ");
    sb_ranks(&b, pres, 0, size);
    free(pres);
    return b.s;
}

void rt_controller_tick(rt_controller *c, int64_t now) {
    if (c->rank != 0) return;
    rt_table_entry **expired;
    size_t nexpired;
    rt_stall_check(&c->stall, &c->table, c->size, now, &expired, &nexpired);
    for (size_t i = 0; i < nexpired; i++) {
        rt_table_entry *e = expired[i];
        char *msg = stall_message(e, c->size, (double)c->stall.shutdown_ns / 1e9);
        rt_responses_push(&c->backlog, e->name, NULL, msg, HVD_E_TIMEOUT);
        rt_timeline_negotiate_end(c->tl, e->name);
        rt_timeline_mark(c->tl, e->name, "STALL_SHUTDOWN");
        free(msg);
        rt_strmap_del(&c->table, e->name);
        table_entry_free(e);
    }
    free(expired);
}

/* ---- the coordinator ------------------------------------------------------------------ */

/* Records rank r's requests; appends names that became ready to *ready. */
static void coordinator_add(rt_controller *c, int r, const rt_request *reqs, size_t n,
                            rt_table_entry ***ready, size_t *nready, size_t *capready) {
    int64_t now = rt_now_ns();
    for (size_t i = 0; i < n; i++) {
        rt_table_entry *e = rt_strmap_get(&c->table, reqs[i].name);
        if (!e) {
            e = rt_xcalloc(1, sizeof *e);
            e->name = rt_xstrdup(reqs[i].name);
            e->params = rt_xcalloc((size_t)c->size, sizeof *e->params);
            e->present = rt_xcalloc((size_t)c->size, 1);
            e->first_ns = now;
            rt_strmap_put(&c->table, e->name, e);
            rt_timeline_negotiate_start(c->tl, e->name, reqs[i].p.optype);
        }
        if (e->present[r]) continue; /* a re-send at shutdown */
        e->present[r] = 1;
        e->params[r] = reqs[i].p;
        e->nranks++;
        rt_timeline_negotiate_rank(c->tl, e->name, r);
        if (e->nranks == c->size) {
            if (*nready == *capready) {
                *capready = *capready ? *capready * 2 : 64;
                *ready = rt_xrealloc(*ready, *capready * sizeof **ready);
            }
            (*ready)[(*nready)++] = e;
        }
    }
}

/* Builds the response list from the gathered messages (rank 0 only). */
static int coordinator_decide(rt_controller *c, const uint8_t *all, const int *lens,
                              const int *displs, rt_response_list *out, hvd_err *err) {
    int *shut = rt_xcalloc((size_t)c->size, sizeof *shut);
    bool any_shut = false;
    rt_table_entry **ready = NULL;
    size_t nready = 0, capready = 0;
    int ret = 0;
    for (int r = 0; r < c->size && ret == 0; r++) {
        uint32_t flags;
        rt_request *reqs;
        size_t n;
        if (rt_decode_requests(all + displs[r], (size_t)lens[r], &flags, &reqs, &n, err) != 0) {
            ret = rt_err(err, HVD_E_PROTOCOL, "negotiation message from rank %d is malformed", r);
            break;
        }
        if (flags & RT_FLAG_SHUTDOWN) {
            shut[r] = 1;
            any_shut = true;
        }
        coordinator_add(c, r, reqs, n, &ready, &nready, &capready);
        free(reqs);
    }
    if (ret == 0) {
        /* Stall errors decided in earlier ticks go first. */
        for (size_t i = 0; i < c->backlog.n; i++)
            rt_responses_push(out, c->backlog.v[i].name, NULL, c->backlog.v[i].error,
                              c->backlog.v[i].code);
        rt_responses_clear(&c->backlog);
        for (size_t i = 0; i < nready; i++) {
            rt_table_entry *e = ready[i];
            char *mismatch = check_agreement(e, c->size);
            rt_timeline_negotiate_end(c->tl, e->name);
            if (mismatch) rt_timeline_mark(c->tl, e->name, "MISMATCH");
            rt_responses_push(out, e->name, &e->params[0], mismatch, HVD_E_INVALID);
            free(mismatch);
            rt_strmap_del(&c->table, e->name);
            table_entry_free(e);
        }
        if (any_shut) {
            size_t pos = 0;
            void *v;
            while (rt_strmap_next(&c->table, &pos, NULL, &v) >= 0) {
                rt_table_entry *e = v;
                char *msg = shutdown_message(e, shut, c->size);
                rt_timeline_negotiate_end(c->tl, e->name);
                rt_responses_push(out, e->name, NULL, msg, HVD_E_SHUTDOWN);
                free(msg);
                table_entry_free(e);
            }
            rt_strmap_free(&c->table);
        }
    }
    free(ready);
    free(shut);
    return ret;
}

int rt_controller_negotiate(rt_controller *c, uint32_t my_flags, const rt_request *reqs, size_t n,
                            rt_response_list *out, hvd_err *err) {
    rt_encode_requests(&c->sendbuf, my_flags, reqs, n);
    /* Keep the gathered total inside int. A rank whose message is too big still takes part
     * in every collective (sending nothing, length -1), so all ranks learn of the failure
     * from the coordinator instead of some of them waiting forever. */
    int mylen = c->sendbuf.len > (size_t)(INT32_MAX / c->size) ? -1 : (int)c->sendbuf.len;
    int *lens = NULL, *displs = NULL;
    if (c->rank == 0) {
        lens = rt_xmalloc((size_t)c->size * sizeof *lens);
        displs = rt_xmalloc((size_t)c->size * sizeof *displs);
    }
    MPI_Request req;
    int rc = MPI_Igather(&mylen, 1, MPI_INT, lens, 1, MPI_INT, 0, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = rt_mpi_wait(&req);
    bool oversized = false;
    if (rc == MPI_SUCCESS && c->rank == 0) {
        size_t total = 0;
        for (int r = 0; r < c->size; r++) {
            if (lens[r] < 0) {
                oversized = true;
                lens[r] = 0;
            }
            displs[r] = (int)total;
            total += (size_t)lens[r];
        }
        if (total > c->recvcap || !c->recvbuf) {
            c->recvbuf = rt_xrealloc(c->recvbuf, total ? total : 1);
            c->recvcap = total;
        }
    }
    if (rc == MPI_SUCCESS) {
        rc = MPI_Igatherv(c->sendbuf.data, mylen < 0 ? 0 : mylen, MPI_BYTE, c->recvbuf, lens,
                          displs, MPI_BYTE, 0, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = rt_mpi_wait(&req);
    }
    if (rc != MPI_SUCCESS) {
        free(lens);
        free(displs);
        return rt_err(err, HVD_E_INTERNAL, "gathering negotiation requests failed (MPI error %d)",
                      rc);
    }

    /* The coordinator decides. If it cannot, it still broadcasts a length (-1), so that every
     * rank fails the cycle together instead of waiting for a list that never comes. */
    int64_t resp_len = 0;
    rt_buf resp = {0};
    size_t first_new = out->n;
    if (c->rank == 0) {
        hvd_err derr = {0};
        if (oversized || coordinator_decide(c, c->recvbuf, lens, displs, out, &derr) != 0) {
            rt_log("coordinator: %s",
                   oversized ? "a rank's negotiation message exceeds the 2 GiB that MPI can "
                               "gather; submit fewer tensors per step"
                             : derr.msg);
            resp_len = -1;
        } else {
            /* out->v may still be NULL (nothing decided yet): no pointer arithmetic on it. */
            rt_response_list view = {out->v ? out->v + first_new : NULL, out->n - first_new, 0};
            rt_encode_responses(&resp, &view);
            resp_len = (int64_t)resp.len;
        }
    }
    free(lens);
    free(displs);
    rc = MPI_Ibcast(&resp_len, 1, MPI_INT64_T, 0, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = rt_mpi_wait(&req);
    if (rc == MPI_SUCCESS && resp_len > 0) {
        if (c->rank != 0) resp.data = rt_xmalloc((size_t)resp_len);
        for (int64_t off = 0; off < resp_len && rc == MPI_SUCCESS; off += INT32_MAX / 2) {
            int chunk = (int)(resp_len - off < INT32_MAX / 2 ? resp_len - off : INT32_MAX / 2);
            rc = MPI_Ibcast(resp.data + off, chunk, MPI_BYTE, 0, c->comm, &req);
            if (rc == MPI_SUCCESS) rc = rt_mpi_wait(&req);
        }
    }
    int ret = 0;
    if (rc != MPI_SUCCESS)
        ret = rt_err(err, HVD_E_INTERNAL,
                     "broadcasting negotiation responses failed (MPI error %d)", rc);
    else if (resp_len < 0)
        ret = rt_err(err, HVD_E_PROTOCOL,
                     "the coordinator could not decode the negotiation requests (see rank 0's "
                     "log)");
    else if (c->rank != 0 && resp_len > 0)
        ret = rt_decode_responses(resp.data, (size_t)resp_len, out, err);
    rt_buf_free(&resp);
    return ret;
}
