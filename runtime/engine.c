/* The engine: lifecycle, the submission queue, handles, and the background loop.
 *
 * User threads only touch the state guarded by `g.mu`: the submission queue, the handle
 * table, the set of names in flight and the counters. Everything else (MPI, the cache, the
 * pending entries, the fusion buffer, the timeline) belongs to the background thread, which
 * runs one cycle every HOROVOD_CYCLE_TIME:
 *
 *   1. drain the queue; classify each new entry against the response cache
 *   2. agree on the bit vector (one allreduce): flags, cache hits, invalidations
 *   3. if any rank has new requests (or shuts down): full negotiation at the coordinator
 *   4. fuse the agreed entries into groups and execute them in the agreed order
 *   5. update the response cache (same order on every rank) and complete the handles
 *
 * All MPI calls happen on the background thread (MPI_THREAD_FUNNELED is enough). */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small helpers -------------------------------------------------------------------- */

int rt_err(hvd_err *err, int code, const char *fmt, ...) {
    if (!err) return -1;
    int saved = errno;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    errno = saved; /* for %m */
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int64_t rt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static _Atomic int g_log_rank = -1;

void rt_log(const char *fmt, ...) {
    char line[2048];
    int n = snprintf(line, sizeof line, "[hvd rank %d] ", g_log_rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line, so ranks' lines do not interleave */
}

static void out_of_memory(size_t n) {
    rt_log("out of memory allocating %zu bytes; the collective runtime cannot continue", n);
    abort();
}

void *rt_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *rt_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *rt_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(n);
    return q;
}

char *rt_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = rt_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

/* ---- shared state ------------------------------------------------------------------- */

enum { ST_STOPPED = 0, ST_RUNNING, ST_ENDED /* loop ended, thread not joined yet */ };

/* A submission burst is over once nothing new arrived for this long ... */
#define RT_BURST_GAP_NS 50000
/* ... and a cycle never waits longer than this for one to end. */
#define RT_BURST_MAX_WAIT_NS 1000000

typedef struct hslot {
    uint32_t gen; /* bumped on every reuse, so stale handles are recognized */
    bool used;
    bool done;
    int status; /* 0 or hvd_status */
    char *msg;  /* error text */
} hslot;

/* Knobs, read from the environment by hvd_init; rank 0's values are broadcast. */
typedef struct rt_config {
    int64_t cycle_ns;
    int64_t fusion_threshold;
    int64_t cache_capacity;
    int64_t stall_warn_ns;
    int64_t stall_shutdown_ns;
    char timeline_path[1024];
} rt_config;

static struct {
    pthread_mutex_t life_mu; /* serializes hvd_init / hvd_shutdown */
    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t cv;       /* handle completions, init result */
    int state;
    bool thread_started;
    pthread_t thread;
    bool shutdown_requested;
    bool ever_started;
    /* identity (valid while state != ST_STOPPED, or after a successful init) */
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    bool ids_valid;
    /* init handshake */
    bool init_done;
    int init_status;
    hvd_err init_err;
    /* submissions */
    rt_entry *q_head, *q_tail;
    int64_t q_last_ns;  /* when the newest queued entry was submitted */
    rt_strmap inflight; /* names submitted and not completed on this rank */
    uint64_t noname[RT_NUM_OPTYPES];
    char stop_reason[HVD_ERR_MAX];
    /* handles */
    hslot *hs;
    size_t nh;
    uint32_t *hfree; /* free slot indices */
    size_t nfree;
    hvd_stats stats;
    rt_config cfg;
} g = {
    .life_mu = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
};

/* ---- handles (g.mu held) -------------------------------------------------------------- */

static int64_t handle_alloc(void) {
    uint32_t idx;
    if (g.nfree) {
        idx = g.hfree[--g.nfree];
    } else {
        size_t cap = g.nh ? g.nh * 2 : 64;
        g.hs = rt_xrealloc(g.hs, cap * sizeof *g.hs);
        g.hfree = rt_xrealloc(g.hfree, cap * sizeof *g.hfree);
        memset(g.hs + g.nh, 0, (cap - g.nh) * sizeof *g.hs);
        for (size_t i = cap; i > g.nh + 1; i--)
            g.hfree[g.nfree++] = (uint32_t)(i - 1);
        idx = (uint32_t)g.nh;
        g.nh = cap;
    }
    hslot *s = &g.hs[idx];
    s->gen = (s->gen + 1) & 0x7fffffffu;
    if (s->gen == 0) s->gen = 1;
    s->used = true;
    s->done = false;
    s->status = 0;
    s->msg = NULL;
    return ((int64_t)s->gen << 32) | (int64_t)(idx + 1);
}

static hslot *handle_get(int64_t h) {
    if (h <= 0) return NULL;
    uint64_t idx = (uint64_t)(h & 0xffffffff) - 1;
    uint32_t gen = (uint32_t)(h >> 32);
    if (idx >= g.nh || !g.hs[idx].used || g.hs[idx].gen != gen) return NULL;
    return &g.hs[idx];
}

static void handle_release(int64_t h) {
    hslot *s = handle_get(h);
    if (!s) return;
    free(s->msg);
    s->msg = NULL;
    s->used = false;
    g.hfree[g.nfree++] = (uint32_t)((h & 0xffffffff) - 1);
}

/* ---- submission (user threads) --------------------------------------------------------- */

void rt_entry_free(rt_entry *e) {
    if (!e) return;
    free(e->name);
    free(e->splits);
    free(e->error);
    free(e);
}

int rt_submit(rt_entry *e, const char *name, hvd_handle *handle, hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    if (g.state != ST_RUNNING) {
        int code = g.ever_started ? HVD_E_SHUTDOWN : HVD_E_STATE;
        if (g.state == ST_ENDED || (g.ever_started && g.stop_reason[0]))
            rt_err(err, code, "the collective runtime has stopped: %s", g.stop_reason);
        else
            rt_err(err, code, "the collective runtime is not running: call hvd_init() first");
        pthread_mutex_unlock(&g.mu);
        rt_entry_free(e);
        return -1;
    }
    if (name) {
        e->name = rt_xstrdup(name);
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "%s.noname.%llu", rt_optype_name(e->p.optype),
                 (unsigned long long)++g.noname[e->p.optype]);
        e->name = rt_xstrdup(buf);
    }
    if (rt_strmap_get(&g.inflight, e->name)) {
        rt_err(err, HVD_E_STATE,
               "a collective named '%s' is already pending on this rank; wait for its handle "
               "before submitting the name again",
               e->name);
        pthread_mutex_unlock(&g.mu);
        rt_entry_free(e);
        return -1;
    }
    rt_strmap_put(&g.inflight, e->name, (void *)1);
    e->handle = handle_alloc();
    e->next = NULL;
    if (g.q_tail)
        g.q_tail->next = e;
    else
        g.q_head = e;
    g.q_tail = e;
    g.q_last_ns = rt_now_ns();
    *handle = e->handle;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

int rt_current_size(void) {
    pthread_mutex_lock(&g.mu);
    int s = g.state == ST_RUNNING ? g.size : -1;
    pthread_mutex_unlock(&g.mu);
    return s;
}

int hvd_poll(hvd_handle handle) {
    pthread_mutex_lock(&g.mu);
    hslot *s = handle_get(handle);
    int r = s ? (s->done ? 1 : 0) : -1;
    pthread_mutex_unlock(&g.mu);
    return r;
}

int hvd_wait(hvd_handle handle, hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    hslot *s = handle_get(handle);
    if (!s) {
        pthread_mutex_unlock(&g.mu);
        return rt_err(err, HVD_E_NOT_FOUND,
                      "handle %lld is unknown: never returned by a submission, or already "
                      "released by hvd_wait",
                      (long long)handle);
    }
    /* The table may move while we sleep: look the slot up again after every wake-up. */
    while (!(s = handle_get(handle))->done)
        pthread_cond_wait(&g.cv, &g.mu);
    int ret = 0;
    if (s->status != 0) ret = rt_err(err, s->status, "%s", s->msg ? s->msg : "failed");
    handle_release(handle);
    pthread_mutex_unlock(&g.mu);
    return ret;
}

int hvd_get_stats(hvd_stats *out) {
    pthread_mutex_lock(&g.mu);
    bool ok = g.ever_started;
    if (ok) *out = g.stats;
    pthread_mutex_unlock(&g.mu);
    return ok ? 0 : -1;
}

#define ID_GETTER(fn, field)                                                                       \
    int fn(void) {                                                                                 \
        pthread_mutex_lock(&g.mu);                                                                 \
        int v = g.ids_valid ? g.field : -1;                                                        \
        pthread_mutex_unlock(&g.mu);                                                               \
        return v;                                                                                  \
    }
ID_GETTER(hvd_rank, rank)
ID_GETTER(hvd_size, size)
ID_GETTER(hvd_local_rank, local_rank)
ID_GETTER(hvd_local_size, local_size)
ID_GETTER(hvd_cross_rank, cross_rank)
ID_GETTER(hvd_cross_size, cross_size)

int hvd_is_running(void) {
    pthread_mutex_lock(&g.mu);
    int r = g.state == ST_RUNNING;
    pthread_mutex_unlock(&g.mu);
    return r;
}

int hvd_nccl_built(void) {
#ifdef HVD_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

/* ---- the background thread's state ----------------------------------------------------- */

typedef struct entry_vec {
    rt_entry **v;
    size_t n, cap;
} entry_vec;

static void ev_push(entry_vec *v, rt_entry *e) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = rt_xrealloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = e;
}

typedef struct bg_state {
    rt_config cfg;
    hvd_err cfg_err; /* a malformed knob on this rank (code 0 if none) */
    MPI_Comm comm, local_comm, cross_comm;
    bool own_mpi;
    int rank, size;
    rt_controller ctl;
    bool ctl_ready;
    rt_cache cache;
    rt_timeline *tl;
    rt_mpi_types *types;
    rt_fusion_buffer fusion;
    struct rt_nccl *nccl;
    rt_strmap pending;   /* name -> rt_entry*: everything this rank has not completed */
    entry_vec unsent;    /* entries to send in the next full negotiation, in order */
    uint64_t *hit, *bad; /* bit vector scratch, `words` words each */
    size_t words;
    int64_t evict_ns; /* partial cache hits older than this go to the coordinator */
    hvd_stats stats;
} bg_state;

static void set_bit(uint64_t *v, int i) {
    v[i / 64] |= 1ull << (i % 64);
}

static bool get_bit(const uint64_t *v, int i) {
    return (v[i / 64] >> (i % 64)) & 1u;
}

/* ---- environment ----------------------------------------------------------------------- */

/* Parses a non-negative number in [0, max] from the environment; *out = def if unset. On a
 * malformed value, keeps def, sets err (unless already set) and returns -1. */
static int env_double(const char *name, double def, double max, double *out, hvd_err *err) {
    const char *s = getenv(name);
    *out = def;
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0 || v > max) {
        if (err && err->code == 0)
            rt_err(err, HVD_E_INVALID, "%s=%s is not a number between 0 and %g", name, s, max);
        return -1;
    }
    *out = v;
    return 0;
}

