/* State shared by user threads and the background thread (state.h). */
#include "state.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "strmap.h"

/* A submission burst is over once nothing new arrived for this long ... */
#define RT_BURST_GAP_NS 50000
/* ... and a cycle never waits longer than this for one to end. */
#define RT_BURST_MAX_WAIT_NS 1000000

typedef struct hslot {
    uint32_t gen; /* bumped on every reuse, so stale handles are recognized */
    bool used;
    bool done;
    int status;   /* 0 or hvd_status */
    char *msg;    /* error text (NULL if it could not be copied) */
    uint64_t seq; /* the submission's number (g.q_seq) */
} hslot;

/* The number of the calling thread's newest submission (g.q_seq). */
static _Thread_local uint64_t t_last_seq;

static struct {
    pthread_mutex_t mu;   /* guards everything below */
    pthread_cond_t cv;    /* handle completions, init result */
    pthread_cond_t bg_cv; /* wakes the background thread between cycles (CLOCK_MONOTONIC) */
    bool bg_sleeping;     /* it waits in rt_state_sleep_until */
    bool bg_in_burst;     /* it waits for a submission burst to end (rt_state_drain) */
    int state;
    bool shutdown_requested;
    bool ever_started;
    /* identity (valid while ids_valid) */
    rt_ids ids;
    bool ids_valid;
    /* start-up handshake */
    bool init_done;
    int init_status;
    hvd_err init_err;
    /* submissions */
    rt_entry *q_head, *q_tail;
    int64_t q_last_ns;    /* when the newest queued entry was submitted */
    uint64_t q_seq;       /* submissions so far (each entry's number is its count) */
    uint64_t drained_seq; /* the newest submission the background thread has taken */
    uint64_t wait_seq;    /* the newest submission an application thread waits for */
    rt_strmap inflight;   /* names submitted and not completed on this rank */
    uint64_t noname[RT_NUM_OPTYPES];
    char stop_reason[HVD_ERR_MAX];
    /* handles */
    hslot *hs;
    size_t nh;
    uint32_t *hfree; /* free slot indices */
    size_t nfree;
    hvd_stats stats;
} g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
};

static pthread_once_t bg_cv_once = PTHREAD_ONCE_INIT;

