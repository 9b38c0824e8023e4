/* libhvd_task: start (identity, server, registration with the driver), stop and results.
 * The top of task_service/ (see include/hvd/task.h and the layers in state.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/fs.h"
#include "common/loop.h"
#include "common/proc.h"
#include "common/sock.h"
#include "common/strv.h"
#include "handlers.h"
#include "held.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "local_out.h"
#include "notes.h"
#include "run.h"
#include "state.h"
#include "warm.h"

extern char **environ;

#define QUIESCE_MS 2000 /* stop: time the loop gets to fail every held call */

/* ---- Start ----------------------------------------------------------------------------------- */

/* The GPU ids of CUDA_VISIBLE_DEVICES: split on ',', blanks around each id trimmed, empty
 * ids dropped. NULL if out of memory. */
static char **gpus_from_env(void) {
    hvd_strb b = {0};
    for (const char *p = getenv("CUDA_VISIBLE_DEVICES"); p && *p;) {
        size_t n = strcspn(p, ",");
        size_t s = 0, e = n;
        while (s < e && (p[s] == ' ' || p[s] == '\t'))
            s++;
        while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
            e--;
        if (e > s) hvd_strb_addf(&b, "%.*s", (int)(e - s), p + s);
        p += n;
        if (*p == ',') p++;
    }
    return hvd_strb_finish(&b);
}

/* GPUs: the configured list, else CUDA_VISIBLE_DEVICES, else none. */
static int init_gpus(hvd_task *t, const char *const *cfg_gpus, hvd_err *err) {
    t->gpus = cfg_gpus ? hvd_strv_copy(cfg_gpus) : gpus_from_env();
    if (!t->gpus) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    t->ngpus = hvd_strv_len((const char *const *)t->gpus);
    return 0;
}

/* The command's base environment: the executor's plus what every command of the job gets. */
static int init_env(hvd_task *t, const hvd_task_config *cfg, hvd_err *err) {
    char *const *base = cfg->base_env;
    char secret[45], index[16], pid[16];
    if (!base) base = environ;
    hvd_secret_to_base64(&t->cfg.secret, secret);
    snprintf(index, sizeof index, "%u", t->cfg.index);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    hvd_env_change ch[] = {
        {HVD_SECRET_ENV, secret},
        {HVD_DRIVER_ADDRS_ENV, t->driver_text},
        {HVD_HOSTNAME_ENV, t->host_hash},
        {HVD_WORK_DIR_ENV, t->work_dir},
        {HVD_TASK_INDEX_ENV, index},
        {HVD_TASK_PID_ENV, pid},
        {NULL, NULL}, /* HVD_WARM_SOCKET and HVD_WARM_PYTHON, if any */
        {NULL, NULL},
    };
    size_t n = sizeof ch / sizeof ch[0] - 2;
    n += (size_t)task_warm_prepare(t, cfg, &ch[n]);
    t->cmd_env = hvd_env_build(base, ch, n, err);
    memset(secret, 0, sizeof secret);
    return t->cmd_env ? 0 : -1;
}

/* The lowest port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), or 0. */
static unsigned ephemeral_low(void) {
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    unsigned low = 0, high = 0;
    if (f) {
        if (fscanf(f, "%u %u", &low, &high) != 2) low = 0;
        fclose(f);
    }
    return low;
}

/* A TCP port free on this host now, for the rank that rendezvous with torch.distributed at
 * MASTER_PORT; 0 if there is none. Picked at random below the kernel's ephemeral range where
 * it can be: the kernel's own pick for port 0 comes from that range, from which it also takes
 * the local ports of outgoing connections, and one of the job's own connections had taken it
 * by the time rank 0 bound it (EADDRINUSE from torch's TCPStore in about 1 of 30 jobs of
 * bench/torch). Another process may still bind it first, as with every free-port pick
 * (torchrun's included). */
static uint16_t free_port(void) {
    unsigned low = ephemeral_low(), span = low > 2048 ? low / 2 : 0;
    unsigned seed = (unsigned)getpid() ^ (unsigned)hvd_now_ns();
    uint16_t port = 0;
    for (int tries = 0; tries < 32 && span; tries++) { /* in [low - span, low) */
        int fd = hvd_listen_tcp(NULL, (uint16_t)(low - span + rand_r(&seed) % span), &port, NULL);
        if (fd >= 0) {
            close(fd);
            return port;
        }
    }
    int fd = hvd_listen_tcp(NULL, 0, &port, NULL);
    if (fd < 0) return 0;
    close(fd);
    return port;
}