/* Fills c from the environment, with defaults for what is unset or malformed. Returns 0, or
 * -1 with the first malformed variable in err (hvd_init still takes part in the start-up
 * collectives then, and fails on every rank together instead of leaving the others waiting). */
static int read_config(rt_config *c, hvd_err *err) {
    double cycle_ms, fusion, cache, stall, stall_shutdown;
    int rc = 0;
    rc |= env_double("HOROVOD_CYCLE_TIME", 1.0, 1e4, &cycle_ms, err);
    rc |= env_double("HOROVOD_FUSION_THRESHOLD", 128.0 * 1024 * 1024, 1ull << 40, &fusion, err);
    rc |= env_double("HOROVOD_CACHE_CAPACITY", 1024, 1 << 20, &cache, err);
    rc |= env_double("HOROVOD_STALL_CHECK_TIME_SECONDS", 60, 1e6, &stall, err);
    rc |= env_double("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0, 1e6, &stall_shutdown, err);
    const char *disable = getenv("HOROVOD_STALL_CHECK_DISABLE");
    if (disable && *disable && strcmp(disable, "0") != 0) stall = 0;
    c->cycle_ns = (int64_t)(cycle_ms * 1e6);
    c->fusion_threshold = (int64_t)fusion;
    c->cache_capacity = (int64_t)cache;
    c->stall_warn_ns = (int64_t)(stall * 1e9);
    c->stall_shutdown_ns = (int64_t)(stall_shutdown * 1e9);
    const char *tl = getenv("HOROVOD_TIMELINE");
    if (tl && strlen(tl) >= sizeof c->timeline_path) {
        if (err && err->code == 0)
            rt_err(err, HVD_E_INVALID, "HOROVOD_TIMELINE is longer than %zu bytes",
                   sizeof c->timeline_path - 1);
        rc = -1;
        tl = NULL;
    }
    snprintf(c->timeline_path, sizeof c->timeline_path, "%s", tl ? tl : "");
    return rc ? -1 : 0;
}

/* ---- setup and teardown (background thread) -------------------------------------------- */

static int mpi_setup(bg_state *b, hvd_err *err) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
        return rt_err(err, HVD_E_STATE,
                      "MPI was already finalized (by an earlier hvd_shutdown or by the "
                      "application); MPI cannot start twice in one process");
    if (!initialized) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return rt_err(err, HVD_E_INTERNAL, "MPI_Init_thread failed");
        b->own_mpi = true;
    } else {
        int provided = 0;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE)
            return rt_err(err, HVD_E_STATE,
                          "the application initialized MPI without MPI_THREAD_MULTIPLE; the "
                          "runtime calls MPI from its own thread, so initialize MPI with "
                          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let hvd_init do it");
    }
    /* A private communicator keeps our traffic apart from the application's. */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &b->comm) != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &b->rank);
    MPI_Comm_size(b->comm, &b->size);
    g_log_rank = b->rank;
    int lr, ls, cr, cs;
    if (MPI_Comm_split_type(b->comm, MPI_COMM_TYPE_SHARED, b->rank, MPI_INFO_NULL,
                            &b->local_comm) != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "MPI_Comm_split_type failed");
    MPI_Comm_rank(b->local_comm, &lr);
    MPI_Comm_size(b->local_comm, &ls);
    if (MPI_Comm_split(b->comm, lr, b->rank, &b->cross_comm) != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "MPI_Comm_split failed");
    MPI_Comm_rank(b->cross_comm, &cr);
    MPI_Comm_size(b->cross_comm, &cs);
    pthread_mutex_lock(&g.mu);
    g.rank = b->rank;
    g.size = b->size;
    g.local_rank = lr;
    g.local_size = ls;
    g.cross_rank = cr;
    g.cross_size = cs;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

