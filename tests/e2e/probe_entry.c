/* A shared-object entry point for the end-to-end tests: its result says where the rank ran.
 * The argument "fail=R" makes rank R fail at once with an error text. "sleep=S" makes every
 * other rank sleep S seconds in the entry ("sleep=S:R": only rank R); while a rank sleeps, and once
 * it returns, it says so in $HVD_E2E_DIR/state.<rank> ("sleeping", then "done") when that variable
 * is set (the fault-injection tests watch these files). "die_after=R" makes rank R SIGKILL itself
 * as its process exits, after hvd-exec reported its result (a rank lost while finishing).
 * "leave=S" makes every rank leave a process behind before it returns: a double-forked
 * `sleep S` in a session of its own, holding the rank's output and its process mark (its pid in
 * $HVD_E2E_DIR/left.<rank> when that variable is set); odd ranks' ignores SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd/entry.h"
#include "probe.h"

int probe_entry(const hvd_entry_ctx *ctx, hvd_entry_result *out);

/* Writes text to $HVD_E2E_DIR/<name> (atomically), when that variable is set. */
static void probe_write(const char *name, const char *text) {
    const char *dir = getenv("HVD_E2E_DIR");
    if (!dir || !*dir) return;
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

static void probe_state(int rank, const char *state) {
    char name[32];
    snprintf(name, sizeof name, "state.%d", rank);
    probe_write(name, state);
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

/* "leave=S": `sleep S` as a grandchild in its own session (on odd ranks deaf to SIGTERM); the
 * rank does not wait for it. */
static void probe_leave(const char *arg, int rank) {
    const char *s = strstr(arg, "leave=");
    if (!s) return;
    unsigned secs = (unsigned)atoi(s + 6);
    pid_t child = fork();
    if (child != 0) {
        if (child > 0) (void)waitpid(child, NULL, 0);
        return;
    }
    setsid();
    pid_t left = fork();
    if (left == 0) {
        char text[16];
        snprintf(text, sizeof text, "%u", secs);
        if (rank % 2) signal(SIGTERM, SIG_IGN); /* kept across exec */
        execlp("sleep", "sleep", text, (char *)NULL);
        _exit(127);
    }
    char pid[32], name[32];
    snprintf(pid, sizeof pid, "%d", (int)left);
    snprintf(name, sizeof name, "left.%d", rank);
    probe_write(name, pid);
    _exit(0);
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
    probe_leave(arg, ctx->rank);
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
