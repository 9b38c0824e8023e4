/* Negotiation (controller.h): which named tensors are ready on every rank, in one order for
 * all ranks.
 *
 * Each cycle starts with one allreduce(BAND) of a small bit vector: flags (shutdown, "I have
 * requests the coordinator has not seen", ...), the response-cache slots each rank has
 * pending, and slots to invalidate. When no rank has new requests, that is all: slots pending
 * on every rank run straight from the cache. Otherwise every rank sends its new requests to
 * the coordinator (rank 0) with a gather; the coordinator keeps a table of names seen so far,
 * declares a name ready when the last rank's request arrives, checks that all ranks asked for
 * the same thing, and broadcasts the list of responses (ready names in the order they became
 * ready, and errors) to every rank. See docs/runtime.md, "Negotiation". */
#include "controller.h"

#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "hvd/runtime.h"
#include "log.h"
#include "message.h"

/* Request-message lengths a rank sends instead of a message it cannot send. */
#define LEN_TOO_BIG (-1) /* over what MPI can gather */
#define LEN_NOMEM   (-2) /* out of memory building it */

int rt_controller_init(rt_controller *c, MPI_Comm comm, int rank, int size, size_t words,
                       rt_timeline *tl, hvd_err *err) {
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->rank = rank;
    c->size = size;
    c->tl = tl;
    c->words = words;
    rt_strmap_init(&c->table);
    c->bits = calloc(2 * (1 + 3 * words), sizeof *c->bits);
    c->lens = calloc((size_t)size, sizeof *c->lens);
    c->displs = calloc((size_t)size, sizeof *c->displs);
    c->ranks = calloc((size_t)size, sizeof *c->ranks);
    c->joined = calloc((size_t)size, 1);
    c->join_device = calloc((size_t)size, 1);
    if (!c->bits || !c->lens || !c->displs || !c->ranks || !c->joined || !c->join_device)
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory for the negotiation buffers");
    return 0;
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
    free(c->lens);
    free(c->displs);
    free(c->ranks);
    free(c->joined);
    free(c->join_device);
    hvd_buf_free(&c->sendbuf);
    free(c->recvbuf);
    memset(c, 0, sizeof *c);
}

bool rt_controller_has_backlog(const rt_controller *c) {
    return c->backlog.n > 0;
}

/* Waits for an MPI request without hogging the core. Non-blocking collectives only progress
 * inside MPI calls, so a rank that sleeps delays every other rank's negotiation by its nap.
 * But oversubscribed jobs (more ranks than cores) suffer when a waiting rank spins. So: test
 * in a tight loop for a while, then test and yield the core (cheap when nobody else wants
 * it), and only then sleep, in naps of at most 50 us. */