static int bg_setup(bg_state *b, hvd_err *err) {
    if (mpi_setup(b, err) != 0) return -1;
    /* Fusion groups, cache slots and the bit vector must be identical on every rank, so
     * every rank uses rank 0's knobs. */
    int64_t knobs[5] = {b->cfg.cycle_ns, b->cfg.fusion_threshold, b->cfg.cache_capacity,
                        b->cfg.stall_warn_ns, b->cfg.stall_shutdown_ns};
    if (MPI_Bcast(knobs, 5, MPI_INT64_T, 0, b->comm) != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "broadcasting the runtime settings failed");
    b->cfg.cycle_ns = knobs[0];
    b->cfg.fusion_threshold = knobs[1];
    b->cfg.cache_capacity = knobs[2];
    b->cfg.stall_warn_ns = knobs[3];
    b->cfg.stall_shutdown_ns = knobs[4];

    /* Local steps that can fail on one rank only; agree on the outcome below so that no
     * rank starts cycling while another gives up. */
    hvd_err local = b->cfg_err;
    int ok = local.code == 0;
    if (ok && b->rank == 0 && b->cfg.timeline_path[0]) {
        b->tl = rt_timeline_open(b->cfg.timeline_path, &local);
        if (!b->tl) ok = 0;
    }
    if (ok) {
        b->types = rt_mpi_types_create(&local);
        if (!b->types) ok = 0;
    }
    int all_ok = 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, b->comm) != MPI_SUCCESS)
        return rt_err(err, HVD_E_INTERNAL, "agreeing on the start-up result failed");
    if (!ok) {
        rt_log("hvd_init failed: %s", local.msg); /* the other ranks point here */
        *err = local;
        return -1;
    }
    if (!all_ok)
        return rt_err(err, HVD_E_INTERNAL,
                      "hvd_init failed on another rank (its log says why), so it fails here too");

    rt_controller_init(&b->ctl, b->comm, b->rank, b->size, b->tl);
    b->ctl.stall.warn_ns = b->cfg.stall_warn_ns;
    b->ctl.stall.shutdown_ns = b->cfg.stall_shutdown_ns;
    b->ctl.stall.last_check_ns = rt_now_ns();
    b->ctl_ready = true;
    rt_cache_init(&b->cache, (int)b->cfg.cache_capacity);
    b->words = ((size_t)b->cfg.cache_capacity + 63) / 64;
    b->hit = rt_xcalloc(b->words ? b->words : 1, sizeof *b->hit);
    b->bad = rt_xcalloc(b->words ? b->words : 1, sizeof *b->bad);
    rt_strmap_init(&b->pending);
    /* A cached name pending on only some ranks is invisible to the stall inspector (it
     * only sees the coordinator's table): after half the stall time, move it there. Not
     * sooner: a slow rank would otherwise keep knocking names out of the cache. */
    int64_t limit = b->cfg.stall_warn_ns > 0 ? b->cfg.stall_warn_ns : b->cfg.stall_shutdown_ns;
    if (b->cfg.stall_shutdown_ns > 0 && b->cfg.stall_shutdown_ns < limit)
        limit = b->cfg.stall_shutdown_ns;
    b->evict_ns = limit / 2;
