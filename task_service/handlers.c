/* The task service's request handlers (include/hvd/proto.h, "task service requests"). They
 * run on the server's loop thread and never block: long-polls and subscriptions are held
 * calls with cancel callbacks; the one exception is RUN_COMMAND's fork of the keeper
 * process, which takes a few system calls. */
#include "handlers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/proc.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "held.h"
#include "notes.h"
#include "probe.h"
#include "pump.h"
#include "state.h"

#define PROBE_ADDR_MS 2000 /* budget to reach one peer address */

/* ---- RUN_COMMAND ----------------------------------------------------------------------------- */

/* Whether a variable's value must not appear in logs. */
static bool secret_name(const char *name, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++)
        if (strncmp(name + i, "SECRET", 6) == 0) return true;
    return false;
}

/* Logs (debug) what the request changes in the environment, secrets masked. */
static void log_env(hvd_task *t, const hvd_run_msg *req, char *const *envp) {
    char line[1024];
    size_t n = 0, count = 0;
    while (envp[count])
        count++;
    n += (size_t)snprintf(line, sizeof line, "command environment: %zu variables", count);
    for (size_t i = 0; i < req->env_set.n && n < sizeof line; i++) {
        const char *s = req->env_set.v[i];
        const char *eq = strchr(s, '=');
        size_t nl = eq ? (size_t)(eq - s) : strlen(s);
        if (secret_name(s, nl))
            n += (size_t)snprintf(line + n, sizeof line - n, "%s %.*s=<hidden>", i ? "," : "; set",
                                  (int)nl, s);
        else
            n += (size_t)snprintf(line + n, sizeof line - n, "%s %s", i ? "," : "; set", s);
    }
    for (size_t i = 0; i < req->env_unset.n && n < sizeof line; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s %s", i ? "," : "; unset",
                              req->env_unset.v[i]);
    task_log(t, HVD_LOG_DEBUG, "%s", line);
}

/* How many variables point Open MPI at a command's private directory (command_env). */
#define SHM_DIR_VARS 4

/* The command's environment: the base with the request's sets, then its unsets. */
static char **command_env(hvd_task *t, const hvd_run_msg *req, hvd_err *err) {
    /* Made only now: tasks that never run a command (siblings) leave nothing in /dev/shm. */
    task_make_shm_dir(t);
    size_t n = req->env_set.n + req->env_unset.n;
    hvd_env_change *ch = calloc(n + SHM_DIR_VARS, sizeof *ch);
    char **names = calloc(req->env_set.n ? req->env_set.n : 1, sizeof *names);
    char **envp = NULL;
    if (!ch || !names) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < req->env_set.n; i++) {
        const char *s = req->env_set.v[i];
        const char *eq = strchr(s, '=');
        if (!eq || eq == s) {
            hvd_err_set(err, HVD_E_INVALID, "environment entry '%.64s' is not NAME=VALUE", s);
            goto out;
        }
        names[i] = strndup(s, (size_t)(eq - s));
        if (!names[i]) {
            hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
            goto out;
        }
        ch[i] = (hvd_env_change){names[i], eq + 1};
    }
    for (size_t i = 0; i < req->env_unset.n; i++)
        ch[req->env_set.n + i] = (hvd_env_change){req->env_unset.v[i], NULL};
    /* First, so that a request naming it wins. */
    /* Open MPI names its session directory (under the temp dir) and its shared-memory files
     * (in /dev/shm) after the real hostname: two host hashes of one machine would share them
     * and crash (hwloc's shared topology, the vader segments; Open MPI 5's sm segments, seen
     * crashing in mca_btl_sm_poll_handle_frag). Both go to the private dir, under the names
     * of Open MPI 4 (ORTE, vader) and 5 (PRRTE, sm); MPICH names its files uniquely. */
    if (t->shm_dir) {
        static const char *const names_for_dir[SHM_DIR_VARS] = {
            "OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_orte_tmpdir_base",
            "OMPI_MCA_btl_sm_backing_directory", "PRTE_MCA_prte_tmpdir_base"};
        memmove(ch + SHM_DIR_VARS, ch, n * sizeof *ch);
        for (size_t i = 0; i < SHM_DIR_VARS; i++)
            ch[i] = (hvd_env_change){names_for_dir[i], t->shm_dir};
        n += SHM_DIR_VARS;
    }
    envp = hvd_env_build(t->cmd_env, ch, n, err);