static int mpi_wait(MPI_Request *req) {
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
                            const uint64_t *bad, rt_bits_result *out, hvd_err *err) {
    size_t words = c->words, n = 1 + 3 * words;
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
    if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    if (rc != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "the negotiation allreduce failed (MPI error %d)",
                           rc);
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

int rt_controller_share_failure(rt_controller *c, const hvd_err *mine, hvd_err *out) {
    int me = mine->code ? c->rank : INT_MAX, first = INT_MAX;
    char msg[HVD_ERR_MAX];
    MPI_Request req;
    int rc = MPI_Iallreduce(&me, &first, 1, MPI_INT, MPI_MIN, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    if (rc == MPI_SUCCESS && first != INT_MAX) {
        snprintf(msg, sizeof msg, "%s", mine->msg);
        rc = MPI_Ibcast(msg, (int)sizeof msg, MPI_CHAR, first, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    }
    if (rc != MPI_SUCCESS)
        return hvd_err_set(out, HVD_E_INTERNAL,
                           "agreeing on a rank's failure failed (MPI error %d)", rc);
    if (first == INT_MAX)
        return hvd_err_set(out, HVD_E_INTERNAL,
                           "internal error: a rank flagged a failure it "
                           "does not report");
    msg[sizeof msg - 1] = '\0';
    hvd_err_set(out, HVD_E_INTERNAL, "%s", msg);
    return 0;
}

/* ---- messages naming ranks --------------------------------------------------------- */

/* A sentence being built, cut at HVD_ERR_MAX like every error text a caller sees (hvd_err),
 * so that building one needs no memory. */
typedef struct msgbuf {
    char s[HVD_ERR_MAX];
    size_t len;
} msgbuf;

static void mb_printf(msgbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mb_printf(msgbuf *b, const char *fmt, ...) {
    if (b->len >= sizeof b->s - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s + b->len, sizeof b->s - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    b->len += (size_t)n;
    if (b->len > sizeof b->s - 1) b->len = sizeof b->s - 1;
}

/* Appends "rank 3" or "ranks 0-2,5" for the ranks r with sel[r] == want. */
static void mb_ranks(msgbuf *b, const int *sel, int want, int size) {
    int count = 0;
    for (int r = 0; r < size; r++)
        count += sel[r] == want;
    mb_printf(b, "%s ", count == 1 ? "rank" : "ranks");
    bool first = true;
    for (int r = 0; r < size;) {
        if (sel[r] != want) {
            r++;
            continue;
        }
        int end = r;
        while (end + 1 < size && sel[end + 1] == want)
            end++;
        mb_printf(b, "%s%d", first ? "" : ",", r);
        if (end > r) mb_printf(b, "%s%d", end == r + 1 ? "," : "-", end);
        first = false;
        r = end + 1;
    }
}

/* Describes one parameter for mismatch messages. */
typedef void (*describe_fn)(msgbuf *b, const rt_params *p);

static void d_optype(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%s", rt_optype_name(p->optype));
}
static void d_device(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%s", p->on_device ? "CUDA device memory" : "host memory");
}
static void d_dtype(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%s", hvd_dtype_name((hvd_dtype)p->dtype));
}
static void d_count(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%lld elements", (long long)p->count);
}
static void d_row(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%lld elements per row", (long long)p->row_elems);
}
static void d_op(msgbuf *b, const rt_params *p) {
    mb_printf(b, "%s", hvd_reduce_op_name((hvd_reduce_op)p->op));
}
static void d_root(msgbuf *b, const rt_params *p) {
    mb_printf(b, "root %d", p->root);
}
static void d_scale(msgbuf *b, const rt_params *p) {
    mb_printf(b, "prescale %g and postscale %g", p->prescale, p->postscale);
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

/* The first rank that asked for e (whose parameters the response carries). */
static int first_present(const rt_controller *c, const rt_table_entry *e) {
    int r = 0;
    while (r < c->size - 1 && !e->present[r])
        r++;
    return r;
}

/* Returns false if every rank that asked for e asked for the same thing, else true with a
 * sentence in b naming the tensor, the first parameter that differs, and which ranks asked for
 * which value. */
static bool check_agreement(rt_controller *c, const rt_table_entry *e, msgbuf *b) {
    int size = c->size, ref = first_present(c, e);
    for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++) {
        bool differ = false;
        for (int r = ref + 1; r < size && !differ; r++)
            differ = e->present[r] && !checks[k].same(&e->params[ref], &e->params[r]);
        if (!differ) continue;
        /* Group the ranks that asked by value: group[r] = first rank with the same value. */
        int *group = c->ranks;
        for (int r = 0; r < size; r++) {
            group[r] = e->present[r] ? r : -1;
            for (int q = 0; q < r && e->present[r]; q++)
                if (e->present[q] && checks[k].same(&e->params[q], &e->params[r])) {
                    group[r] = q;
                    break;
                }
        }
        mb_printf(b, "tensor '%s' was submitted with mismatched %s across ranks: ", e->name,
                  checks[k].what);
        bool first = true;
        for (int r = 0; r < size; r++) {
            if (group[r] != r) continue; /* not asked, or the same value as an earlier rank */
            mb_printf(b, "%s", first ? "" : "; ");
            checks[k].describe(b, &e->params[r]);
            mb_printf(b, " on ");
            mb_ranks(b, group, r, size);
            first = false;
        }
        mb_printf(b, ". Every rank must submit a name with the same parameters");
        return true;
    }
    return false;
}

/* c->ranks[r] = whether rank r submitted e. */
static const int *presence(rt_controller *c, const rt_table_entry *e) {
    for (int r = 0; r < c->size; r++)
        c->ranks[r] = e->present[r];
    return c->ranks;
}

/* Error for a name still pending when some rank shut down. */
static void shutdown_message(rt_controller *c, const rt_table_entry *e, const int *shut,
                             msgbuf *b) {
    mb_printf(b, "the runtime was shut down (hvd_shutdown on ");
    mb_ranks(b, shut, 1, c->size);
    mb_printf(b, ") while tensor '%s' was pending: submitted by ", e->name);
    const int *pres = presence(c, e);
    mb_ranks(b, pres, 1, c->size);
    if (e->nranks < c->size) {
        mb_printf(b, ", never submitted by ");
        mb_ranks(b, pres, 0, c->size);
    }
}

static void stall_message(rt_controller *c, const rt_table_entry *e, double seconds, msgbuf *b) {
    const int *pres = presence(c, e);
    mb_printf(b,
              "tensor '%s' waited more than %.0f s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): "
              "submitted by ",
              e->name, seconds);
    mb_ranks(b, pres, 1, c->size);
    mb_printf(b, ", never submitted by ");
    mb_ranks(b, pres, 0, c->size);
}

void rt_controller_tick(rt_controller *c, int64_t now) {
    if (c->rank != 0) return;
    rt_table_entry **expired;
    size_t nexpired;
    rt_stall_check(&c->stall, &c->table, c->size, now, &expired, &nexpired);
    for (size_t i = 0; i < nexpired; i++) {
        rt_table_entry *e = expired[i];
        msgbuf msg = {.len = 0};
        stall_message(c, e, (double)c->stall.shutdown_ns / 1e9, &msg);
        /* Out of memory: the name stays in the table and expires at a later check. */
        if (rt_responses_push(&c->backlog, e->name, NULL, msg.s, HVD_E_TIMEOUT) != 0) continue;
        rt_timeline_negotiate_end(c->tl, e->name);
        rt_timeline_mark(c->tl, e->name, "STALL_SHUTDOWN");
        rt_strmap_del(&c->table, e->name);
        table_entry_free(e);
    }
    free(expired);
}

/* ---- the coordinator ------------------------------------------------------------------ */

/* Names that became ready during one decision, in order. */
typedef struct ready_list {
    rt_table_entry **v;
    size_t n, cap;
} ready_list;

/* The table entry of name, created for its first request; NULL on out of memory. */
static rt_table_entry *table_entry(rt_controller *c, const rt_request *req, int64_t now) {
    rt_table_entry *e = rt_strmap_get(&c->table, req->name);
    if (e) return e;
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->name = strdup(req->name);
    e->params = calloc((size_t)c->size, sizeof *e->params);
    e->present = calloc((size_t)c->size, 1);
    if (!e->name || !e->params || !e->present || rt_strmap_put(&c->table, e->name, e) != 0) {
        table_entry_free(e);
        return NULL;
    }
    e->first_ns = now;
    e->optype = req->p.optype;
    rt_timeline_negotiate_start(c->tl, e->name, req->p.optype);
    return e;
}

/* Room for one more in *ready. Returns 0, or -1 on out of memory. */
static int ready_reserve(ready_list *ready) {
    if (ready->n < ready->cap) return 0;
    size_t cap = ready->cap ? ready->cap * 2 : 64;
    rt_table_entry **v = realloc(ready->v, cap * sizeof *v);
    if (!v) return -1;
    ready->v = v;
    ready->cap = cap;
    return 0;
}

/* Records rank r's requests; appends names that became ready to *ready. Returns 0, or -1 on
 * out of memory. */
static int coordinator_add(rt_controller *c, int r, const rt_request *reqs, size_t n,
                           ready_list *ready) {
    int64_t now = hvd_now_ns();
    for (size_t i = 0; i < n; i++) {
        rt_table_entry *e = table_entry(c, &reqs[i], now);
        if (!e) return -1;
        if (e->present[r]) continue; /* a re-send at shutdown */
        if (e->nranks + 1 == c->size && ready_reserve(ready) != 0) return -1;
        e->present[r] = 1;
        e->params[r] = reqs[i].p;
        e->nranks++;
        if (reqs[i].p.optype == RT_JOIN && !c->joined[r]) {
            c->joined[r] = 1;
            c->join_device[r] = reqs[i].p.root != 0;
            c->njoined++;
            c->last_joined = r;
        }
        rt_timeline_negotiate_rank(c->tl, e->name, r);
        if (e->nranks == c->size) ready->v[ready->n++] = e;
    }
    return 0;
}

/* Decodes every rank's message into the table. Sets shut[r] for ranks shutting down. Returns
 * 0, or -1 with err. */
static int coordinator_collect(rt_controller *c, const uint8_t *all, int *shut, ready_list *ready,
                               hvd_err *err) {
    for (int r = 0; r < c->size; r++) {
        uint32_t flags;
        rt_request *reqs;
        size_t n;
        hvd_err derr = {0};
        if (rt_decode_requests(all + c->displs[r], (size_t)c->lens[r], &flags, &reqs, &n, &derr) !=
            0) {
            if (derr.code == HVD_E_PROTOCOL)
                return hvd_err_set(err, HVD_E_PROTOCOL,
                                   "negotiation message from rank %d is malformed", r);
            return hvd_err_set(err, HVD_E_INTERNAL,
                               "the coordinator (rank 0) ran out of memory reading rank %d's "
                               "negotiation message",
                               r);
        }
        shut[r] = (flags & RT_FLAG_SHUTDOWN) != 0;
        int rc = coordinator_add(c, r, reqs, n, ready);
        free(reqs);
        if (rc != 0)
            return hvd_err_set(err, HVD_E_INTERNAL,
                               "the coordinator (rank 0) ran out of memory matching requests");
    }
    return 0;
}

/* Appends to *ready the names (joins aside) that every rank which has not joined asked for,
 * and some joined rank did not: the joined ranks take part with zeros. Names every rank asked
 * for are listed already. Returns 0, or -1 on out of memory. */
static int add_joined_ready(rt_controller *c, ready_list *ready) {
    if (c->njoined == 0) return 0;
    size_t pos = 0;
    void *v;
    while (rt_strmap_next(&c->table, &pos, NULL, &v) >= 0) {
        rt_table_entry *e = v;
        if (e->optype == RT_JOIN || e->nranks == c->size) continue;
        bool waits = false;
        for (int r = 0; r < c->size && !waits; r++)
            waits = !e->present[r] && !c->joined[r];
        if (waits) continue;
        if (ready_reserve(ready) != 0) return -1;
        ready->v[ready->n++] = e;
    }
    return 0;
}

/* Returns false if e can run with the joined ranks that did not ask for it (there are none,
 * or it is an allreduce they can give zeros for), else true with the reason in b. */
static bool check_joined(rt_controller *c, const rt_table_entry *e, msgbuf *b) {
    if (e->nranks == c->size) return false;
    const rt_params *p = &e->params[first_present(c, e)];
    int *missing = c->ranks;
    for (int r = 0; r < c->size; r++)
        missing[r] = !e->present[r];
    if (p->optype != RT_ALLREDUCE) {
        mb_printf(b, "%s of tensor '%s' cannot run while ", rt_optype_name(p->optype), e->name);
        mb_ranks(b, missing, 1, c->size);
        mb_printf(b, " joined (hvd_join) without it: only an allreduce takes zeros from a "
                     "joined rank");
        return true;
    }
    if (!p->on_device) return false;
    bool lacking = false;
    for (int r = 0; r < c->size; r++) {
        missing[r] = !e->present[r] && !c->join_device[r];
        lacking |= missing[r] != 0;
    }
    if (!lacking) return false;
    mb_printf(b, "tensor '%s' is in CUDA device memory, but ", e->name);
    mb_ranks(b, missing, 1, c->size);
    mb_printf(b, " joined without a device for its zeros: pass the CUDA device to join "
                 "(hvd.join(device=...))");
    return true;
}

/* Decides one ready name other than a join: its response (or error) goes to out. Returns 0,
 * or -1 on out of memory. */
static int decide_one(rt_controller *c, rt_table_entry *e, rt_response_list *out) {
    msgbuf why = {.len = 0};
    bool mismatch = check_agreement(c, e, &why);
    bool cannot = !mismatch && check_joined(c, e, &why);
    rt_timeline_negotiate_end(c->tl, e->name);
    if (mismatch || cannot) rt_timeline_mark(c->tl, e->name, mismatch ? "MISMATCH" : "JOINED");
    int ret = rt_responses_push(out, e->name, &e->params[first_present(c, e)],
                                mismatch || cannot ? why.s : NULL, HVD_E_INVALID);
    rt_strmap_del(&c->table, e->name);
    table_entry_free(e);
    return ret;
}

/* Every rank joined: the join completes, naming the last rank to join, and a new one can
 * start. Returns 0, or -1 on out of memory. */
static int decide_join(rt_controller *c, rt_table_entry *e, rt_response_list *out) {
    rt_params p = {.optype = RT_JOIN,
                   .dtype = HVD_UINT8,
                   .root = c->last_joined,
                   .row_elems = 1,
                   .prescale = 1.0,
                   .postscale = 1.0};
    rt_timeline_negotiate_end(c->tl, e->name);
    int ret = rt_responses_push(out, e->name, &p, NULL, 0);
    rt_strmap_del(&c->table, e->name);
    table_entry_free(e);
    memset(c->joined, 0, (size_t)c->size);
    memset(c->join_device, 0, (size_t)c->size);
    c->njoined = 0;
    return ret;
}

/* Builds the response list from the gathered messages (rank 0 only). Returns 0, or -1 with
 * err (every rank then fails the cycle with it). */
static int coordinator_decide(rt_controller *c, const uint8_t *all, rt_response_list *out,
                              hvd_err *err) {
    int *shut = calloc((size_t)c->size, sizeof *shut);
    ready_list ready = {0};
    if (!shut || coordinator_collect(c, all, shut, &ready, err) != 0) {
        if (!shut) hvd_err_set(err, HVD_E_INTERNAL, "the coordinator (rank 0) ran out of memory");
        free(shut);
        free(ready.v);
        return -1;
    }
    int ret = add_joined_ready(c, &ready);
    /* Stall errors decided in earlier ticks go first. */
    for (size_t i = 0; i < c->backlog.n && ret == 0; i++)
        ret = rt_responses_push(out, c->backlog.v[i].name, NULL, c->backlog.v[i].error,
                                c->backlog.v[i].code);
    rt_responses_clear(&c->backlog);
    /* A completed join comes after everything its joined ranks stood in for. */
    for (size_t i = 0; i < ready.n && ret == 0; i++) {
        if (ready.v[i]->optype == RT_JOIN) continue;
        ret = decide_one(c, ready.v[i], out); /* frees it */
        ready.v[i] = NULL;
    }
    for (size_t i = 0; i < ready.n && ret == 0; i++)
        if (ready.v[i]) ret = decide_join(c, ready.v[i], out);
    bool any_shut = false;
    for (int r = 0; r < c->size; r++)
        any_shut |= shut[r] != 0;
    if (any_shut && ret == 0) {
        size_t pos = 0;
        void *v;
        while (rt_strmap_next(&c->table, &pos, NULL, &v) >= 0 && ret == 0) {
            rt_table_entry *e = v;
            msgbuf msg = {.len = 0};
            shutdown_message(c, e, shut, &msg);
            rt_timeline_negotiate_end(c->tl, e->name);
            ret = rt_responses_push(out, e->name, NULL, msg.s, HVD_E_SHUTDOWN);
        }
        /* Everything is failed on every rank after a shutdown, pushed or not. */
        pos = 0;
        while (rt_strmap_next(&c->table, &pos, NULL, &v) >= 0)
            table_entry_free(v);
        rt_strmap_free(&c->table);
        memset(c->joined, 0, (size_t)c->size);
        c->njoined = 0;
    }
    free(ready.v);
    free(shut);
    if (ret != 0)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "the coordinator (rank 0) ran out of memory listing the responses");
    return 0;
}

/* ---- one full negotiation ------------------------------------------------------------- */

/* This rank's request message: its length, or LEN_TOO_BIG / LEN_NOMEM. */
static int encode_mine(rt_controller *c, uint32_t my_flags, const rt_request *reqs, size_t n) {
    if (rt_encode_requests(&c->sendbuf, my_flags, reqs, n) != 0) return LEN_NOMEM;
    /* Keep the gathered total inside int. */
    if (c->sendbuf.len > (size_t)(INT32_MAX / c->size)) return LEN_TOO_BIG;
    return (int)c->sendbuf.len;
}

/* Rank 0, after the lengths are gathered: displacements, the first rank that could not send
 * its message (a sentence in why), and room for them all. Returns 0, or -1 when the room
 * cannot be had. */
static int coordinator_prepare(rt_controller *c, hvd_err *why) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        if (c->lens[r] < 0 && why->code == 0) {
            if (c->lens[r] == LEN_NOMEM)
                hvd_err_set(why, HVD_E_INTERNAL,
                            "rank %d ran out of memory building its negotiation message", r);
            else
                hvd_err_set(why, HVD_E_PROTOCOL,
                            "rank %d's negotiation message exceeds the 2 GiB that MPI can "
                            "gather; submit fewer tensors per step",
                            r);
        }
        if (c->lens[r] < 0) c->lens[r] = 0;
        c->displs[r] = (int)total;
        total += (size_t)c->lens[r];
    }
    if (total > c->recvcap || !c->recvbuf) {
        uint8_t *p = realloc(c->recvbuf, total ? total : 1);
        if (!p) return -1;
        c->recvbuf = p;
        c->recvcap = total;
    }
    return 0;
}

/* Every rank: gathers the request messages at rank 0. Returns an MPI error code, or -1 when
 * rank 0 could not make room for them (it alone leaves the negotiation). */
static int gather_requests(rt_controller *c, int mylen, hvd_err *why) {
    MPI_Request req;
    int rc = MPI_Igather(&mylen, 1, MPI_INT, c->lens, 1, MPI_INT, 0, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    if (rc != MPI_SUCCESS) return rc;
    if (c->rank == 0 && coordinator_prepare(c, why) != 0) return -1;
    rc = MPI_Igatherv(c->sendbuf.data, mylen < 0 ? 0 : mylen, MPI_BYTE, c->recvbuf, c->lens,
                      c->displs, MPI_BYTE, 0, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    return rc;
}

/* Every rank: broadcasts rank 0's encoded responses, or its failure. On rank 0, resp holds
 * them and why is the failure (code 0 if none). On the other ranks the responses are decoded
 * into out. Returns RT_NEG_*. */
static int broadcast_responses(rt_controller *c, hvd_buf *resp, const hvd_err *why,
                               rt_response_list *out, hvd_err *err) {
    /* A failure travels as -code, then its sentence, so every rank fails with the same one. */
    int64_t resp_len = why->code ? -(int64_t)why->code : (int64_t)resp->len;
    MPI_Request req;
    int rc = MPI_Ibcast(&resp_len, 1, MPI_INT64_T, 0, c->comm, &req);
    if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    if (rc == MPI_SUCCESS && resp_len < 0) {
        char msg[HVD_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", why->msg);
        rc = MPI_Ibcast(msg, (int)sizeof msg, MPI_CHAR, 0, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
        if (rc == MPI_SUCCESS) {
            msg[sizeof msg - 1] = '\0';
            hvd_err_set(err, (int)-resp_len, "negotiation failed: %s", msg);
            return RT_NEG_FAILED;
        }
    }
    if (rc != MPI_SUCCESS) {
        hvd_err_set(err, HVD_E_INTERNAL, "broadcasting negotiation responses failed (MPI error %d)",
                    rc);
        return RT_NEG_FAILED;
    }
    if (resp_len == 0) return RT_NEG_OK;
    uint8_t *data = c->rank == 0 ? resp->data : malloc((size_t)resp_len);
    if (!data) {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "out of memory receiving the coordinator's %lld-byte response list",
                    (long long)resp_len);
        return RT_NEG_ALONE;
    }
    for (int64_t off = 0; off < resp_len && rc == MPI_SUCCESS; off += INT32_MAX / 2) {
        int chunk = (int)(resp_len - off < INT32_MAX / 2 ? resp_len - off : INT32_MAX / 2);
        rc = MPI_Ibcast(data + off, chunk, MPI_BYTE, 0, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = mpi_wait(&req);
    }
    int ret = RT_NEG_OK;
    if (rc != MPI_SUCCESS) {
        hvd_err_set(err, HVD_E_INTERNAL, "broadcasting negotiation responses failed (MPI error %d)",
                    rc);
        ret = RT_NEG_FAILED;
    } else if (c->rank != 0 && rt_decode_responses(data, (size_t)resp_len, out, err) != 0) {
        ret = RT_NEG_ALONE; /* the others have the list this rank could not read */
    }
    if (c->rank != 0) free(data);
    return ret;
}

int rt_controller_negotiate(rt_controller *c, uint32_t my_flags, const rt_request *reqs, size_t n,
                            rt_response_list *out, hvd_err *err) {
    /* A rank that cannot send its message still takes part in every collective (sending
     * nothing, with a negative length saying why), so all ranks learn of the failure from the
     * coordinator instead of some of them waiting forever. */
    int mylen = encode_mine(c, my_flags, reqs, n);
    hvd_err why = {0};
    int rc = gather_requests(c, mylen, &why);
    if (rc == -1) {
        hvd_err_set(err, HVD_E_INTERNAL,
                    "the coordinator (rank 0) ran out of memory gathering the negotiation "
                    "requests");
        return RT_NEG_ALONE;
    }
    if (rc != MPI_SUCCESS) {
        hvd_err_set(err, HVD_E_INTERNAL, "gathering negotiation requests failed (MPI error %d)",
                    rc);
        return RT_NEG_FAILED;
    }
    /* The coordinator decides. If it cannot, it still broadcasts, so that every rank fails the
     * cycle together instead of waiting for a list that never comes. */
    hvd_buf resp = {0};
    if (c->rank == 0) {
        size_t first_new = out->n;
        if (why.code == 0) coordinator_decide(c, c->recvbuf, out, &why);
        /* out->v may still be NULL (nothing decided yet): no pointer arithmetic on it. */
        rt_response_list view = {out->v ? out->v + first_new : NULL, out->n - first_new, 0};
        if (why.code == 0 && rt_encode_responses(&resp, &view) != 0)
            hvd_err_set(&why, HVD_E_INTERNAL,
                        "the coordinator (rank 0) ran out of memory encoding the responses");
        if (why.code) rt_log("coordinator: %s", why.msg);
    }
    int ret = broadcast_responses(c, &resp, &why, out, err);
    hvd_buf_free(&resp);
    return ret;
}