#ifdef HVD_HAVE_NCCL
    b->nccl = rt_nccl_create();
#endif
    return 0;
}

static void bg_teardown(bg_state *b) {
#ifdef HVD_HAVE_NCCL
    if (b->nccl) rt_nccl_free(b->nccl);
#endif
    rt_timeline_close(b->tl);
    if (b->ctl_ready) rt_controller_free(&b->ctl);
    rt_cache_free(&b->cache);
    rt_strmap_free(&b->pending);
    free(b->unsent.v);
    free(b->hit);
    free(b->bad);
    rt_fusion_buffer_free(&b->fusion);
    if (b->types) rt_mpi_types_free(b->types);
    if (b->cross_comm != MPI_COMM_NULL) MPI_Comm_free(&b->cross_comm);
    if (b->local_comm != MPI_COMM_NULL) MPI_Comm_free(&b->local_comm);
    if (b->comm != MPI_COMM_NULL) MPI_Comm_free(&b->comm);
    if (b->own_mpi) MPI_Finalize();
}

/* ---- completion ------------------------------------------------------------------------ */

static void entry_fail(rt_entry *e, int code, const char *msg) {
    if (e->status) return; /* keep the first reason */
    e->status = code ? code : HVD_E_INTERNAL;
    e->error = rt_xstrdup(msg);
}