out:
    if (names)
        for (size_t i = 0; i < req->env_set.n; i++)
            free(names[i]);
    free(names);
    free(ch);
    return envp;
}

/* Fails call and returns true if this service takes no command now. */
static bool refuse_run(hvd_task *t, hvd_call *call, const hvd_run_msg *req) {
    pthread_mutex_lock(&t->mu);
    bool stopping = t->stopping;
    pthread_mutex_unlock(&t->mu);
    if (!req->command || !*req->command)
        hvd_call_fail(call, HVD_E_INVALID, "no command given to %s", t->name);
    else if (t->cmd && t->cfg.elastic && !t->ended)
        hvd_call_fail(call, HVD_E_STATE,
                      "%s still runs the command of the last launch: stop it first "
                      "(STOP_COMMAND)",
                      t->name);
    else if (t->cmd && !t->cfg.elastic)
        hvd_call_fail(call, HVD_E_STATE, "%s already ran a command", t->name);
    else if (t->refused)
        hvd_call_fail(call, HVD_E_STATE,
                      "%s was aborted before a command started: the job is being torn down",
                      t->name);
    else if (stopping)
        hvd_call_fail(call, HVD_E_SHUTDOWN, "%s is stopping", t->name);
    else
        return false;
    return true;
}

/* Starts the command with envp and puts its output and exit on the loop. Returns true, or
 * false with call failed and no command left (t->cmd NULL). */
static bool start_command(hvd_task *t, hvd_call *call, const hvd_run_msg *req, char **envp) {
    hvd_err err;
    hvd_proc_spec spec = {.command = req->command,
                          .envp = envp,
                          .cwd = t->work_dir,
                          .grace_ms = t->cfg.grace_ms,
                          .cleanup_dir = t->shm_dir};
    t->cmd = hvd_proc_start(&spec, &err);
    if (!t->cmd) {
        task_log(t, HVD_LOG_ERROR, "%s", err.msg);
        hvd_call_fail(call, err.code, "%s: %s", t->name, err.msg);
        return false;
    }
    if (pump_start(t, req->prefix_output, req->timestamps, &err) != 0) {
        /* The command runs but cannot be watched (the loop is out of resources): take it
         * down at once, so that it counts as never started. This blocks the loop for up to
         * the grace period, on a path that should never be taken. */
        task_log(t, HVD_LOG_ERROR, "cannot watch the command: %s", err.msg);
        pump_stop(t);
        hvd_proc_free(t->cmd);
        t->cmd = NULL;
        hvd_call_fail(call, HVD_E_INTERNAL, "%s cannot watch the command: %s", t->name, err.msg);
        return false;
    }
    return true;
}

/* The command runs: tells hvd_task_run, lets the held ATTACH calls receive its output, and
 * answers the request (with attach, holds it as a subscriber too). */
static void command_started(hvd_task *t, hvd_call *call, const hvd_run_msg *req) {
    pthread_mutex_lock(&t->mu);
    t->started = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    task_log(t, HVD_LOG_INFO, "running the command (pid %d) for %s: %.300s%s",
             (int)hvd_proc_pid(t->cmd), hvd_call_peer_host(call), req->command,
             strlen(req->command) > 300 ? "..." : "");
    held_activate_subs(t);
    if (!t->cfg.elastic) task_note(t, HVD_TASK_EV_COMMAND_STARTED, 0, 0, NULL);
    if (req->attach)
        held_add_sub(t, call, true, true);
    else
        hvd_call_reply(call, &hvd_ack_desc, NULL);
}

/* Runs the request's command in its environment; answers call either way. */
static void run_command(hvd_task *t, hvd_call *call, const hvd_run_msg *req) {
    hvd_err err;
    char **envp = command_env(t, req, &err);
    if (!envp) {
        hvd_call_fail(call, err.code, "%s: %s", t->name, err.msg);
        return;
    }
    if (t->cfg.log_level >= HVD_LOG_DEBUG) log_env(t, req, envp);
    if (start_command(t, call, req, envp)) command_started(t, call, req);
    hvd_env_free(envp);
}

static void on_run(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_task *t = user;
    hvd_run_msg req;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_run_desc, &req, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    if (!refuse_run(t, call, &req)) {
        if (t->cmd) pump_recycle(t); /* elastic: the last command ended */
        run_command(t, call, &req);
    }
    hvd_msg_free(&hvd_run_desc, &req);
}