static void bg_cv_init(void) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* rt_state_sleep_until's instants */
    pthread_cond_init(&g.bg_cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* ---- handles (g.mu held) -------------------------------------------------------------- */

/* Doubles the handle table. Returns 0, or -1 on out of memory (the table is unchanged). */
static int handles_grow(void) {
    size_t cap = g.nh ? g.nh * 2 : 64;
    hslot *hs = realloc(g.hs, cap * sizeof *hs);
    if (!hs) return -1;
    g.hs = hs;
    uint32_t *hfree = realloc(g.hfree, cap * sizeof *hfree);
    if (!hfree) return -1;
    g.hfree = hfree;
    memset(g.hs + g.nh, 0, (cap - g.nh) * sizeof *g.hs);
    for (size_t i = cap; i > g.nh; i--)
        g.hfree[g.nfree++] = (uint32_t)(i - 1);
    g.nh = cap;
    return 0;
}

/* A new handle, or 0 on out of memory. */
static int64_t handle_alloc(void) {
    if (!g.nfree && handles_grow() != 0) return 0;
    uint32_t idx = g.hfree[--g.nfree];
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

/* ---- lifecycle ------------------------------------------------------------------------- */

int rt_state_run_state(char reason[HVD_ERR_MAX]) {
    pthread_mutex_lock(&g.mu);
    int state = g.state;
    snprintf(reason, HVD_ERR_MAX, "%s", g.stop_reason);
    pthread_mutex_unlock(&g.mu);
    return state;
}

void rt_state_prepare_start(void) {
    pthread_mutex_lock(&g.mu);
    g.init_done = false;
    g.shutdown_requested = false;
    g.ids_valid = false;
    g.stop_reason[0] = 0;
    memset(g.noname, 0, sizeof g.noname);
    memset(&g.stats, 0, sizeof g.stats);
    pthread_mutex_unlock(&g.mu);
}

void rt_state_set_ids(const rt_ids *ids) {
    pthread_mutex_lock(&g.mu);
    g.ids = *ids;
    pthread_mutex_unlock(&g.mu);
}

void rt_state_init_done(int rc, const hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    g.init_done = true;
    g.init_status = rc;
    g.init_err = *err;
    if (rc == 0) {
        g.state = RT_RUNNING;
        g.ids_valid = true;
        g.ever_started = true;
        g.stop_reason[0] = 0;
    }
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

int rt_state_wait_init(hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    while (!g.init_done)
        pthread_cond_wait(&g.cv, &g.mu);
    int rc = g.init_status;
    if (rc != 0 && err) *err = g.init_err;
    pthread_mutex_unlock(&g.mu);
    return rc;
}

void rt_state_request_shutdown(void) {
    pthread_mutex_lock(&g.mu);
    g.shutdown_requested = true;
    if (g.bg_sleeping || g.bg_in_burst) pthread_cond_signal(&g.bg_cv);
    pthread_mutex_unlock(&g.mu);
}

void rt_state_stopped(void) {
    pthread_mutex_lock(&g.mu);
    g.state = RT_STOPPED;
    g.ids_valid = false;
    if (!g.stop_reason[0]) snprintf(g.stop_reason, sizeof g.stop_reason, "hvd_shutdown was called");
    rt_strmap_free(&g.inflight);
    pthread_mutex_unlock(&g.mu);
}

/* ---- the background thread ----------------------------------------------------------- */

void rt_state_sleep_until(int64_t t_ns) {
    pthread_once(&bg_cv_once, bg_cv_init);
    struct timespec ts = {t_ns / 1000000000, t_ns % 1000000000};
    pthread_mutex_lock(&g.mu);
    g.bg_sleeping = true;
    while (!g.q_head && !g.shutdown_requested && hvd_now_ns() < t_ns)
        pthread_cond_timedwait(&g.bg_cv, &g.mu, &ts);
    g.bg_sleeping = false;
    pthread_mutex_unlock(&g.mu);
}

rt_entry *rt_state_drain(bool *shutdown_requested) {
    /* If the application is in the middle of a burst of submissions (a training step handing
     * over its gradients), wait for the burst to end, briefly: taking half a burst would split
     * the step over two cycles and two fused calls. A burst is over once nothing new arrived
     * for RT_BURST_GAP_NS, or as soon as an application thread waits for an entry still in
     * the queue (hvd_wait wakes this wait): that thread submits nothing more, and a blocking
     * collective (hvd_allreduce) would otherwise pay the whole gap. A thread waiting for an
     * entry taken earlier (one its peers have not submitted yet) ends no one's burst. */
    pthread_once(&bg_cv_once, bg_cv_init);
    pthread_mutex_lock(&g.mu);
    g.bg_in_burst = true;
    for (int64_t t0 = hvd_now_ns(), t = t0;
         g.q_head && !g.shutdown_requested && g.wait_seq <= g.drained_seq &&
         t - g.q_last_ns < RT_BURST_GAP_NS && t - t0 < RT_BURST_MAX_WAIT_NS;
         t = hvd_now_ns()) {
        int64_t until = g.q_last_ns + RT_BURST_GAP_NS;
        if (until > t0 + RT_BURST_MAX_WAIT_NS) until = t0 + RT_BURST_MAX_WAIT_NS;
        struct timespec ts = {until / 1000000000, until % 1000000000};
        pthread_cond_timedwait(&g.bg_cv, &g.mu, &ts);
    }
    g.bg_in_burst = false;
    g.drained_seq = g.q_seq;
    rt_entry *q = g.q_head;
    g.q_head = g.q_tail = NULL;
    *shutdown_requested = g.shutdown_requested;
    pthread_mutex_unlock(&g.mu);
    return q;
}

void rt_state_complete(rt_entry **v, size_t n, const hvd_stats *stats) {
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
    if (stats) g.stats = *stats;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

void rt_state_publish(const hvd_stats *stats) {
    pthread_mutex_lock(&g.mu);
    g.stats = *stats;
    pthread_mutex_unlock(&g.mu);
}

rt_entry *rt_state_end(const char *reason) {
    pthread_mutex_lock(&g.mu);
    g.state = RT_ENDED;
    snprintf(g.stop_reason, sizeof g.stop_reason, "%s", reason);
    rt_entry *q = g.q_head;
    g.q_head = g.q_tail = NULL;
    g.drained_seq = g.q_seq;
    pthread_mutex_unlock(&g.mu);
    return q;
}

/* ---- submissions (user threads) -------------------------------------------------------- */

/* Ends a refused submission: unlocks, frees e, returns -1 (err is already set). */
static int refuse(rt_entry *e) {
    pthread_mutex_unlock(&g.mu);
    rt_entry_free(e);
    return -1;
}

/* Why a submission is refused while the runtime does not run. g.mu held. Returns -1. */
static int not_running(hvd_err *err) {
    int code = g.ever_started ? HVD_E_SHUTDOWN : HVD_E_STATE;
    if (g.state == RT_ENDED || (g.ever_started && g.stop_reason[0]))
        return hvd_err_set(err, code, "the collective runtime has stopped: %s", g.stop_reason);
    return hvd_err_set(err, code,
                       "the collective runtime is not running: initialize it first (hvd.init() "
                       "in Python, hvd_init() in C)");
}

int rt_submit(rt_entry *e, const char *name, hvd_handle *handle, hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    if (g.state != RT_RUNNING) {
        not_running(err);
        return refuse(e);
    }
    if (name) {
        e->name = strdup(name);
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "%s.noname.%llu", rt_optype_name(e->p.optype),
                 (unsigned long long)++g.noname[e->p.optype]);
        e->name = strdup(buf);
    }
    if (!e->name) {
        hvd_err_set(err, HVD_E_INTERNAL, "%s: out of memory submitting the tensor",
                    rt_optype_name(e->p.optype));
        return refuse(e);
    }
    if (rt_strmap_get(&g.inflight, e->name)) {
        hvd_err_set(err, HVD_E_STATE,
                    "a collective named '%s' is already pending on this rank; wait for its handle "
                    "before submitting the name again",
                    e->name);
        return refuse(e);
    }
    e->handle = handle_alloc();
    if (e->handle) handle_get(e->handle)->seq = t_last_seq = ++g.q_seq;
    if (!e->handle || rt_strmap_put(&g.inflight, e->name, (void *)1) != 0) {
        if (e->handle) handle_release(e->handle);
        hvd_err_set(err, HVD_E_INTERNAL, "%s of '%s': out of memory submitting the tensor",
                    rt_optype_name(e->p.optype), e->name);
        return refuse(e);
    }
    e->next = NULL;
    if (g.q_tail)
        g.q_tail->next = e;
    else
        g.q_head = e;
    g.q_tail = e;
    g.q_last_ns = hvd_now_ns();
    if (g.bg_sleeping) pthread_cond_signal(&g.bg_cv); /* the next cycle starts now */
    *handle = e->handle;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

int rt_current_size(hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    int s = g.state == RT_RUNNING ? g.ids.size : not_running(err);
    pthread_mutex_unlock(&g.mu);
    return s;
}

/* ---- public reads (include/hvd/runtime.h) ---------------------------------------------- */

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
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "handle %lld is unknown: never returned by a submission, or already "
                           "released by hvd_wait",
                           (long long)handle);
    }
    /* This thread's newest submission, if still queued, ends the burst: the thread submits
     * nothing more while it waits (even if the entry it waits for was taken earlier). */
    uint64_t mine = s->seq > t_last_seq ? s->seq : t_last_seq;
    if (!s->done && mine > g.drained_seq && mine > g.wait_seq) {
        g.wait_seq = mine;
        if (g.bg_in_burst) pthread_cond_signal(&g.bg_cv);
    }
    /* The table may move while we sleep: look the slot up again after every wake-up. */
    while (!s->done) {
        pthread_cond_wait(&g.cv, &g.mu);
        if (!(s = handle_get(handle))) { /* another thread waited for it and released it */
            pthread_mutex_unlock(&g.mu);
            return hvd_err_set(err, HVD_E_NOT_FOUND,
                               "handle %lld was released by another thread's hvd_wait",
                               (long long)handle);
        }
    }
    int ret = 0;
    if (s->status != 0)
        ret = hvd_err_set(err, s->status, "%s",
                          s->msg ? s->msg : "failed (its message was lost: out of memory)");
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
        int v = g.ids_valid ? g.ids.field : -1;                                                    \
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
    int r = g.state == RT_RUNNING;
    pthread_mutex_unlock(&g.mu);
    return r;
}
