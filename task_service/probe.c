/* Task-to-task reachability (Horovod's BasicClient with match_intf=True): every address of
 * every task the driver named is tried on its own, a few at a time, each within a short
 * budget, so one black-holed interface costs one budget and not one per peer. An attempt that
 * ran out of time is made once more: a peer's single event loop on a loaded machine can take
 * longer than the budget to answer a burst of handshakes. */
#include "probe.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd/proto.h"
#include "hvd/rpc.h"

#define PROBE_THREADS  8  /* probes in flight at once */
#define PROBE_ATTEMPTS 2  /* tries per address when one times out */
#define PROBE_PAUSE_MS 50 /* before the second, plus up to as much again (spread) */

typedef struct probe_job {
    uint32_t to;        /* the peer's index */
    const hvd_addr *at; /* one of its addresses */
    bool reached;       /* written by one worker, read after join */
} probe_job;

typedef struct probe_pool {
    const hvd_secret *secret;
    probe_job *jobs;
    size_t njobs;
    atomic_size_t next; /* next job to take */
    atomic_bool *cancel;
    const hvd_addr *local; /* every address of this machine */
    size_t nlocal;
    int timeout_ms;
} probe_pool;

/* Copies host without an IPv6 "%scope" suffix (the address a peer saw has none). */
static void unscoped(const char *host, char *out, size_t len) {
    size_t n = strcspn(host, "%");
    if (n >= len) n = len - 1;
    memcpy(out, host, n);
    out[n] = '\0';
}

/* Whether host is one of our addresses on the interface called ifname. */
static bool ours_on(const probe_pool *p, const char *host, const char *ifname) {
    char want[HVD_HOST_MAX], have[HVD_HOST_MAX];
    unscoped(host, want, sizeof want);
    for (size_t i = 0; i < p->nlocal; i++) {
        if (strcmp(p->local[i].ifname, ifname) != 0) continue;
        unscoped(p->local[i].host, have, sizeof have);
        if (strcmp(have, want) == 0) return true;
    }
    return false;
}

static void probe_one(const probe_pool *p, probe_job *j) {
    if (!j->at->ifname[0]) return; /* nothing to match the interface against */
    char name[HVD_SERVICE_NAME_MAX];
    hvd_task_service_name(j->to, name);
    hvd_client_config cc = {.service = name,
                            .secret = *p->secret,
                            .addrs = j->at,
                            .naddrs = 1,
                            .probe_timeout_ms = p->timeout_ms,
                            .io_timeout_ms = p->timeout_ms};
    hvd_err err;
    hvd_client *c = NULL;
    for (int attempt = 0; !c && attempt < PROBE_ATTEMPTS && !atomic_load(p->cancel); attempt++) {
        if (attempt > 0) {
            struct timespec ts = {0, (PROBE_PAUSE_MS + (long)(j->to % PROBE_PAUSE_MS)) * 1000000L};
            nanosleep(&ts, NULL);
        }
        c = hvd_client_connect(&cc, &err);
        if (!c && err.code != HVD_E_TIMEOUT) break; /* refused, wrong service: final */
    }
    hvd_secret_wipe(&cc.secret);
    if (!c) return;
    hvd_pong pong;
    if (hvd_client_call(c, &hvd_ping_desc, NULL, &hvd_pong_desc, &pong, 0, 0, &err) == 0) {
        /* The handshake already proved the name; the pong says where it saw us from. */
        j->reached = pong.peer_host && ours_on(p, pong.peer_host, j->at->ifname);
        hvd_msg_free(&hvd_pong_desc, &pong);
    }
    hvd_client_close(c);
}

static void *probe_worker(void *arg) {
    probe_pool *p = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->njobs || atomic_load(p->cancel)) break;
        probe_one(p, &p->jobs[i]);
    }
    return NULL;
}

/* Fills p->jobs with one job per address of every task but self, in the order of tasks.
 * Returns 0, or -1 if out of memory. */
static int plan_jobs(probe_pool *p, uint32_t self, const hvd_list *tasks) {
    const hvd_task_info *info = tasks->v;
    size_t njobs = 0;
    for (size_t i = 0; i < tasks->n; i++)
        if (info[i].index != self) njobs += info[i].addrs.n;
    p->jobs = calloc(njobs ? njobs : 1, sizeof *p->jobs);
    if (!p->jobs) return -1;
    for (size_t i = 0; i < tasks->n; i++) {
        if (info[i].index == self) continue;
        const hvd_addr *a = info[i].addrs.v;
        for (size_t k = 0; k < info[i].addrs.n; k++)
            p->jobs[p->njobs++] = (probe_job){.to = info[i].index, .at = &a[k]};
    }
    return 0;
}

/* Runs every job on up to PROBE_THREADS threads, this one included. */
static void run_jobs(probe_pool *p) {
    pthread_t th[PROBE_THREADS];
    size_t nth = 0;
    while (nth < PROBE_THREADS && nth < p->njobs &&
           pthread_create(&th[nth], NULL, probe_worker, p) == 0)
        nth++;
    probe_worker(p); /* this thread helps (and does it all if no thread started) */
    for (size_t i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
}

/* One hvd_reach per task but self in out (its reach.v has room for them), with the
 * addresses its jobs reached. Returns 0, or -1 with err. */
static int collect(const probe_pool *p, uint32_t self, const hvd_list *tasks,
                   hvd_reachable_msg *out, hvd_err *err) {
    const hvd_task_info *info = tasks->v;
    hvd_reach *reach = out->reach.v;
    size_t job = 0;
    for (size_t i = 0; i < tasks->n; i++) {
        if (info[i].index == self) continue;
        hvd_reach *r = &reach[out->reach.n++];
        r->to = info[i].index;
        size_t n = info[i].addrs.n;
        hvd_addr *got = calloc(n ? n : 1, sizeof *got);
        if (!got) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        r->addrs.v = got;
        for (size_t k = 0; k < n; k++, job++)
            if (p->jobs[job].reached) got[r->addrs.n++] = *p->jobs[job].at;
    }
    return 0;
}

int probe_peers(const hvd_secret *secret, uint32_t self, const hvd_list *tasks, int timeout_ms,
                atomic_bool *cancel, hvd_reachable_msg *out, hvd_err *err) {
    memset(out, 0, sizeof *out);
    out->from = self;
    const hvd_task_info *info = tasks->v;
    probe_pool p = {.secret = secret, .cancel = cancel, .timeout_ms = timeout_ms};
    atomic_init(&p.next, 0);
    hvd_addr *local = NULL;
    if (hvd_local_addrs(&local, &p.nlocal, 0, NULL, err) != 0) return -1;
    p.local = local;
    size_t npeers = 0;
    for (size_t i = 0; i < tasks->n; i++)
        npeers += info[i].index != self;
    out->reach.v = calloc(npeers ? npeers : 1, sizeof(hvd_reach));
    int rc;
    if (plan_jobs(&p, self, tasks) != 0 || !out->reach.v) {
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    } else {
        run_jobs(&p);
        rc = collect(&p, self, tasks, out, err);
    }
    free(p.jobs);
    free(local);
    if (rc != 0) hvd_msg_free(&hvd_reachable_desc, out);
    return rc;
}
