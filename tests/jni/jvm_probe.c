/* A shared-object entry point for the JVM tests (tests/jni, tests/spark): its result says
 * which JVM the rank descends from, so a test can check that each rank runs inside the task
 * service embedded in that JVM (a test JVM, or a Spark executor).
 *
 * Result: "rank=R size=S local_rank=L task=T pid=P jvm=J executor=E gpus=G marker=M" where J
 * is the nearest ancestor whose comm is "java" (-1: none), E is 1 when J's command line names
 * a Spark executor (CoarseGrainedExecutorBackend), G is ctx->gpus joined by commas (the GPUs
 * of the rank's task, maybe empty) and M is $HVD_TEST_MARKER.
 * The argument is a list of words: "fail=R" makes rank R fail with an error text,
 * "sleep=S" makes every rank sleep S seconds first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd/entry.h"

int jvm_probe(const hvd_entry_ctx *ctx, hvd_entry_result *out);

/* Reads /proc/<pid>/<what> into buf (NULs of cmdline become spaces). Returns the length. */
static size_t read_proc(int pid, const char *what, char *buf, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, what);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i + 1 < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    return n;
}

static int parent_of(int pid) {
    char stat[512];
    if (read_proc(pid, "stat", stat, sizeof stat) == 0) return -1;
    char *close_paren = strrchr(stat, ')');
    int ppid = -1;
    if (!close_paren || sscanf(close_paren + 2, "%*c %d", &ppid) != 1) return -1;
    return ppid;
}

/* The nearest ancestor JVM, and whether it is a Spark executor. */
static int find_jvm(int *executor) {
    *executor = 0;
    for (int pid = getppid(), depth = 0; pid > 1 && depth < 64; pid = parent_of(pid), depth++) {
        char comm[64];
        if (read_proc(pid, "comm", comm, sizeof comm) == 0) return -1;
        comm[strcspn(comm, "\n")] = '\0';
        if (strcmp(comm, "java") != 0) continue;
        static char cmdline[65536];
        read_proc(pid, "cmdline", cmdline, sizeof cmdline);
        *executor = strstr(cmdline, "CoarseGrainedExecutorBackend") != NULL;
        return pid;
    }
    return -1;
}

int jvm_probe(const hvd_entry_ctx *ctx, hvd_entry_result *out) {
    char arg[256] = "";
    size_t n = ctx->arg_len < sizeof arg - 1 ? ctx->arg_len : sizeof arg - 1;
    memcpy(arg, ctx->arg, n);
    const char *sleep_s = strstr(arg, "sleep=");
    if (sleep_s) sleep((unsigned)atoi(sleep_s + 6));
    const char *fail = strstr(arg, "fail=");
    if (fail && atoi(fail + 5) == ctx->rank) {
        snprintf(out->error, sizeof out->error, "rank %d failed on purpose (jvm_probe '%s')",
                 ctx->rank, arg);
        return 3;
    }
    int executor;
    int jvm = find_jvm(&executor);
    char gpus[128] = "";
    for (size_t i = 0; i < ctx->ngpus; i++) {
        size_t used = strlen(gpus);
        snprintf(gpus + used, sizeof gpus - used, "%s%s", i ? "," : "", ctx->gpus[i]);
    }
    const char *marker = getenv("HVD_TEST_MARKER");
    char *buf = malloc(512);
    if (!buf) return 1;
    int len = snprintf(buf, 512,
                       "rank=%d size=%d local_rank=%d task=%d pid=%d jvm=%d executor=%d gpus=%s "
                       "marker=%s",
                       ctx->rank, ctx->size, ctx->local_rank, ctx->task_index, (int)getpid(), jvm,
                       executor, gpus, marker ? marker : "");
    if (len < 0) len = 0;
    if (len > 511) len = 511; /* cut (a very long marker) */
    out->data = (uint8_t *)buf;
    out->len = (size_t)len;
    return 0;
}
