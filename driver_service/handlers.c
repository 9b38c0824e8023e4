/* The driver service's request handlers. They run on the server's loop thread and never
 * block: each one decodes, checks, updates or reads the registry under d->mu and answers at
 * once, except WAIT_SHUTDOWN, which is held (holding no thread) until the driver shuts the
 * tasks down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

/* Decodes body into msg or fails the call; returns 0 when the handler may go on. */
static int unpack_or_fail(hvd_call *call, const msgpack_object *body, const hvd_msg_desc *desc,
                          void *msg) {
    hvd_err err;
    if (hvd_msg_unpack(body, desc, msg, &err) == 0) return 0;
    hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
    return -1;
}

/* Compares hosts, treating an IPv4-mapped IPv6 peer ("::ffff:10.0.0.5") as its IPv4 form. */
static bool same_host(const char *declared, const char *peer) {
    if (strncmp(peer, "::ffff:", 7) == 0 && strchr(peer + 7, '.')) peer += 7;
    return strcmp(declared, peer) == 0;
}

/* ---- REGISTER_TASK ------------------------------------------------------------------------ */

/* Checks a registration; fails the call and returns false if it is not acceptable. Sets
 * *declared when the peer address is one of the task's declared addresses. */
static bool registration_ok(hvd_driver *d, hvd_call *call, const hvd_task_info *info,
                            bool *declared) {
    if (info->index >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID,
                      "task index %u is outside 0..%u: do the driver and the tasks agree on the "
                      "number of tasks?",
                      info->index, d->num_tasks - 1);
        return false;
    }
    if (!info->host_hash || !hvd_host_hash_valid(info->host_hash)) {
        hvd_call_fail(call, HVD_E_INVALID,
                      "task %u registered the host hash \"%.64s\", which is not 1 to 127 "
                      "characters of [A-Za-z0-9_-]: check HVD_HOST_HASH on that executor",
                      info->index, info->host_hash ? info->host_hash : "");
        return false;
    }
    if (info->addrs.n == 0) {
        hvd_call_fail(call, HVD_E_INVALID,
                      "task %u registered no addresses: its task service must listen on at "
                      "least one interface (check --nics on that executor)",
                      info->index);
        return false;
    }
    const hvd_addr *a = info->addrs.v;
    *declared = false;
    for (size_t i = 0; i < info->addrs.n; i++) {
        if (!a[i].host[0] || a[i].port == 0) {
            hvd_call_fail(call, HVD_E_INVALID,
                          "task %u registered address %zu without a host or a port: every "
                          "address must be a numeric IP and a listening port",
                          info->index, i);
            return false;
        }
        if (same_host(a[i].host, hvd_call_peer_host(call))) *declared = true;
    }
    return true;
}

static void on_register(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_task_info info;
    if (unpack_or_fail(call, body, &hvd_register_task_desc, &info) != 0) return;
    bool declared;
    if (!registration_ok(d, call, &info, &declared)) {
        hvd_msg_free(&hvd_register_task_desc, &info);
        return;
    }
    char peer[HVD_HOST_MAX], host[HVD_HOST_HASH_MAX];
    snprintf(peer, sizeof peer, "%s", hvd_call_peer_host(call));
    snprintf(host, sizeof host, "%s", info.host_hash);
    uint32_t index = info.index;
    char *addrs_text = declared ? NULL : hvd_addrs_format(info.addrs.v, info.addrs.n);

    drv_put_outcome o;
    pthread_mutex_lock(&d->mu);
    int rc = drv_reg_put(&d->reg, &info, peer, &o);
    drv_task *t = &d->reg.tasks[index];
    if (rc == 0 && t->lost) { /* registering again: the task is back (an elastic job's) */
        t->lost = false;
        atomic_fetch_sub(&d->nlost, 1);
    }
    if (rc == 0) pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    hvd_msg_free(&hvd_register_task_desc, &info); /* empty unless drv_reg_put failed */

    if (rc != 0) {
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory registering task %u",
                      index);
        free(addrs_text);
        return;
    }
    /* Log first: whoever gets the ack can count on the line being there. */
    if (!declared)
        drv_log(d,
                "warning: task %u registered from %s, which is none of the addresses it declared "
                "(%s): is it behind NAT? The driver and the other tasks will use the declared "
                "addresses",
                index, peer, addrs_text ? addrs_text : "?");
    if (o.moved)
        drv_log(d,
                "warning: task %u registered again from host %s at %s, replacing its entry from "
                "host %s: do two executors use index %u?",
                index, host, peer, o.old_host, index);
    else if (o.replaced)
        drv_log(d, "task %u registered again (host hash %s): its entry was replaced", index, host);
    hvd_call_reply(call, &hvd_ack_desc, NULL);
    free(addrs_text);
}

