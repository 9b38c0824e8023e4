/* hvd-rsh's RPC mode: run the command in the task service that stands for a host hash. */
#include "rsh_rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"

typedef struct attach_state {
    int out_fd, err_fd;
    bool out_broken, err_broken;
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
    (void)user;
    hvd_err err;
    /* The abort travels on the same connection; the stream then ends with the exit code. */
    if (hvd_client_send(c, &hvd_abort_desc, NULL, &err) != 0)
        fprintf(stderr, "hvd-rsh: could not ask the task to abort: %s\n", err.msg);
}

int hvd_rsh_rpc_run(const char *host, const char *command, int interrupt_fd, int verbose,
                    int *exit_code, hvd_err *err) {
    hvd_secret secret;
    hvd_client *driver = hvd_driver_connect_env(&secret, err);
    if (!driver) return HVD_RSH_NOT_STARTED;
    int rc = HVD_RSH_NOT_STARTED;
    hvd_client *task = NULL;
    hvd_host_msg hq = {.host_hash = (char *)host};
    hvd_indices_msg hi = {0};
    if (hvd_client_call(driver, &hvd_host_indices_desc, &hq, &hvd_indices_desc, &hi, 0,
                        HVD_CALL_RETRY, err) != 0) {
        rc = err->code == HVD_E_NOT_FOUND ? HVD_RSH_UNKNOWN_HOST : HVD_RSH_NOT_STARTED;
        goto out;
    }
    if (hi.indices.n == 0) {
        hvd_err_set(err, HVD_E_NOT_FOUND, "the driver lists no task for host hash %s", host);
        rc = HVD_RSH_UNKNOWN_HOST;
        goto out;
    }
    uint32_t index = hi.indices.v[0];
    task = hvd_task_connect(driver, &secret, index, err);
    /* The driver is not needed while the command runs: a job of H hosts would otherwise hold
     * H idle connections at the driver for its whole length. */
    hvd_client_close(driver);
    driver = NULL;
    if (!task) {
        hvd_err_prefix(err, "task %u: ", index);
        goto out;
    }
    if (verbose) {
        char as[HVD_HOST_MAX + 16];
        fprintf(stderr, "hvd-rsh: host %s is task %u at %s\n", host, index,
                hvd_addr_str(hvd_client_addr(task), as, sizeof as));
    }
    hvd_run_msg run = {.command = (char *)command, .attach = true};
    hvd_exit_msg ex;
    attach_state st = {.out_fd = STDOUT_FILENO, .err_fd = STDERR_FILENO};
    /* No timeout on silence: orted may print nothing for the whole job. TCP keepalive and the
     * task's lifeline notice a dead peer. */
    if (hvd_client_call_stream(task, &hvd_run_desc, &run, on_chunk, &st, interrupt_fd, on_interrupt,
                               &hvd_exit_desc, &ex, -1, err) != 0) {
        /* A refusal (state, invalid) means the command never started; anything else may have
         * happened mid-command. */
        rc = (err->code == HVD_E_STATE || err->code == HVD_E_INVALID || err->code == HVD_E_PROTOCOL)
                 ? HVD_RSH_NOT_STARTED
                 : HVD_RSH_LOST;
        hvd_err_prefix(err, "task %u: ", index);
        goto out;
    }
    *exit_code = ex.exit_code;
    rc = 0;
out:
    hvd_msg_free(&hvd_indices_desc, &hi);
    hvd_client_close(task);
    hvd_client_close(driver);
    hvd_secret_wipe(&secret);
    return rc;
}
