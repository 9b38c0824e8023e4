/* libhvd_elastic: the rank side of elastic jobs (include/hvd/elastic.h). The state travels to
 * and from this rank's task service over RPC (COMMIT_STATE, LATEST_COMMIT, FETCH_COMMIT); the
 * ranks agree through the runtime's collectives (which commit is newest, who holds it, its
 * bytes, whether the hosts changed). */
#include "hvd/elastic.h"

#include <pthread.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "hvd/net.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "hvd/runtime.h"

/* The process's one context (guarded by mu). */
static struct {
    pthread_mutex_t mu;
    hvd_client *task;   /* this rank's task service, or NULL until needed */
    hvd_client *driver; /* rank 0 only: the driver, for ELASTIC_STATE */
    uint64_t commit_id; /* the newest commit saved or restored */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

int hvd_elastic_enabled(void) {
    const char *e = getenv(HVD_ELASTIC_EPOCH_ENV);
    return e && *e;
}

static uint64_t my_epoch(void) {
    const char *e = getenv(HVD_ELASTIC_EPOCH_ENV);
    return e ? strtoull(e, NULL, 10) : 0;
}

/* ---- The task service --------------------------------------------------------------------- */

/* Connects to this rank's task service ($HVD_TASK_ADDRS, $HVD_TASK_INDEX, the job secret).
 * g.mu held. Returns 0, or -1 with err. */
static int task_open(hvd_err *err) {
    if (g.task) return 0;
    const char *text = getenv(HVD_TASK_ADDRS_ENV), *index = getenv(HVD_TASK_INDEX_ENV);
    if (!text || !*text || !index || !*index)
        return hvd_err_set(err, HVD_E_STATE,
                           "%s and %s are not set: an elastic rank runs under hvd-exec",
                           HVD_TASK_ADDRS_ENV, HVD_TASK_INDEX_ENV);
    hvd_addr *addrs;
    size_t n;
    if (hvd_addrs_parse(text, &addrs, &n, err) != 0)
        return hvd_err_prefix(err, "%s: ", HVD_TASK_ADDRS_ENV);
    long task_index;
    if (hvd_parse_long(index, 0, UINT32_MAX, HVD_TASK_INDEX_ENV, &task_index, err) != 0) {
        free(addrs);
        return -1;
    }
    hvd_client_config cc = {.addrs = addrs, .naddrs = n};
    char name[HVD_SERVICE_NAME_MAX];
    hvd_task_service_name((uint32_t)task_index, name);
    cc.service = name;
    int rc = hvd_secret_load_env(&cc.secret, err);
    if (rc == 0 && !(g.task = hvd_client_connect(&cc, err))) rc = -1;
    hvd_secret_wipe(&cc.secret);
    free(addrs);
    return rc == 0 ? 0 : hvd_err_prefix(err, "cannot reach this rank's task service: ");
}

/* The id of the newest commit this rank's task service holds (0: none). g.mu held. */
static int task_latest(uint64_t *id, hvd_err *err) {
    hvd_commit_msg c;
    if (task_open(err) != 0 || hvd_client_call(g.task, &hvd_latest_commit_desc, NULL,
                                               &hvd_commit_desc, &c, 0, HVD_CALL_RETRY, err) != 0)
        return -1;
    *id = c.id;
    hvd_msg_free(&hvd_commit_desc, &c);
    return 0;
}

/* Commit `id` from this rank's task service into *c. g.mu held. */
static int task_fetch(uint64_t id, hvd_commit_msg *c, hvd_err *err) {
    hvd_commit_ref_msg ref = {.id = id};
    if (task_open(err) != 0) return -1;
    return hvd_client_call(g.task, &hvd_fetch_commit_desc, &ref, &hvd_commit_desc, c, 0,
                           HVD_CALL_RETRY, err);
}

/* Stores commit `id` in this rank's task service. g.mu held. */
static int task_store(uint64_t id, const void *state, size_t len, hvd_err *err) {
    /* Checked before anything is sent, as HVD_E_INVALID, which hvd_elastic_resettable calls
     * incurable: the rank fails instead of being reset to meet the same state again. */
    if (len > HVD_ELASTIC_STATE_MAX)
        return hvd_err_set(err, HVD_E_INVALID,
                           "the state to commit is %.1f MiB (%zu bytes), over the %u MiB a task "
                           "service keeps (HVD_ELASTIC_STATE_MAX, fixed at build time): commit "
                           "less, only what the "
                           "training cannot redo (the parameters, the optimizer's state, where "
                           "it is)",
                           (double)len / (1024.0 * 1024.0), len, HVD_ELASTIC_STATE_MAX >> 20);
    hvd_commit_msg c = {.id = id, .size = len, .state = {(uint8_t *)state, len}};
    if (task_open(err) != 0) return -1;
    return hvd_client_call(g.task, &hvd_commit_state_desc, &c, &hvd_ack_desc, NULL, 0,
                           HVD_CALL_RETRY, err);
}

/* ---- Collectives ---------------------------------------------------------------------------- */

static int max_u64(const char *name, uint64_t *v, hvd_err *err) {
    uint64_t in = *v;
    return hvd_allreduce(name, &in, v, 1, HVD_INT64, HVD_OP_MAX, HVD_DEVICE_CPU, err);
}

/* The bytes of commit `id` from rank root to every rank; *len = -1 on every rank if root could
 * not read them. */
static int bcast_state(int root, uint64_t id, void **state, int64_t *len, hvd_err *err) {
    hvd_commit_msg c = {0};
    *len = -1;
    if (hvd_rank() == root) {
        hvd_err ferr;
        if (task_fetch(id, &c, &ferr) == 0)
            *len = (int64_t)c.state.len;
        else
            fprintf(stderr, "hvd_elastic: rank %d cannot read commit %llu: %s\n", root,
                    (unsigned long long)id, ferr.msg);
    }
    int rc = hvd_broadcast("hvd.elastic.len", len, 1, HVD_INT64, root, HVD_DEVICE_CPU, err);
    *state = NULL;
    if (rc == 0 && *len > 0) {
        *state = hvd_rank() == root ? c.state.data : malloc((size_t)*len);
        if (hvd_rank() == root) c.state.data = NULL; /* handed over */
        if (!*state) rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory for the state");
        if (rc == 0)
            rc = hvd_broadcast("hvd.elastic.state", *state, *len, HVD_UINT8, root, HVD_DEVICE_CPU,
                               err);
    }
    hvd_msg_free(&hvd_commit_desc, &c);
    if (rc == 0 && *len < 0)
        rc = hvd_err_set(err, HVD_E_IO, "rank %d could not read commit %llu from its task service",
                         root, (unsigned long long)id);
    if (rc != 0) {
        free(*state);
        *state = NULL;
    }
    return rc;
}

/* The rank that holds commit `newest` with the lowest number. */
static int holder(uint64_t mine, uint64_t newest, int *root, hvd_err *err) {
    int32_t in = mine == newest ? hvd_rank() : INT32_MAX, out = INT32_MAX;
    if (hvd_allreduce("hvd.elastic.holder", &in, &out, 1, HVD_INT32, HVD_OP_MIN, HVD_DEVICE_CPU,
                      err) != 0)
        return -1;
    *root = out;
    return 0;
}

static int restore_locked(void **state, size_t *len, hvd_err *err) {
    uint64_t mine = 0, newest;
    hvd_err lerr;
    if (task_latest(&mine, &lerr) != 0) { /* take part anyway: the others may hold it */
        fprintf(stderr, "hvd_elastic: rank %d: %s\n", hvd_rank(), lerr.msg);
        mine = 0;
    }
    newest = mine;
    if (max_u64("hvd.elastic.newest", &newest, err) != 0) return -1;
    if (newest == 0) return 0;
    int root;
    int64_t n;
    if (holder(mine, newest, &root, err) != 0 || bcast_state(root, newest, state, &n, err) != 0)
        return -1;
    *len = (size_t)n;
    if (mine != newest && task_store(newest, *state, *len, &lerr) != 0)
        fprintf(stderr, "hvd_elastic: rank %d cannot keep commit %llu: %s\n", hvd_rank(),
                (unsigned long long)newest, lerr.msg);
    g.commit_id = newest;
    return 1;
}

int hvd_elastic_restore(void **state, size_t *len, hvd_err *err) {
    *state = NULL;
    *len = 0;
    if (!hvd_elastic_enabled()) return 0;
    pthread_mutex_lock(&g.mu);
    int rc = restore_locked(state, len, err);
    pthread_mutex_unlock(&g.mu);
    return rc;
}

int hvd_elastic_save(const void *state, size_t len, hvd_err *err) {
    pthread_mutex_lock(&g.mu);
    int rc = hvd_elastic_enabled() ? task_store(g.commit_id + 1, state, len, err) : 0;
    if (rc == 0) g.commit_id++;
    pthread_mutex_unlock(&g.mu);
    return rc;
}

/* Rank 0: whether the driver says the hosts changed (or moved on to another launch). */
static int driver_says_updated(hvd_err *err) {
    if (!g.driver && !(g.driver = hvd_driver_connect_env(NULL, err))) return -1;
    hvd_elastic_msg m;
    if (hvd_client_call(g.driver, &hvd_elastic_state_desc, NULL, &hvd_elastic_desc, &m, 0,
                        HVD_CALL_RETRY, err) != 0)
        return -1;
    return m.hosts_updated || m.epoch != my_epoch();
}

int hvd_elastic_check_host_updates(hvd_err *err) {
    if (!hvd_elastic_enabled()) return 0;
    pthread_mutex_lock(&g.mu);
    int32_t updated = 0;
    if (hvd_rank() == 0) {
        hvd_err derr;
        int r = driver_says_updated(&derr);
        if (r < 0) fprintf(stderr, "hvd_elastic: cannot ask the driver: %s\n", derr.msg);
        updated = r > 0;
    }
    int rc = hvd_broadcast("hvd.elastic.updated", &updated, 1, HVD_INT32, 0, HVD_DEVICE_CPU, err);
    pthread_mutex_unlock(&g.mu);
    if (rc != 0) return -1;
    return updated ? HVD_ELASTIC_RESET : 0;
}

int hvd_elastic_commit(const void *state, size_t len, hvd_err *err) {
    if (hvd_elastic_save(state, len, err) != 0) return -1;
    return hvd_elastic_check_host_updates(err);
}

int hvd_elastic_resettable(int code) {
    return code == HVD_E_IO || code == HVD_E_TIMEOUT || code == HVD_E_SHUTDOWN ||
           code == HVD_E_INTERNAL;
}

uint64_t hvd_elastic_commit_id(void) {
    pthread_mutex_lock(&g.mu);
    uint64_t id = g.commit_id;
    pthread_mutex_unlock(&g.mu);
    return id;
}

void hvd_elastic_close(void) {
    pthread_mutex_lock(&g.mu);
    hvd_client_close(g.task);
    hvd_client_close(g.driver);
    g.task = g.driver = NULL;
    pthread_mutex_unlock(&g.mu);
}