/* ---- Lookups -------------------------------------------------------------------------------- */

/* The registered task `index`, or NULL after failing the call. d->mu held. */
static drv_task *registered_or_fail(hvd_driver *d, hvd_call *call, uint32_t index) {
    if (index >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID, "task index %u is outside 0..%u", index,
                      d->num_tasks - 1);
        return NULL;
    }
    drv_task *t = &d->reg.tasks[index];
    if (!t->registered) {
        hvd_call_fail(call, HVD_E_NOT_FOUND, "task %u has not registered (%u of %u tasks have)",
                      index, d->reg.nregistered, d->num_tasks);
        return NULL;
    }
    return t;
}

static void on_task_addrs(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_index_msg req;
    if (unpack_or_fail(call, body, &hvd_task_addrs_desc, &req) != 0) return;
    pthread_mutex_lock(&d->mu);
    drv_task *t = registered_or_fail(d, call, req.index);
    if (t) {
        hvd_addrs_msg m = {.addrs = t->info.addrs};
        hvd_call_reply(call, &hvd_addrs_desc, &m);
    }
    pthread_mutex_unlock(&d->mu);
}

static void on_task_info(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_index_msg req;
    if (unpack_or_fail(call, body, &hvd_task_info_req_desc, &req) != 0) return;
    pthread_mutex_lock(&d->mu);
    drv_task *t = registered_or_fail(d, call, req.index);
    if (t) hvd_call_reply(call, &hvd_task_info_desc, &t->info);
    pthread_mutex_unlock(&d->mu);
}

static void on_host_indices(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_host_msg req;
    if (unpack_or_fail(call, body, &hvd_host_indices_desc, &req) != 0) return;
    const char *hh = req.host_hash ? req.host_hash : "";
    pthread_mutex_lock(&d->mu);
    drv_host *h = drv_reg_host(&d->reg, hh);
    uint32_t *act = h ? malloc(h->n * sizeof *act) : NULL;
    size_t nact = act ? drv_host_active(&d->reg, h, act) : 0;
    if (h && !act) {
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory");
    } else if (nact > 0) { /* the tasks of the job (an elastic job may hold spares) */
        hvd_indices_msg m = {.indices = {act, nact}};
        hvd_call_reply(call, &hvd_indices_desc, &m);
    } else {
        hvd_call_fail(call, HVD_E_NOT_FOUND,
                      "no task registered with host hash \"%.128s\" (%u of %u tasks registered "
                      "so far): is HOROVOD_HOSTNAME, or the host given to hvd-rsh, the host hash "
                      "of a registered task?",
                      hh, d->reg.nregistered, d->num_tasks);
    }
    pthread_mutex_unlock(&d->mu);
    free(act);
    hvd_msg_free(&hvd_host_indices_desc, &req);
}

static void on_set_local_rank(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_local_rank_msg req;
    if (unpack_or_fail(call, body, &hvd_set_local_rank_desc, &req) != 0) return;
    hvd_err err;
    uint32_t index = 0;
    pthread_mutex_lock(&d->mu);
    int rc = drv_reg_set_rank(&d->reg, req.host_hash ? req.host_hash : "", req.local_rank, req.rank,
                              &index, &err);
    pthread_mutex_unlock(&d->mu);
    if (rc == 0) {
        hvd_index_msg m = {.index = index};
        hvd_call_reply(call, &hvd_index_desc, &m);
    } else {
        hvd_call_fail(call, err.code, "%s", err.msg);
    }
    hvd_msg_free(&hvd_set_local_rank_desc, &req);
}

static void on_index_by_rank(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_rank_msg req;
    if (unpack_or_fail(call, body, &hvd_index_by_rank_desc, &req) != 0) return;
    if (req.rank >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID, "rank %u is outside 0..%u", req.rank, d->num_tasks - 1);
        return;
    }
    pthread_mutex_lock(&d->mu);
    int64_t index = d->reg.rank_index[req.rank];
    pthread_mutex_unlock(&d->mu);
    if (index < 0) {
        hvd_call_fail(call, HVD_E_NOT_FOUND,
                      "rank %u is not mapped to a task: it has not called SET_LOCAL_RANK",
                      req.rank);
        return;
    }
    hvd_index_msg m = {.index = (uint32_t)index};
    hvd_call_reply(call, &hvd_index_desc, &m);
}

