/* Task-to-task reachability (probe.c). Knows nothing of hvd_task: it takes the secret and
 * the peers, and returns what it reached. Private to task_service/. */
#ifndef HVD_TASK_PROBE_H
#define HVD_TASK_PROBE_H

#include <stdatomic.h>
#include <stdint.h>

#include "hvd/error.h"
#include "hvd/message.h"
#include "hvd/net.h"
#include "hvd/proto.h"

/* Probes every task of `tasks` (hvd_task_info) other than `self` at each of its addresses
 * in parallel: an address counts as reached if the peer answers a PING and saw us coming
 * from one of our addresses on the interface of the same name (Horovod's match_intf).
 * Fills out (free with hvd_msg_free(&hvd_reachable_desc, out)). Stops early when *cancel
 * becomes true. Returns 0, or -1 with err (out of memory, no local address). */
int probe_peers(const hvd_secret *secret, uint32_t self, const hvd_list *tasks, int timeout_ms,
                atomic_bool *cancel, hvd_reachable_msg *out, hvd_err *err);

#endif