/* ---- Subscriptions and exit codes ------------------------------------------------------------ */

static void on_attach(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    pthread_mutex_lock(&t->mu);
    bool stopping = t->stopping;
    pthread_mutex_unlock(&t->mu);
    if (t->ended) {
        hvd_exit_msg ex = {.exit_code = t->exit_code, .signal = t->exit_signal};
        hvd_call_reply(call, &hvd_exit_desc, &ex);
    } else if (t->refused) {
        hvd_call_fail(call, HVD_E_STATE, "%s was aborted before a command started", t->name);
    } else if (stopping || t->loop_stopping) {
        hvd_call_fail(call, HVD_E_SHUTDOWN, "%s is stopping", t->name);
    } else {
        held_add_sub(t, call, t->cmd != NULL, false);
        task_log(t, HVD_LOG_DEBUG, "%s attached%s", hvd_call_peer_host(call),
                 t->cmd ? "" : " (waiting for a command)");
    }
}

static void on_wait_exit(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    if (t->ended) {
        hvd_exit_msg ex = {.exit_code = t->exit_code, .signal = t->exit_signal};
        hvd_call_reply(call, &hvd_exit_desc, &ex);
        return;
    }
    if (t->refused) {
        hvd_call_fail(call, HVD_E_STATE, "%s was aborted before a command started", t->name);
        return;
    }
    if (t->loop_stopping) {
        hvd_call_fail(call, HVD_E_SHUTDOWN, "%s is stopping", t->name);
        return;
    }
    held_add_waiter(t, call, false);
}

static void on_abort(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    task_log(t, HVD_LOG_INFO, "abort requested by %s", hvd_call_peer_host(call));
    hvd_call_reply(call, &hvd_ack_desc, NULL);
    if (t->cmd)
        task_loop_abort(t);
    else if (!t->cfg.elastic) /* elastic: nothing runs yet, and a command may still come */
        task_request_abort(t, ABORT_REQUEST, "an abort request came before any command");
}

static void on_status(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    pthread_mutex_lock(&t->mu);
    hvd_status_msg st = {.started = t->started, .ended = t->ended, .exit_code = t->exit_code};
    pthread_mutex_unlock(&t->mu);
    hvd_call_reply(call, &hvd_status_desc, &st);
}

/* ---- Elastic: stopping the command, keeping commits ------------------------------------------ */

/* Fails call and returns true unless this is an elastic task service. */
static bool not_elastic(hvd_task *t, hvd_call *call) {
    if (t->cfg.elastic) return false;
    hvd_call_fail(call, HVD_E_STATE, "%s is not part of an elastic job (hvd-task --elastic)",
                  t->name);
    return true;
}

static void on_stop_command(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    if (not_elastic(t, call)) return;
    if (!t->cmd || t->ended) {
        hvd_status_msg st = {
            .started = t->cmd != NULL, .ended = t->ended, .exit_code = t->exit_code};
        hvd_call_reply(call, &hvd_status_desc, &st);
        return;
    }
    task_log(t, HVD_LOG_INFO, "%s stops the command", hvd_call_peer_host(call));
    held_add_waiter(t, call, true);
    task_loop_kill(t);
}