static void on_code(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_driver *d = user;
    if (!d->has_code) {
        hvd_call_fail(call, HVD_E_NOT_FOUND, "this driver was started without an entry point");
        return;
    }
    hvd_call_reply(call, &hvd_code_desc, &d->code); /* immutable after start: no lock */
}

/* ---- Reports -------------------------------------------------------------------------------- */

/* Checks a report's task numbers; fails the call and returns false if one is out of range. */
static bool report_ok(hvd_driver *d, hvd_call *call, const hvd_reachable_msg *m) {
    if (m->from >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID, "reachability report from task %u, outside 0..%u",
                      m->from, d->num_tasks - 1);
        return false;
    }
    const hvd_reach *r = m->reach.v;
    for (size_t i = 0; i < m->reach.n; i++) {
        if (r[i].to >= d->num_tasks) {
            hvd_call_fail(call, HVD_E_INVALID, "task %u reported reaching task %u, outside 0..%u",
                          m->from, r[i].to, d->num_tasks - 1);
            return false;
        }
    }
    return true;
}

static void on_report_reachable(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_reachable_msg m;
    if (unpack_or_fail(call, body, &hvd_reachable_desc, &m) != 0) return;
    if (!report_ok(d, call, &m)) {
        hvd_msg_free(&hvd_reachable_desc, &m);
        return;
    }
    pthread_mutex_lock(&d->mu);
    bool registered = d->reg.tasks[m.from].registered;
    int rc = registered ? drv_reg_put_reach(&d->reg, &m) : 0;
    if (registered && rc == 0) pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (!registered)
        hvd_call_fail(call, HVD_E_STATE, "task %u reported reachability before registering",
                      m.from);
    else if (rc != 0)
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory storing a report");
    else
        hvd_call_reply(call, &hvd_ack_desc, NULL);
    hvd_msg_free(&hvd_reachable_desc, &m);
}

static void on_report_result(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_result_msg m;
    if (unpack_or_fail(call, body, &hvd_report_result_desc, &m) != 0) return;
    pthread_mutex_lock(&d->mu);
    uint32_t nranks = d->reg.nact; /* an elastic job's size changes */
    bool ok = m.rank >= 0 && (uint32_t)m.rank < nranks && m.index < d->num_tasks;
    if (ok) {
        drv_reg_put_result(&d->reg, &m);
        pthread_cond_broadcast(&d->cv); /* hvd_driver_wait_results */
    }
    pthread_mutex_unlock(&d->mu);
    if (ok)
        hvd_call_reply(call, &hvd_ack_desc, NULL);
    else if (m.rank < 0 || (uint32_t)m.rank >= nranks)
        hvd_call_fail(call, HVD_E_INVALID, "result for rank %d, outside 0..%u", m.rank, nranks - 1);
    else
        hvd_call_fail(call, HVD_E_INVALID, "result of rank %d names task %u, outside 0..%u", m.rank,
                      m.index, d->num_tasks - 1);
    hvd_msg_free(&hvd_report_result_desc, &m);
}

/* ---- WAIT_SHUTDOWN: a long-poll that holds no thread ---------------------------------------- */

static void held_unlink(hvd_driver *d, drv_held *h) {
    if (h->prev)
        h->prev->next = h->next;
    else
        d->held = h->next;
    if (h->next) h->next->prev = h->prev;
    atomic_fetch_sub(&d->nheld, 1);
}

/* The client went away (or the server stopped) before the answer. Every task service holds
 * one WAIT_SHUTDOWN for the whole job: the last long-poll of a registered task breaking
 * before the driver shuts tasks down means that task service died or lost the network. One of
 * several (a task re-issuing its long-poll, another holder of the key), or one of an index
 * nobody registered, means nothing. */
static void on_held_cancel(void *arg) {
    drv_held *h = arg;
    hvd_driver *d = h->d;
    pthread_mutex_lock(&d->mu);
    drv_task *t = &d->reg.tasks[h->index];
    t->watches--;
    if (t->watches == 0 && !t->done) drv_mark_lost(d, t, hvd_call_close_error(h->call), NULL);
    pthread_mutex_unlock(&d->mu);
    held_unlink(d, h);
    free(h);
}

