/* hvd-rsh's RPC mode (DESIGN.md section 2, step 5): ask the driver for the lowest task index
 * of a host hash, connect to that task service, run the command there with /bin/sh -c and
 * stay attached like ssh (output streamed back, a signal aborts the remote command, the
 * remote exit code returned). */
#ifndef HVD_RSH_RPC_H
#define HVD_RSH_RPC_H

#include "hvd/error.h"

/* Outcomes of hvd_rsh_rpc_run besides 0 (the command ran and ended). */
#define HVD_RSH_NOT_STARTED  -1 /* failed before the command started */
#define HVD_RSH_UNKNOWN_HOST -2 /* the driver knows no task for this host hash */
#define HVD_RSH_LOST         -3 /* the connection broke while the command ran */

/* Runs command on the task of host_hash. Driver addresses and the secret come from the
 * environment (HVD_DRIVER_ADDRS, HVD_SECRET / HVD_SECRET_FILE). When interrupt_fd becomes
 * readable the remote command is aborted (and its exit code still awaited). Returns 0 with
 * *exit_code, or one of the outcomes above with err. */
int hvd_rsh_rpc_run(const char *host_hash, const char *command, int interrupt_fd, int verbose,
                    int *exit_code, hvd_err *err);

#endif
