/* A shared-object entry point for the end-to-end tests: its result says where the rank ran.
 * The argument "fail=R" makes rank R fail with an error text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/entry.h"
#include "probe.h"

int probe_entry(const hvd_entry_ctx *ctx, hvd_entry_result *out);

int probe_entry(const hvd_entry_ctx *ctx, hvd_entry_result *out) {
    char arg[256] = "";
    size_t n = ctx->arg_len < sizeof arg - 1 ? ctx->arg_len : sizeof arg - 1;
    memcpy(arg, ctx->arg, n);
    const char *fail = strstr(arg, "fail=");
    if (fail && atoi(fail + 5) == ctx->rank) {
        snprintf(out->error, sizeof out->error, "rank %d failed on purpose (entry arg '%s')",
                 ctx->rank, arg);
        return 3;
    }
    int depth;
    int anc = probe_task_ancestor(&depth);
    char gpus[128] = "";
    for (size_t i = 0; i < ctx->ngpus; i++) {
        size_t used = strlen(gpus);
        snprintf(gpus + used, sizeof gpus - used, "%s%s", i ? "," : "", ctx->gpus[i]);
    }
    char *buf = malloc(512);
    const char *host = getenv("HOROVOD_HOSTNAME");
    int len = snprintf(buf, 512,
                       "rank=%d size=%d local_rank=%d task=%d gpus=%s host=%s "
                       "ancestor_task=%d",
                       ctx->rank, ctx->size, ctx->local_rank, ctx->task_index, gpus,
                       host ? host : "", anc);
    out->data = (uint8_t *)buf;
    out->len = (size_t)len;
    return 0;
}
