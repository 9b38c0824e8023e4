/* The end of a job: a summary table, the results as JSON, and the exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/sig.h"
#include "launcher.h"

/* One rank as a JSON object. The result bytes go as hex, always, so nothing is lost, and as
 * text too when they are valid UTF-8 (JSON strings cannot hold anything else). */
static json_t *rank_json(const hvd_rank_result *r) {
    static const char digits[] = "0123456789abcdef";
    char *hex = malloc(r->len * 2 + 1);
    if (!hex) return NULL;
    for (size_t i = 0; i < r->len; i++) { /* a table, not snprintf: results reach 64 MiB */
        hex[2 * i] = digits[r->data[i] >> 4];
        hex[2 * i + 1] = digits[r->data[i] & 15];
    }
    json_t *task = r->index == UINT32_MAX ? json_null() : json_integer(r->index);
    json_t *result_hex = json_stringn_nocheck(hex, r->len * 2); /* ASCII: nothing to check */
    free(hex);
    json_t *o = json_pack("{s:i, s:o, s:s, s:b, s:i, s:b, s:I, s:o, s:s?}", "rank", r->rank, "task",
                          task, "host_hash", r->host_hash ? r->host_hash : "", "reported",
                          r->present, "status", r->status, "stopped", r->stopped, "order",
                          (json_int_t)r->order, "result_hex", result_hex, "error", r->error);
    /* NULL: not UTF-8 (jansson refuses data NULL, which an empty result may have) */
    json_t *text = r->len ? json_stringn((const char *)r->data, r->len) : json_string("");
    if (o && text) json_object_set_new(o, "result_text", text);
    return o;
}

static int write_json(const char *path, const hvd_rank_result *r, size_t n, int mpirun_status,
                      int first_failed, const char *failure) {
    json_t *ranks = json_array();
    json_t *doc =
        json_pack("{s:i, s:o, s:s?, s:o}", "mpirun_status", mpirun_status, "first_failed_rank",
                  first_failed >= 0 ? json_integer(first_failed) : json_null(), "failure", failure,
                  "ranks", ranks);
    for (size_t i = 0; doc && i < n; i++)
        if (json_array_append_new(ranks, rank_json(&r[i])) != 0) {
            json_decref(doc);
            doc = NULL;
        }
    /* Written beside it and renamed over it: a reader (a job of serve --jobs rewrites the file)
     * sees the old results or the new ones, never half a file. */
    char tmp[4096];
    int rc = -1;
    if (doc && snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) < (int)sizeof tmp) {
        rc = json_dump_file(doc, tmp, JSON_INDENT(1));
        if (rc == 0 && rename(tmp, path) != 0) rc = -1;
        if (rc != 0) (void)unlink(tmp);
    }
    json_decref(doc);
    return rc;
}

/* The result bytes as one short line when they are printable text, else their size. */
static void printable_result(const hvd_rank_result *r, char *out, size_t cap) {
    size_t n = r->len;
    while (n > 0 && (r->data[n - 1] == '\n' || r->data[n - 1] == '\r'))
        n--;
    bool text = true;
    for (size_t i = 0; i < n && text; i++)
        text = r->data[i] >= 0x20 && r->data[i] < 0x7f;
    if (n == 0)
        out[0] = '\0';
    else if (!text)
        snprintf(out, cap, "(%zu bytes)", r->len);
    else if (n < cap)
        snprintf(out, cap, "%.*s", (int)n, (const char *)r->data);
    else
        snprintf(out, cap, "%.*s...", (int)(cap - 4), (const char *)r->data);
}

/* One line per rank: task, host, status, and its error or result. */
static void print_table(const hvd_rank_result *r, size_t n) {
    fprintf(stderr, "hvd-driver: %-5s %-5s %-40s %-7s %s\n", "rank", "task", "host hash", "status",
            "error, or result");
    for (size_t i = 0; i < n; i++) {
        char st[16];
        if (r[i].present)
            snprintf(st, sizeof st, "%d", r[i].status);
        else
            snprintf(st, sizeof st, "-");
        char shown[128];
        printable_result(&r[i], shown, sizeof shown);
        char task[16] = "-";
        if (r[i].index != UINT32_MAX) snprintf(task, sizeof task, "%u", r[i].index);
        fprintf(stderr, "hvd-driver: %-5d %-5s %-40s %-7s %s\n", r[i].rank, task,
                r[i].host_hash ? r[i].host_hash : "?", st,
                r[i].error ? r[i].error : (r[i].present ? shown : "(no result reported)"));
    }
}