/* Completes entries: publishes their outcome to their handles and frees them. */
static void complete(bg_state *b, rt_entry **v, size_t n) {
    if (n == 0) return;
    for (size_t i = 0; i < n; i++)
        rt_strmap_del(&b->pending, v[i]->name);
    pthread_mutex_lock(&g.mu);
    for (size_t i = 0; i < n; i++) {
        rt_entry *e = v[i];
        hslot *s = handle_get(e->handle);
        if (s) {
            s->done = true;
            s->status = e->status;
            s->msg = e->error;
            e->error = NULL;
        }
        rt_strmap_del(&g.inflight, e->name);
        rt_entry_free(e);
    }
    /* Publish the counters with the completions, so that a waiter sees counts that include
     * its own tensors. */
    b->stats.tensors_done += n;
    b->stats.stall_warnings = b->ctl.stall.warnings;
    g.stats = b->stats;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

/* Fails everything this rank still holds (queue and pending) and marks the engine ended.
 * Called once, when the loop stops. */
static void fail_all_and_end(bg_state *b, int code, const char *reason) {
    pthread_mutex_lock(&g.mu);
    g.state = ST_ENDED;
    snprintf(g.stop_reason, sizeof g.stop_reason, "%s", reason);
    rt_entry *q = g.q_head;
    g.q_head = g.q_tail = NULL;
    pthread_mutex_unlock(&g.mu);
    entry_vec all = {0};
    for (rt_entry *e = q, *next; e; e = next) {
        next = e->next;
        rt_strmap_put(&b->pending, e->name, e);
    }
    size_t pos = 0;
    void *v;
    while (rt_strmap_next(&b->pending, &pos, NULL, &v) >= 0) {
        rt_entry *e = v;
        char msg[HVD_ERR_MAX];
        snprintf(msg, sizeof msg, "tensor '%s' did not complete: %s", e->name, reason);
        entry_fail(e, code, msg);
        ev_push(&all, e);
    }
    complete(b, all.v, all.n);
    free(all.v);
}

/* ---- one cycle ----------------------------------------------------------------------------- */

static void classify(bg_state *b, rt_entry *e) {
    rt_strmap_put(&b->pending, e->name, e);
    if (b->rank == 0) rt_timeline_negotiate_start(b->tl, e->name, e->p.optype);
    int slot = rt_cache_lookup(&b->cache, e->name);
    if (slot >= 0 && rt_params_equal(rt_cache_params(&b->cache, slot), &e->p)) {
        e->state = RT_E_CACHED;
        e->cache_slot = slot;
        e->partial_since_ns = 0;
        rt_cache_set_user(&b->cache, slot, e);
        return;
    }
    /* Same name, different parameters: every rank must drop the slot, so that everyone
     * negotiates this name in full and the coordinator can report the mismatch. */
    if (slot >= 0) set_bit(b->bad, slot);
    e->state = RT_E_UNSENT;
    e->cache_slot = -1;
    ev_push(&b->unsent, e);
}

static void to_unsent(bg_state *b, rt_entry *e) {
    e->state = RT_E_UNSENT;
    e->cache_slot = -1;
    ev_push(&b->unsent, e);
}

/* Runs the agreed entries: fuse, execute, and update the cache from the negotiated ones. */
static void execute(bg_state *b, entry_vec *run) {
    if (run->n == 0) return;
    if (b->tl) {
        for (size_t i = 0; i < run->n; i++) {
            rt_timeline_negotiate_end(b->tl, run->v[i]->name);
            rt_timeline_start(b->tl, run->v[i]->name, rt_optype_upper_name(run->v[i]->p.optype));
            rt_timeline_start(b->tl, run->v[i]->name, "QUEUE");
        }
    }
    rt_group_list groups = {0};
    rt_fusion_plan(run->v, run->n, b->cfg.fusion_threshold, &groups);
    rt_exec x = {b->comm, b->rank, b->size, b->tl, &b->fusion, b->types, b->nccl};
    for (size_t i = 0; i < groups.n; i++) {
        rt_group *grp = &groups.v[i];
        for (size_t k = 0; k < grp->n; k++)
            rt_timeline_end(b->tl, grp->entries[k]->name);
        hvd_err err = {0};
        int rc;
        if (grp->p.on_device) {
#ifdef HVD_HAVE_NCCL
            rc = rt_nccl_execute(&x, grp, &err);
#else
            rc = rt_err(&err, HVD_E_STATE, "built without NCCL: device buffers are unsupported");
#endif
        } else {
            rc = rt_mpi_execute(&x, grp, &err);
        }
        if (rc != 0)
            for (size_t k = 0; k < grp->n; k++)
                entry_fail(grp->entries[k], err.code, err.msg);
        for (size_t k = 0; k < grp->n; k++)
            rt_timeline_end(b->tl, grp->entries[k]->name);
        b->stats.collective_calls++;
        if (grp->n > 1) b->stats.fused_calls++;
    }
    rt_group_list_free(&groups);
}

/* One cycle. Returns true when the loop must stop. */
static bool run_cycle(bg_state *b) {
    /* 1. Drain the queue. If the application is in the middle of a burst of submissions (a
     * training step handing over its gradients), wait for the burst to end, briefly: taking
     * half a burst would split the step over two cycles and two fused calls. */
    pthread_mutex_lock(&g.mu);
    for (int64_t t0 = rt_now_ns(), t = t0;
         g.q_head && t - g.q_last_ns < RT_BURST_GAP_NS && t - t0 < RT_BURST_MAX_WAIT_NS;
         t = rt_now_ns()) {
        pthread_mutex_unlock(&g.mu);
        struct timespec ts = {0, RT_BURST_GAP_NS / 2};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g.mu);
    }
    rt_entry *q = g.q_head;
    g.q_head = g.q_tail = NULL;
    bool shut = g.shutdown_requested;
    pthread_mutex_unlock(&g.mu);
    memset(b->hit, 0, b->words * sizeof *b->hit);
    memset(b->bad, 0, b->words * sizeof *b->bad);
    for (rt_entry *e = q, *next; e; e = next) {
        next = e->next;
        classify(b, e);
    }

    /* 2. Bit vector: cache hits pending here, invalidations, flags. */
    int64_t now = rt_now_ns();
    for (int s = 0; s < b->cache.capacity; s++) {
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (!e) continue;
        set_bit(b->hit, s);
        if (b->evict_ns > 0 && e->partial_since_ns && now - e->partial_since_ns > b->evict_ns)
            set_bit(b->bad, s);
    }
    uint32_t flags = 0;
    if (shut) flags |= RT_FLAG_SHUTDOWN;
    if (b->unsent.n) flags |= RT_FLAG_UNCACHED;
    rt_controller_tick(&b->ctl, now);
    if (rt_controller_has_backlog(&b->ctl)) flags |= RT_FLAG_COORD_WORK;

    int64_t t_neg = rt_now_ns();
    rt_bits_result bits;
    hvd_err err = {0};
    if (rt_controller_sync_bits(&b->ctl, flags, b->hit, b->bad, b->words, &bits, &err) != 0) {
        fail_all_and_end(b, err.code, err.msg);
        return true;
    }

    /* 3. Slots some rank invalidated: drop them everywhere; entries waiting on them go to
     * the coordinator. */
    bool any_bad = false;
    for (int s = 0; s < b->cache.capacity; s++) {
        if (!get_bit(bits.or_bad, s)) continue;
        any_bad = true;
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (e) to_unsent(b, e);
        rt_cache_erase(&b->cache, s);
    }

    /* 4. Slots pending on every rank are ready, in slot order (the same everywhere). */
    entry_vec run = {0};
    for (int s = 0; s < b->cache.capacity; s++) {
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (!e) continue;
        if (get_bit(bits.and_hit, s)) {
            rt_cache_set_user(&b->cache, s, NULL);
            rt_cache_touch(&b->cache, s);
            ev_push(&run, e);
        } else if (!e->partial_since_ns) {
            e->partial_since_ns = now;
        }
    }
    b->stats.cached_responses += run.n;
    size_t ncached = run.n;

    /* 5. Full negotiation when anyone has something the coordinator must see. */
    bool any_shut = bits.flags_or & RT_FLAG_SHUTDOWN;
    rt_response_list resp = {0};
    if (any_bad || (bits.flags_or & (RT_FLAG_UNCACHED | RT_FLAG_SHUTDOWN | RT_FLAG_COORD_WORK))) {
        size_t nreq = b->unsent.n;
        rt_request *reqs = rt_xmalloc((nreq + 1) * sizeof *reqs);
        for (size_t i = 0; i < b->unsent.n; i++) {
            reqs[i].name = b->unsent.v[i]->name;
            reqs[i].p = b->unsent.v[i]->p;
            b->unsent.v[i]->state = RT_E_SENT;
        }
        b->unsent.n = 0;
        if (any_shut) {
            /* Also name what waits on the cache, so the coordinator can report it. */
            for (int s = 0; s < b->cache.capacity; s++) {
                rt_entry *e = rt_cache_user(&b->cache, s);
                if (!e) continue;
                reqs = rt_xrealloc(reqs, (nreq + 1) * sizeof *reqs);
                reqs[nreq].name = e->name;
                reqs[nreq++].p = e->p;
            }
        }
        int rc =
            rt_controller_negotiate(&b->ctl, shut ? RT_FLAG_SHUTDOWN : 0, reqs, nreq, &resp, &err);
        free(reqs);
        b->stats.full_negotiations++;
        if (rc != 0) {
            free(run.v);
            rt_responses_free(&resp);
            fail_all_and_end(b, err.code, err.msg);
            return true;
        }
    }
    uint64_t neg_ns = (uint64_t)(rt_now_ns() - t_neg);
    b->stats.negotiation_ns += neg_ns;
    if (run.n > 0 || resp.n > 0) {
        b->stats.busy_cycles++;
        b->stats.busy_negotiation_ns += neg_ns;
    }

    /* 6. Responses name entries of ours: errors complete at once, the rest run. */
    entry_vec failed = {0};
    for (size_t i = 0; i < resp.n; i++) {
        rt_entry *e = rt_strmap_get(&b->pending, resp.v[i].name);
        if (!e) {
            /* A stall error for a name this rank never submitted: nothing to fail here. */
            if (!resp.v[i].error)
                rt_log("internal error: the coordinator scheduled '%s', which this rank does "
                       "not have pending",
                       resp.v[i].name);
            continue;
        }
        /* An entry not yet sent cannot be what the coordinator decided about (it can only be
         * a stall error for earlier submissions of the name on other ranks). */
        if (e->state == RT_E_UNSENT) continue;
        if (e->state == RT_E_CACHED) {
            rt_cache_set_user(&b->cache, e->cache_slot, NULL);
            e->cache_slot = -1;
        }
        if (resp.v[i].error) {
            if (b->rank == 0) rt_timeline_negotiate_end(b->tl, e->name);
            entry_fail(e, resp.v[i].code, resp.v[i].error);
            ev_push(&failed, e);
        } else {
            ev_push(&run, e);
            b->stats.negotiated_responses++;
        }
    }
    complete(b, failed.v, failed.n);
    free(failed.v);

    /* 7. Execute, in the agreed order. */
    execute(b, &run);

    /* 8. Remember negotiated names (in the agreed order, so slots match on all ranks). */
    for (size_t i = ncached; i < run.n; i++) {
        if (run.v[i]->status != 0) continue;
        void *evicted = NULL;
        rt_cache_put(&b->cache, run.v[i]->name, &run.v[i]->p, &evicted);
        if (evicted) to_unsent(b, evicted);
    }
    complete(b, run.v, run.n);
    free(run.v);
    rt_responses_free(&resp);
    if (b->tl) rt_timeline_flush(b->tl);

    b->stats.cycles++;
    b->stats.stall_warnings = b->ctl.stall.warnings;
    pthread_mutex_lock(&g.mu);
    g.stats = b->stats;
    pthread_mutex_unlock(&g.mu);

    if (any_shut) {
        /* Everything the coordinator knew has been failed with a precise message; entries
         * that arrived after this cycle's drain get the general one. */
        fail_all_and_end(b, HVD_E_SHUTDOWN,
                         shut ? "hvd_shutdown was called on this rank"
                              : "another rank called hvd_shutdown");
        return true;
    }
    return false;
}