void drv_mark_lost(hvd_driver *d, drv_task *t, int err, const char *why) {
    if (d->tasks_shutdown || !t->registered || t->lost) return;
    t->lost = true;
    t->lost_err = err;
    snprintf(t->lost_why, sizeof t->lost_why, "%s", why ? why : "");
    t->lost_seq = ++d->reg.seq;
    atomic_fetch_add(&d->nlost, 1);
}

void drv_answer_held(hvd_driver *d) {
    /* Take one at a time from the head: answering may close a connection, whose other held
     * calls are then cancelled (and unlinked) by on_held_cancel. */
    while (d->held) {
        drv_held *h = d->held;
        held_unlink(d, h);
        hvd_call *call = h->call;
        free(h);
        hvd_call_reply(call, &hvd_ack_desc, NULL);
    }
}

void drv_answer_held_of(hvd_driver *d, const bool *which) {
    for (;;) { /* from the head each time, as drv_answer_held does */
        drv_held *h = d->held;
        while (h && !which[h->index])
            h = h->next;
        if (!h) return;
        held_unlink(d, h);
        hvd_call *call = h->call;
        free(h);
        hvd_call_reply(call, &hvd_ack_desc, NULL);
    }
}

static void on_wait_shutdown(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_driver *d = user;
    hvd_index_msg m;
    if (unpack_or_fail(call, body, &hvd_wait_shutdown_desc, &m) != 0) return;
    if (m.index >= d->num_tasks) {
        hvd_call_fail(call, HVD_E_INVALID, "WAIT_SHUTDOWN for task %u, outside 0..%u", m.index,
                      d->num_tasks - 1);
        return;
    }
    drv_held *h = calloc(1, sizeof *h);
    if (!h) {
        hvd_call_fail(call, HVD_E_INTERNAL, "the driver ran out of memory");
        return;
    }
    pthread_mutex_lock(&d->mu);
    bool now = d->tasks_shutdown;
    drv_task *t = &d->reg.tasks[m.index];
    if (!now) t->watches++;
    if (t->lost) { /* a renewed watch: the task is back */
        t->lost = false;
        atomic_fetch_sub(&d->nlost, 1);
    }
    pthread_mutex_unlock(&d->mu);
    /* If shutdown is set after this check, its post runs after this handler and answers. */
    if (now) {
        free(h);
        hvd_call_reply(call, &hvd_ack_desc, NULL);
        return;
    }
    h->d = d;
    h->call = call;
    h->index = m.index;
    h->next = d->held;
    if (d->held) d->held->prev = h;
    d->held = h;
    atomic_fetch_add(&d->nheld, 1);
    hvd_call_on_cancel(call, on_held_cancel, h);
}

/* ---- ELASTIC_STATE ----------------------------------------------------------------------------
 */

static void on_elastic_state(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_driver *d = user;
    pthread_mutex_lock(&d->mu);
    hvd_elastic_msg m = d->elastic;
    pthread_mutex_unlock(&d->mu);
    hvd_call_reply(call, &hvd_elastic_desc, &m);
}

int drv_install_handlers(hvd_driver *d) {
    static const struct {
        uint32_t type;
        hvd_handler_fn fn;
    } table[] = {
        {HVD_MSG_REGISTER_TASK, on_register},
        {HVD_MSG_TASK_ADDRS, on_task_addrs},
        {HVD_MSG_TASK_INFO, on_task_info},
        {HVD_MSG_HOST_INDICES, on_host_indices},
        {HVD_MSG_SET_LOCAL_RANK, on_set_local_rank},
        {HVD_MSG_INDEX_BY_RANK, on_index_by_rank},
        {HVD_MSG_CODE, on_code},
        {HVD_MSG_REPORT_REACHABLE, on_report_reachable},
        {HVD_MSG_REPORT_RESULT, on_report_result},
        {HVD_MSG_WAIT_SHUTDOWN, on_wait_shutdown},
        {HVD_MSG_ELASTIC_STATE, on_elastic_state},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (hvd_server_handle(d->srv, table[i].type, table[i].fn, d) != 0) return -1;
    return drv_install_agent_handlers(d);
}