/* "0,2,5-7" style list of the ranks that reported nothing (at most 16 named). */
static size_t missing_ranks(const hvd_rank_result *r, size_t n, char *out, size_t cap) {
    size_t nmissing = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (r[i].present) continue;
        size_t used = strlen(out);
        if (nmissing < 16)
            snprintf(out + used, cap - used, "%s%d", nmissing ? "," : "", r[i].rank);
        else if (nmissing == 16)
            snprintf(out + used, cap - used, ",...");
        nmissing++;
    }
    return nmissing;
}

/* " (3 ranks reported no result: 1,2,3)", or "" when every rank reported. */
static void missing_note(const hvd_rank_result *r, size_t n, char *out, size_t cap) {
    char missing[160]; /* 16 ranks and ",..." */
    size_t k = missing_ranks(r, n, missing, sizeof missing);
    if (k == 0)
        out[0] = '\0';
    else
        snprintf(out, cap, " (%zu rank%s reported no result: %s)", k, k == 1 ? "" : "s", missing);
}

/* mpirun died of a signal nobody here sent: someone killed it. */
static bool mpirun_killed(const job_end_info *end) {
    const hvd_launch_outcome *m = end->mpirun;
    return m && m->signal > 0 && !m->stopped && !m->timed_out && !m->late && !m->rank_failed;
}

static int mpirun_status(const job_end_info *end) {
    return end->mpirun ? end->mpirun->status : 0;
}

/* "mpirun exited with status N"; serve runs no mpirun (the user does) and says so instead of
 * inventing a status. */
static const char *mpirun_said(const job_end_info *end, char *buf, size_t cap) {
    if (end->mpirun)
        snprintf(buf, cap, "mpirun exited with status %d", end->mpirun->status);
    else
        snprintf(buf, cap, "mpirun's exit status is not known here (serve does not run mpirun)");
    return buf;
}

/* "every rank succeeded but mpirun exited with status N", and when N reads as 128 + a signal
 * (how mpirun reports a process of the job killed by one), that a process died after the ranks
 * reported: every result is in, and mpirun's own messages name the process. */
static void all_ranks_succeeded(const job_end_info *end, const char *said, char *why, size_t cap) {
    int st = mpirun_status(end), sig = st - 128;
    if (end->mpirun && sig > 0 && sig < 65)
        snprintf(why, cap,
                 "every rank succeeded but %s (128 + %d: probably a process of the job killed "
                 "by signal %d (%s) after the ranks reported; mpirun's own messages name it)",
                 said, sig, sig, strsignal(sig));
    else
        snprintf(why, cap, "every rank succeeded but %s", said);
}

/* How many ranks were stopped by the job ending (orted's signal), and the first of them. */
static size_t stopped_ranks(const hvd_rank_result *r, size_t n, int *first) {
    size_t k = 0;
    *first = -1;
    for (size_t i = 0; i < n; i++)
        if (r[i].present && r[i].stopped && k++ == 0) *first = r[i].rank;
    return k;
}

/* No rank reported: how far the launch came, from mpirun's status and whether any host's
 * agent (hvd-rsh) reached the driver (one killed before it did leaves no other trace). */
static void no_rank_ran(hvd_driver *d, const job_end_info *end, const char *said, char *why,
                        size_t cap) {
    size_t hosts, seen = hvd_driver_agents_seen(d, &hosts);
    const char *agents = seen == 0 && hosts > 0
                             ? ", and no agent (hvd-rsh) had reached the driver: mpirun could "
                               "not start them, or they died first"
                             : "";
    if (end->mpirun)
        snprintf(why, cap,
                 "no rank reported a result: %s before the ranks ran%s (see mpirun's messages "
                 "above)",
                 said, agents);
    else
        snprintf(why, cap, "no rank reported a result%s (%s: see its messages)", agents, said);
}

