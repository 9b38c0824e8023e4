/* A shared-object entry point for the end-to-end tests: its result says where the rank ran.
 * The argument "fail=R" makes rank R fail at once with an error text. "sleep=S" makes every
 * other rank sleep S seconds in the entry ("sleep=S:R": only rank R); while a rank sleeps, and once
 * it returns, it says so in $HVD_E2E_DIR/state.<rank> ("sleeping", then "done") when that variable
 * is set (the fault-injection tests watch these files). "die_after=R" makes rank R SIGKILL itself
 * as its process exits, after hvd-exec reported its result (a rank lost while finishing). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd/entry.h"
#include "probe.h"

int probe_entry(const hvd_entry_ctx *ctx, hvd_entry_result *out);

static void probe_state(int rank, const char *state) {
    const char *dir = getenv("HVD_E2E_DIR");
    if (!dir || !*dir) return;
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/state.%d", dir, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs(state, f);
    fclose(f);
    rename(tmp, path);
}

/* "sleep=S" or "sleep=S:R": sleeps S seconds (on rank R only, if given). */
static void probe_sleep(const char *arg, int rank) {
    const char *s = strstr(arg, "sleep=");
    if (!s) return;
    char *end;
    double secs = strtod(s + 6, &end);
    if (*end == ':' && atoi(end + 1) != rank) return;
    if (secs <= 0) return;
    probe_state(rank, "sleeping");
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void probe_die(void) {
    raise(SIGKILL);
}

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
    probe_sleep(arg, ctx->rank);
    const char *die = strstr(arg, "die_after=");
    if (die && atoi(die + 10) == ctx->rank) atexit(probe_die);
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
    probe_state(ctx->rank, "done");
    return 0;
}