static void *bg_main(void *arg) {
    bg_state *b = arg;
    hvd_err err = {0};
    int rc = bg_setup(b, &err);
    pthread_mutex_lock(&g.mu);
    g.init_done = true;
    g.init_status = rc;
    g.init_err = err;
    if (rc == 0) {
        g.state = ST_RUNNING;
        g.ids_valid = true;
        g.ever_started = true;
        g.stop_reason[0] = 0;
    }
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    if (rc == 0) {
        int64_t next = rt_now_ns();
        for (;;) {
            if (run_cycle(b)) break;
            /* Sleep until the next cycle boundary (absolute, so work does not add drift). */
            next += b->cfg.cycle_ns;
            int64_t now = rt_now_ns();
            if (next < now) next = now;
            struct timespec ts = {next / 1000000000, next % 1000000000};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
            }
        }
    }
    bg_teardown(b);
    free(b);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

int hvd_init(hvd_err *err) {
    pthread_mutex_lock(&g.life_mu);
    pthread_mutex_lock(&g.mu);
    int state = g.state;
    bool started = g.thread_started;
    char reason[HVD_ERR_MAX];
    snprintf(reason, sizeof reason, "%s", g.stop_reason);
    pthread_mutex_unlock(&g.mu);
    if (state == ST_RUNNING) {
        pthread_mutex_unlock(&g.life_mu);
        return 0;
    }
    if (started) {
        pthread_mutex_unlock(&g.life_mu);
        return rt_err(err, HVD_E_STATE,
                      "the collective runtime has stopped (%s); call hvd_shutdown() before "
                      "hvd_init()",
                      reason);
    }
    bg_state *b = rt_xcalloc(1, sizeof *b);
    b->comm = b->local_comm = b->cross_comm = MPI_COMM_NULL;
    read_config(&b->cfg, &b->cfg_err); /* an error fails in bg_setup, on every rank */
    pthread_mutex_lock(&g.mu);
    g.init_done = false;
    g.shutdown_requested = false;
    g.ids_valid = false;
    g.stop_reason[0] = 0;
    memset(g.noname, 0, sizeof g.noname);
    memset(&g.stats, 0, sizeof g.stats);
    g.cfg = b->cfg;
    pthread_mutex_unlock(&g.mu);
    int prc = pthread_create(&g.thread, NULL, bg_main, b);
    if (prc != 0) {
        free(b);
        pthread_mutex_unlock(&g.life_mu);
        return rt_err(err, HVD_E_INTERNAL, "cannot start the background thread: %s", strerror(prc));
    }
    pthread_mutex_lock(&g.mu);
    while (!g.init_done)
        pthread_cond_wait(&g.cv, &g.mu);
    int rc = g.init_status;
    hvd_err ierr = g.init_err;
    pthread_mutex_unlock(&g.mu);
    if (rc != 0) {
        pthread_join(g.thread, NULL);
        pthread_mutex_unlock(&g.life_mu);
        if (err) *err = ierr;
        return -1;
    }
    g.thread_started = true;
    pthread_mutex_unlock(&g.life_mu);
    return 0;
}

int hvd_shutdown(void) {
    pthread_mutex_lock(&g.life_mu);
    if (!g.thread_started) {
        pthread_mutex_unlock(&g.life_mu);
        return 0;
    }
    pthread_mutex_lock(&g.mu);
    g.shutdown_requested = true;
    pthread_mutex_unlock(&g.mu);
    pthread_join(g.thread, NULL);
    g.thread_started = false;
    pthread_mutex_lock(&g.mu);
    g.state = ST_STOPPED;
    g.ids_valid = false;
    if (!g.stop_reason[0]) snprintf(g.stop_reason, sizeof g.stop_reason, "hvd_shutdown was called");
    rt_strmap_free(&g.inflight);
    pthread_mutex_unlock(&g.mu);
    pthread_mutex_unlock(&g.life_mu);
    return 0;
}
