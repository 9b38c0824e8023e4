/* hvd-rsh's RPC mode: run the command in the task service that stands for a host hash. */
#include "rsh_rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"
#include "common/sig.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"

typedef struct attach_state {
    int out_fd, err_fd;
    bool out_broken, err_broken;
    int sig_fd;         /* the signal pipe (common/sig.h) */
    hvd_client *driver; /* ... to tell at once when someone else's signal stops us */
    const hvd_agent_report_msg *rep;
    bool stopped;      /* mpirun's signal made us ask the task to abort */
    char outside[128]; /* ... or someone else's: what happened, for the driver */
} attach_state;

/* Copies a chunk of the command's output to our stdout or stderr. A reader that went away
 * (EPIPE) only silences that stream: a broken local pipe must not kill the remote command. */
static int on_chunk(uint32_t channel, const uint8_t *data, size_t len, void *user) {
    attach_state *st = user;
    bool to_stderr = channel == HVD_CHANNEL_STDERR;
    bool *broken = to_stderr ? &st->err_broken : &st->out_broken;
    if (!*broken && hvd_write_all(to_stderr ? st->err_fd : st->out_fd, data, len) != 0)
        *broken = true;
    return 0;
}

static void on_interrupt(hvd_client *c, void *user) {
    attach_state *st = user;
    hvd_err err;
    pid_t from = 0;
    int sig = hvd_signals_next_from(st->sig_fd, &from);
    if (from > 0 && from != getppid()) {
        snprintf(st->outside, sizeof st->outside,
                 "stopped by signal %d from process %d (not mpirun) while orted ran", sig,
                 (int)from);
        /* Now, not once orted has gone: mpirun may kill us before that. */
        hvd_agent_report_msg now = *st->rep;
        now.pid = (uint32_t)getpid();
        now.started = true;
        now.error = st->outside;
        (void)hvd_client_send(st->driver, &hvd_agent_report_desc, &now, &err);
    } else {
        st->stopped = true;
    }
    /* The abort travels on the same connection; the stream then ends with the exit code. */
    if (hvd_client_send(c, &hvd_abort_desc, NULL, &err) != 0)
        fprintf(stderr, "hvd-rsh: could not ask the task to abort: %s\n", err.msg);
}

/* The driver's watch on this agent: AGENT_WATCH is held on the driver connection for as long
 * as we run, so that the driver learns of our death (the connection closes without a word),
 * and AGENT_REPORT tells it how the command ended before we close it (DESIGN.md: the driver
 * names the part of a job that failed). Both are best effort: a driver that does not know
 * them fails them, which is ignored. */
static void agent_watch(hvd_client *driver, const char *host) {
    hvd_agent_msg w = {.host_hash = (char *)host, .pid = (uint32_t)getpid()};
    hvd_err err;
    (void)hvd_client_send(driver, &hvd_agent_watch_desc, &w, &err);
}

static void agent_report(hvd_client *driver, hvd_agent_report_msg *rep, int rc,
                         const hvd_err *err) {
    rep->pid = (uint32_t)getpid();
    rep->lost = rc == HVD_RSH_LOST;
    if (rc != 0 && rc != HVD_RSH_UNKNOWN_HOST) rep->error = (char *)err->msg;
    hvd_err e;
    (void)hvd_client_call(driver, &hvd_agent_report_desc, rep, &hvd_ack_desc, NULL,
                          HVD_AGENT_REPORT_TIMEOUT_MS, 0, &e);
}

/* Finds the host's task, connects to it and runs the command there, attached. Returns 0 with
 * rep's exit fields, or an outcome with err. */
static int run_on_task(hvd_client *driver, const hvd_secret *secret, const char *host,
                       const char *command, int interrupt_fd, int verbose,
                       hvd_agent_report_msg *rep, hvd_err *err) {
    hvd_host_msg hq = {.host_hash = (char *)host};
    hvd_indices_msg hi = {0};
    if (hvd_client_call(driver, &hvd_host_indices_desc, &hq, &hvd_indices_desc, &hi, 0,
                        HVD_CALL_RETRY, err) != 0)
        return err->code == HVD_E_NOT_FOUND ? HVD_RSH_UNKNOWN_HOST : HVD_RSH_NOT_STARTED;
    if (hi.indices.n == 0) {
        hvd_msg_free(&hvd_indices_desc, &hi);
        hvd_err_set(err, HVD_E_NOT_FOUND, "the driver lists no task for host hash %s", host);
        return HVD_RSH_UNKNOWN_HOST;
    }
    uint32_t index = hi.indices.v[0];
    hvd_msg_free(&hvd_indices_desc, &hi);
    rep->index = (int32_t)index;
    hvd_client *task = hvd_task_connect(driver, secret, index, err);
    if (!task) {
        hvd_err_prefix(err, "task %u: ", index);
        return HVD_RSH_NOT_STARTED;
    }
    if (verbose) {
        char as[HVD_HOST_MAX + 16];
        fprintf(stderr, "hvd-rsh: host %s is task %u at %s\n", host, index,
                hvd_addr_str(hvd_client_addr(task), as, sizeof as));
    }
    hvd_run_msg run = {.command = (char *)command, .attach = true};
    hvd_exit_msg ex;
    attach_state st = {.out_fd = STDOUT_FILENO,
                       .err_fd = STDERR_FILENO,
                       .sig_fd = interrupt_fd,
                       .driver = driver,
                       .rep = rep};
    /* No timeout on silence: orted may print nothing for the whole job. TCP keepalive and the
     * task's lifeline notice a dead peer. */
    int rc = 0;
    if (hvd_client_call_stream(task, &hvd_run_desc, &run, on_chunk, &st, interrupt_fd, on_interrupt,
                               &hvd_exit_desc, &ex, -1, err) != 0) {
        /* A refusal (state, invalid) means the command never started; anything else may have
         * happened mid-command. */
        rc = (err->code == HVD_E_STATE || err->code == HVD_E_INVALID || err->code == HVD_E_PROTOCOL)
                 ? HVD_RSH_NOT_STARTED
                 : HVD_RSH_LOST;
        hvd_err_prefix(err, "task %u: ", index);
    } else {
        rep->exit_code = ex.exit_code;
        rep->signal = ex.signal;
    }
    rep->started = rc != HVD_RSH_NOT_STARTED;
    rep->stopped = st.stopped;
    if (st.outside[0] && rc == 0) rep->error = strdup(st.outside); /* freed by the caller */
    hvd_client_close(task);
    return rc;
}

int hvd_rsh_rpc_run(const char *host, const char *command, int interrupt_fd, int verbose,
                    int *exit_code, hvd_err *err) {
    hvd_secret secret;
    hvd_client *driver = hvd_driver_connect_env(&secret, err);
    if (!driver) return HVD_RSH_NOT_STARTED;
    agent_watch(driver, host);
    hvd_agent_report_msg rep = {.host_hash = (char *)host, .index = -1};
    int rc = run_on_task(driver, &secret, host, command, interrupt_fd, verbose, &rep, err);
    if (rc == 0) *exit_code = rep.exit_code;
    char *outside = rep.error;
    agent_report(driver, &rep, rc, err);
    free(outside);
    hvd_client_close(driver);
    hvd_secret_wipe(&secret);
    return rc;
}