static int init_identity(hvd_task *t, const hvd_task_config *cfg, hvd_err *err) {
    if (cfg->host_hash) {
        if (!hvd_host_hash_valid(cfg->host_hash))
            return hvd_err_set(err, HVD_E_INVALID,
                               "invalid host hash '%.64s': use 1 to 127 characters of "
                               "[A-Za-z0-9_-]",
                               cfg->host_hash);
        snprintf(t->host_hash, sizeof t->host_hash, "%s", cfg->host_hash);
    } else if (hvd_host_hash(t->host_hash, NULL, err) != 0) {
        return -1;
    }
    if (init_gpus(t, cfg->gpus, err) != 0) return -1;
    t->work_dir = cfg->work_dir ? strdup(cfg->work_dir) : getcwd(NULL, 0);
    if (!t->work_dir)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot get the working directory: %s",
                           strerror(errno));
    t->driver_addrs = malloc(cfg->n_driver_addrs * sizeof *t->driver_addrs);
    if (!t->driver_addrs) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    memcpy(t->driver_addrs, cfg->driver_addrs, cfg->n_driver_addrs * sizeof *t->driver_addrs);
    t->n_driver_addrs = cfg->n_driver_addrs;
    t->driver_text = hvd_addrs_format(t->driver_addrs, t->n_driver_addrs);
    if (!t->driver_text) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    t->free_port = free_port();
    return 0;
}

/* Whether an error from the driver is worth another try. */
static bool transient(int code) {
    return code == HVD_E_IO || code == HVD_E_TIMEOUT;
}

/* REGISTER_TASK, retried with backoff until the start timeout. */
static int register_task(hvd_task *t, hvd_err *err) {
    hvd_task_info info;
    task_info(t, &info);
    int64_t t0 = hvd_now_ms();
    int64_t deadline = t0 + t->cfg.start_timeout_ms;
    int backoff = TASK_BACKOFF_FIRST_MS, attempts = 0;
    hvd_err last = {0, ""};
    for (;;) {
        attempts++;
        hvd_client *d = task_driver_connect(t, task_attempt_ms(deadline), &last);
        if (d) {
            int rc = hvd_client_call(d, &hvd_register_task_desc, &info, &hvd_ack_desc, NULL, 0,
                                     HVD_CALL_RETRY, &last);
            hvd_client_close(d);
            if (rc == 0) {
                task_log(t, HVD_LOG_INFO, "registered with the driver as host %s (%zu addresses%s)",
                         t->host_hash, t->naddrs, attempts > 1 ? ", after retrying" : "");
                return 0;
            }
        }
        if (!transient(last.code))
            return hvd_err_set(err, last.code, "%s cannot register with the driver at %s: %s",
                               t->name, t->driver_text, last.msg);
        if (hvd_now_ms() + backoff >= deadline)
            return hvd_err_set(err, HVD_E_TIMEOUT,
                               "%s could not register with the driver at %s within %d s (%d "
                               "attempts): %s",
                               t->name, t->driver_text, t->cfg.start_timeout_ms / 1000, attempts,
                               last.msg);
        if (attempts == 1)
            task_log(t, HVD_LOG_WARN, "the driver is not reachable yet, retrying: %s", last.msg);
        task_sleep_ms(backoff);
        backoff = backoff * 2 > TASK_BACKOFF_MAX_MS ? TASK_BACKOFF_MAX_MS : backoff * 2;
    }
}