/* The last line: what failed first, into why (cap bytes). Returns the exit status. In order:
 * an interrupt (whatever broke after it is its doing); mpirun killed from outside; the first
 * failure the driver saw; why the job was stopped (--timeout, a task lost); what is left. */
static int blame(hvd_driver *d, const hvd_rank_result *r, size_t n, const job_end_info *end,
                 char *why, size_t cap) {
    int status = mpirun_status(end);
    int fallback = status > 0 && status < 256 ? status : 1;
    char note[300];
    missing_note(r, n, note, sizeof note);
    if (end->stopped[0] && hvd_signals_first()) {
        snprintf(why, cap, "%s%s", end->stopped, note);
        return 1;
    }
    if (mpirun_killed(end)) {
        char sig[64];
        snprintf(sig, sizeof sig, "%d (%s)", end->mpirun->signal, strsignal(end->mpirun->signal));
        snprintf(why, cap, "mpirun was killed by signal %s, not by hvd-driver: who killed it?%s",
                 sig, note);
        return status;
    }
    hvd_failure_kind kind = hvd_driver_failure(d, r, n, why, cap);
    if (kind == HVD_FAILURE_RANK) {
        int bad = hvd_driver_first_failed_rank(d, r, n);
        return r[bad].status > 0 && r[bad].status < 256 ? r[bad].status : 1;
    }
    if (kind != HVD_FAILURE_NONE) return fallback;
    size_t nstopped;
    int first;
    char said[96];
    mpirun_said(end, said, sizeof said);
    if (end->stopped[0])
        snprintf(why, cap, "%s%s", end->stopped, note);
    else if ((nstopped = stopped_ranks(r, n, &first)) > 0)
        snprintf(why, cap,
                 "%zu rank%s (rank %d first) %s stopped by %s before finishing, and no part of "
                 "the job failed on its own: %s (was mpirun stopped from outside?)%s",
                 nstopped, nstopped == 1 ? "" : "s", first, nstopped == 1 ? "was" : "were",
                 hvd_mpi_daemon(hvd_driver_mpi(d)), said, note);
    else if (missing_ranks(r, n, note, sizeof note) == n)
        no_rank_ran(d, end, said, why, cap);
    else
        all_ranks_succeeded(end, said, why, cap);
    return end->stopped[0] ? 1 : fallback;
}

void job_stop_reason(const launch_opts *o, const hvd_launch_outcome *out, char *why, size_t cap) {
    if (out->timed_out)
        fprintf(stderr, "hvd-driver: the job ran past --timeout %d s; mpirun was stopped\n",
                o->timeout_s);
    watch_stop_reason(why, cap);
    if (why[0]) fprintf(stderr, "hvd-driver: stopping the job: %s\n", why);
    if (!why[0] && out->timed_out)
        snprintf(why, cap, "the job ran past --timeout %d s", o->timeout_s);
}

int report_results(hvd_driver *d, const launch_opts *o, const job_end_info *end) {
    hvd_rank_result *r = NULL;
    size_t n = 0;
    hvd_err err;
    int status = mpirun_status(end);
    if (hvd_driver_results(d, &r, &n, &err) != 0) {
        fprintf(stderr, "hvd-driver: cannot collect the results: %s\n", err.msg);
        return status ? status : 1;
    }
    if (!o->quiet) print_table(r, n);
    bool ok = status == 0 && !end->stopped[0];
    for (size_t i = 0; i < n; i++)
        ok &= r[i].present && r[i].status == 0;
    /* A static job's task service lost while ranks still ran fails it (an elastic job goes on
     * without it: the reset already dealt with it). */
    if (ok && !o->elastic && hvd_driver_lost_during_job(d, r, n)) ok = false;
    char why[1024] = "";
    int rc = ok ? 0 : blame(d, r, n, end, why, sizeof why);
    if (!ok) fprintf(stderr, "hvd-driver: job failed: %s\n", why);
    if (o->results_json && write_json(o->results_json, r, n, status,
                                      hvd_driver_first_failed_rank(d, r, n), ok ? NULL : why) != 0)
        fprintf(stderr, "hvd-driver: cannot write %s\n", o->results_json);
    hvd_driver_results_free(r, n);
    return rc;
}