static void on_commit_state(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_task *t = user;
    hvd_commit_msg m;
    hvd_err err;
    if (not_elastic(t, call)) return;
    if (hvd_msg_unpack(body, &hvd_commit_state_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    if (m.id == 0 || m.state.len > HVD_ELASTIC_STATE_MAX) {
        hvd_call_fail(call, HVD_E_INVALID, "a commit needs an id above 0 and at most %u bytes",
                      HVD_ELASTIC_STATE_MAX);
    } else {
        if (m.id >= t->commit.id) { /* a late older commit never replaces a newer one */
            m.size = m.state.len;
            hvd_msg_free(&hvd_commit_desc, &t->commit);
            t->commit = m;
            memset(&m, 0, sizeof m);
            task_log(t, HVD_LOG_DEBUG, "commit %llu kept (%llu bytes)",
                     (unsigned long long)t->commit.id, (unsigned long long)t->commit.size);
        }
        hvd_call_reply(call, &hvd_ack_desc, NULL);
    }
    hvd_msg_free(&hvd_commit_state_desc, &m);
}

static void on_latest_commit(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    if (not_elastic(t, call)) return;
    hvd_commit_msg m = {.id = t->commit.id, .size = t->commit.size};
    hvd_call_reply(call, &hvd_commit_desc, &m);
}

static void on_fetch_commit(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_task *t = user;
    hvd_commit_ref_msg req;
    hvd_err err;
    if (not_elastic(t, call)) return;
    if (hvd_msg_unpack(body, &hvd_fetch_commit_desc, &req, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    if (req.id == 0 || req.id != t->commit.id)
        hvd_call_fail(call, HVD_E_NOT_FOUND, "%s holds commit %llu, not %llu", t->name,
                      (unsigned long long)t->commit.id, (unsigned long long)req.id);
    else
        hvd_call_reply(call, &hvd_commit_desc, &t->commit);
}

/* ---- Resources and results ------------------------------------------------------------------- */

static void on_resources(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    hvd_task_info info;
    task_info(t, &info);
    hvd_call_reply(call, &hvd_task_info_desc, &info);
}

static void on_register_result(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_task *t = user;
    hvd_result_msg r;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_register_result_desc, &r, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    if (r.index != t->cfg.index) {
        hvd_call_fail(call, HVD_E_INVALID, "a result for task %u was sent to %s", r.index, t->name);
        hvd_msg_free(&hvd_register_result_desc, &r);
        return;
    }
    r.present = true;
    pthread_mutex_lock(&t->mu);
    hvd_msg_free(&hvd_result_desc, &t->result);
    t->result = r; /* replaces an earlier one: idempotent */
    t->has_result = true;
    pthread_mutex_unlock(&t->mu);
    task_log(t, HVD_LOG_INFO, "rank %d registered its result (status %d, %zu bytes%s)", r.rank,
             r.status, r.result.len, r.error ? ", with an error" : "");
    hvd_call_reply(call, &hvd_ack_desc, NULL);
}

static void on_get_result(hvd_call *call, const msgpack_object *body, void *user) {
    (void)body;
    hvd_task *t = user;
    pthread_mutex_lock(&t->mu);
    if (t->has_result) {
        hvd_call_reply(call, &hvd_result_desc, &t->result);
    } else {
        hvd_result_msg none = {.rank = -1, .index = t->cfg.index, .present = false};
        hvd_call_reply(call, &hvd_result_desc, &none);
    }
    pthread_mutex_unlock(&t->mu);
}

/* ---- REGISTRATION_DONE and probing ----------------------------------------------------------- */

/* Logs how many of the tasks it probed the probe reached, and which ones it did not. */
static void log_reach(hvd_task *t, const hvd_reachable_msg *rep, int64_t t0) {
    size_t reached = 0;
    char missing[256] = "";
    const hvd_reach *r = rep->reach.v;
    for (size_t i = 0; i < rep->reach.n; i++) {
        if (r[i].addrs.n > 0) {
            reached++;
        } else {
            size_t used = strlen(missing);
            if (used + 16 < sizeof missing)
                snprintf(missing + used, sizeof missing - used, "%s%u", used ? "," : "", r[i].to);
        }
    }
    if (reached < rep->reach.n)
        task_log(t, HVD_LOG_WARN,
                 "reached %zu of the %zu tasks probed; none of the addresses of %s", reached,
                 rep->reach.n, missing);
    else
        task_log(t, HVD_LOG_INFO, "reached all %zu tasks probed in %lld ms", rep->reach.n,
                 (long long)(hvd_now_ms() - t0));
}

/* Sends rep to the driver, retried with backoff while the driver cannot be reached, until
 * the start timeout passes or hvd_task_stop cancels the probe. */
static void report_reach(hvd_task *t, const hvd_reachable_msg *rep) {
    hvd_err err;
    int64_t deadline = hvd_now_ms() + t->cfg.start_timeout_ms;
    int backoff = TASK_BACKOFF_FIRST_MS, sent = 0;
    while (!atomic_load(&t->probe_cancel)) {
        hvd_client *d = task_driver_connect(t, task_attempt_ms(deadline), &err);
        if (d) {
            sent = hvd_client_call(d, &hvd_reachable_desc, rep, &hvd_ack_desc, NULL, 0,
                                   HVD_CALL_RETRY, &err) == 0;
            hvd_client_close(d);
            if (sent || (err.code != HVD_E_IO && err.code != HVD_E_TIMEOUT)) break;
        }
        if (hvd_now_ms() + backoff >= deadline) break;
        task_sleep_ms(backoff);
        backoff = backoff * 2 > TASK_BACKOFF_MAX_MS ? TASK_BACKOFF_MAX_MS : backoff * 2;
    }
    if (!sent && !atomic_load(&t->probe_cancel))
        task_log(t, HVD_LOG_ERROR, "cannot report reachability to the driver: %s", err.msg);
}

/* Probes the other tasks and reports what was reached to the driver (own thread). */
static void *probe_main(void *arg) {
    hvd_task *t = arg;
    hvd_reachable_msg rep;
    hvd_err err;
    int64_t t0 = hvd_now_ms();
    /* peers is not written while this thread runs (see on_registration_done). */
    if (probe_peers(&t->cfg.secret, t->cfg.index, &t->peers.tasks, PROBE_ADDR_MS, &t->probe_cancel,
                    &rep, &err) == 0) {
        log_reach(t, &rep, t0);
        report_reach(t, &rep);
        hvd_msg_free(&hvd_reachable_desc, &rep);
    } else {
        task_log(t, HVD_LOG_ERROR, "cannot probe the other tasks: %s", err.msg);
    }
    atomic_store(&t->probe_finished, true);
    return NULL;
}

static void on_registration_done(hvd_call *call, const msgpack_object *body, void *user) {
    hvd_task *t = user;
    hvd_peers_msg req;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_registration_done_desc, &req, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    hvd_call_reply(call, &hvd_ack_desc, NULL);
    size_t ntasks = req.tasks.n;
    bool probe = req.probe;
    pthread_mutex_lock(&t->mu);
    bool again = t->registration_done;
    t->registration_done = true;
    pthread_cond_broadcast(&t->cv);
    int rc = -1;
    if (probe && !t->stopping) {
        /* A repeated notice (the driver retried, say after losing our report) probes again
         * once the last probe is over; while one runs it is ignored. */
        if (t->probe_running && atomic_load(&t->probe_finished)) {
            pthread_join(t->probe_thread, NULL); /* returns at once: the thread is done */
            t->probe_running = false;
        }
        if (!t->probe_running) {
            hvd_msg_free(&hvd_registration_done_desc, &t->peers);
            t->peers = req;
            memset(&req, 0, sizeof req);
            atomic_store(&t->probe_finished, false);
            rc = pthread_create(&t->probe_thread, NULL, probe_main, t);
            t->probe_running = rc == 0;
        }
    }
    pthread_mutex_unlock(&t->mu);
    hvd_msg_free(&hvd_registration_done_desc, &req);
    if (!probe)
        task_log(t, HVD_LOG_INFO, "every task registered; nothing to probe here");
    else if (rc == 0)
        task_log(t, HVD_LOG_INFO, "every task registered; probing %zu task(s) for the driver%s",
                 ntasks, again ? " (again)" : "");
    else if (!again)
        task_log(t, HVD_LOG_ERROR, "every task registered, but the probe thread did not start");
}

/* ---- Registration ---------------------------------------------------------------------------- */

int task_handlers_register(hvd_task *t) {
    static const struct {
        uint32_t type;
        hvd_handler_fn fn;
    } table[] = {
        {HVD_MSG_REGISTRATION_DONE, on_registration_done},
        {HVD_MSG_RUN_COMMAND, on_run},
        {HVD_MSG_ATTACH, on_attach},
        {HVD_MSG_ABORT, on_abort},
        {HVD_MSG_WAIT_EXIT, on_wait_exit},
        {HVD_MSG_COMMAND_STATUS, on_status},
        {HVD_MSG_RESOURCES, on_resources},
        {HVD_MSG_REGISTER_RESULT, on_register_result},
        {HVD_MSG_GET_RESULT, on_get_result},
        {HVD_MSG_STOP_COMMAND, on_stop_command},
        {HVD_MSG_COMMIT_STATE, on_commit_state},
        {HVD_MSG_LATEST_COMMIT, on_latest_commit},
        {HVD_MSG_FETCH_COMMIT, on_fetch_commit},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (hvd_server_handle(t->srv, table[i].type, table[i].fn, t) != 0) return -1;
    return 0;
}