/* Frees what start allocated (the server must be stopped, or never started). */
static void task_free(hvd_task *t) {
    /* The writer may still post to the server until it is destroyed: it goes first. */
    hvd_local_out_destroy(t->local);
    hvd_server_destroy(t->srv);
    hvd_proc_free(t->cmd);
    task_warm_stop(t);
    while (t->subs) {
        task_sub *s = t->subs;
        t->subs = s->next;
        free(s);
    }
    while (t->waiters) {
        task_waiter *w = t->waiters;
        t->waiters = w->next;
        free(w);
    }
    free(t->fbuf);
    free(t->pipes[0].buf);
    free(t->pipes[1].buf);
    hvd_msg_free(&hvd_result_desc, &t->result);
    hvd_msg_free(&hvd_commit_desc, &t->commit);
    hvd_msg_free(&hvd_registration_done_desc, &t->peers);
    hvd_env_free(t->cmd_env);
    hvd_strv_free(t->gpus);
    free(t->work_dir);
    if (t->shm_dir) hvd_remove_tree(t->shm_dir);
    free(t->shm_dir);
    free(t->driver_addrs);
    free(t->driver_text);
    free(t->addrs);
    if (t->abort_efd >= 0) close(t->abort_efd);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->notes_mu);
    hvd_secret_wipe(&t->cfg.secret);
    free(t);
}

/* A new task: cfg copied with the defaults applied (its pointers NULLed: init_identity and
 * init_env copy what they point to), its lock and condition variable made. NULL if out of
 * memory. */
static hvd_task *task_new(const hvd_task_config *cfg) {
    hvd_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->cfg = *cfg;
    t->cfg.driver_addrs = NULL;
    t->cfg.host_hash = NULL;
    t->cfg.gpus = NULL;
    t->cfg.work_dir = NULL;
    t->cfg.base_env = NULL;
    t->cfg.nics = NULL;
    t->cfg.bind_host = NULL; /* only init_server needs it */
    if (t->cfg.start_timeout_ms <= 0)
        t->cfg.start_timeout_ms = HVD_TASK_START_TIMEOUT_DEFAULT_S * 1000;
    if (t->cfg.grace_ms <= 0) t->cfg.grace_ms = HVD_GRACE_DEFAULT_MS;
    if (t->cfg.min_lifetime_ms == 0) t->cfg.min_lifetime_ms = HVD_MIN_LIFETIME_DEFAULT_MS;
    if (t->cfg.min_lifetime_ms < 0) t->cfg.min_lifetime_ms = 0;
    if (t->cfg.net_timeout_ms <= 0) t->cfg.net_timeout_ms = HVD_NET_TIMEOUT_DEFAULT_S * 1000;
    hvd_task_service_name(cfg->index, t->name);
    t->abort_efd = -1;
    t->warm_fd = -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* task_wait_until's deadlines */
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->notes_mu, NULL);
    atomic_init(&t->probe_cancel, false);
    atomic_init(&t->probe_finished, false);
    t->pipes[0].fd = t->pipes[1].fd = -1;
    return t;
}

/* The eventfd that interrupts hvd_task_run's blocking calls on an abort. */
static int init_abort_fd(hvd_task *t, hvd_err *err) {
    t->abort_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->abort_efd < 0) return hvd_err_set(err, HVD_E_INTERNAL, "eventfd: %s", strerror(errno));
    return 0;
}

/* The RPC server (not started yet) with the request handlers, listening on bind_host (NULL:
 * every interface), and its addresses on nics (NULL: every interface) in t->addrs. */
static int init_server(hvd_task *t, const char *bind_host, const char *const *nics, hvd_err *err) {
    hvd_server_config sc = {.name = t->name,
                            .secret = t->cfg.secret,
                            .bind_host = bind_host,
                            .net_timeout_ms = t->cfg.net_timeout_ms};
    t->srv = hvd_server_create(&sc, err);
    hvd_secret_wipe(&sc.secret);
    if (!t->srv) return -1;
    if (task_handlers_register(t) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "%s: cannot register its request handlers",
                           t->name);
    if (hvd_server_addrs(t->srv, nics, &t->addrs, &t->naddrs, err) != 0) {
        hvd_err_prefix(err, "%s: ", t->name);
        return -1;
    }
    return 0;
}

hvd_task *hvd_task_start(const hvd_task_config *cfg, hvd_err *err) {
    if (!cfg || !cfg->driver_addrs || cfg->n_driver_addrs == 0) {
        hvd_err_set(err, HVD_E_INVALID,
                    "no driver address: a task service needs the driver's addresses (%s)",
                    HVD_DRIVER_ADDRS_ENV);
        return NULL;
    }
    hvd_task *t = task_new(cfg);
    if (!t) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    if (init_identity(t, cfg, err) != 0 || init_abort_fd(t, err) != 0 ||
        init_server(t, cfg->bind_host, cfg->nics, err) != 0 || init_env(t, cfg, err) != 0 ||
        hvd_server_start(t->srv, err) != 0 || register_task(t, err) != 0) {
        task_free(t);
        return NULL;
    }
    task_warm_start(t, cfg);
    return t;
}

/* ---- Results and accessors ------------------------------------------------------------------- */

int hvd_task_result(hvd_task *t, hvd_result_msg *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&t->mu);
    if (!t->has_result) {
        pthread_mutex_unlock(&t->mu);
        out->rank = -1;
        out->index = t->cfg.index;
        return 0;
    }
    /* A deep copy through the codec: the one place that knows the message's layout. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = hvd_msg_pack(&pk, &hvd_result_desc, &t->result);
    pthread_mutex_unlock(&t->mu);
    if (rc == 0) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        rc = msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS
                 ? hvd_msg_unpack(&u.data, &hvd_result_desc, out, NULL)
                 : -1;
        msgpack_unpacked_destroy(&u);
    }
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

uint16_t hvd_task_port(const hvd_task *t) {
    return hvd_server_port(t->srv);
}

/* ---- Stop ------------------------------------------------------------------------------------ */

/* Runs fn on the loop (or here if the loop is gone). */
static void on_loop(hvd_task *t, hvd_loop_fn fn) {
    if (hvd_loop_post(hvd_server_loop(t->srv), fn, t) != 0) fn(t);
}

/* Stop, first: refuses new commands and probes, and ends the probe thread. */
static void begin_stop(hvd_task *t) {
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    bool probe = t->probe_running;
    t->probe_running = false;
    pthread_mutex_unlock(&t->mu);
    atomic_store(&t->probe_cancel, true);
    if (probe) pthread_join(t->probe_thread, NULL);
}

/* Stop, with mu held: a command still running is aborted; its exit code is then still
 * answered. */
static void end_command_locked(hvd_task *t) {
    if (!t->started || t->ended) return;
    pthread_mutex_unlock(&t->mu);
    on_loop(t, task_loop_abort);
    pthread_mutex_lock(&t->mu);
    int64_t deadline = hvd_now_ms() + t->cfg.grace_ms + TASK_END_SLACK_MS;
    while (!t->ended && task_wait_until(t, deadline)) {
    }
    if (!t->ended)
        task_log(t, HVD_LOG_WARN, "the command has not ended %d ms after the abort",
                 t->cfg.grace_ms + TASK_END_SLACK_MS);
}

/* Stop, with mu held: late WAIT_EXIT calls (a sibling reconnecting) are answered for the
 * minimum lifetime, or until the driver shuts the job down: then every task ends, nobody
 * needs the code. */
static void linger_locked(hvd_task *t) {
    if (!t->ended) return;
    int64_t until = t->ended_ms + t->cfg.min_lifetime_ms;
    while (!t->job_over && task_wait_until(t, until)) {
    }
}

/* Stop: the loop fails (or answers) every held call; waits up to QUIESCE_MS for it. */
static void quiesce(hvd_task *t) {
    on_loop(t, task_loop_quiesce);
    pthread_mutex_lock(&t->mu);
    int64_t deadline = hvd_now_ms() + QUIESCE_MS;
    while (!t->loop_quiesced && task_wait_until(t, deadline)) {
    }
    pthread_mutex_unlock(&t->mu);
}

void hvd_task_abort(hvd_task *t) {
    if (!t) return;
    task_request_abort(t, ABORT_USER, "hvd_task_abort was called");
    /* The driver hears it now, not when the command has ended and the task is gone: the first
     * part of a job to fail is the one the driver names. */
    task_watch_ending(t, "it was told to stop (a signal to hvd-task, or its executor ending it)");
}

void hvd_task_stop(hvd_task *t) {
    if (!t) return;
    begin_stop(t);
    pthread_mutex_lock(&t->mu);
    end_command_locked(t);
    linger_locked(t);
    pthread_mutex_unlock(&t->mu);
    task_notes_stop(t);
    task_watch_stop(t);
    quiesce(t);
    hvd_server_stop(t->srv);
    t->loop_stopping = true;
    task_log(t, HVD_LOG_DEBUG, "stopped");
    task_free(t);
}
