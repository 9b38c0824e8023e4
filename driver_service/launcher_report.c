/* The end of a job: a summary table, the results as JSON, and the exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "launcher.h"

/* One rank as a JSON object. The result bytes go as hex, always, so nothing is lost, and as
 * text too when they are valid UTF-8 (JSON strings cannot hold anything else). */
static json_t *rank_json(const hvd_rank_result *r) {
    char *hex = malloc(r->len * 2 + 1);
    if (!hex) return NULL;
    for (size_t i = 0; i < r->len; i++)
        snprintf(hex + 2 * i, 3, "%02x", r->data[i]);
    hex[r->len * 2] = '\0';
    json_t *task = r->index == UINT32_MAX ? json_null() : json_integer(r->index);
    json_t *o =
        json_pack("{s:i, s:o, s:s, s:b, s:i, s:I, s:s, s:s?}", "rank", r->rank, "task", task,
                  "host_hash", r->host_hash ? r->host_hash : "", "reported", r->present, "status",
                  r->status, "order", (json_int_t)r->order, "result_hex", hex, "error", r->error);
    free(hex);
    json_t *text = json_stringn((const char *)r->data, r->len); /* NULL: not UTF-8 */
    if (o && text) json_object_set_new(o, "result_text", text);
    return o;
}

static int write_json(const char *path, const hvd_rank_result *r, size_t n, int mpirun_status,
                      int first_failed) {
    json_t *ranks = json_array();
    json_t *doc =
        json_pack("{s:i, s:o, s:o}", "mpirun_status", mpirun_status, "first_failed_rank",
                  first_failed >= 0 ? json_integer(first_failed) : json_null(), "ranks", ranks);
    for (size_t i = 0; doc && i < n; i++)
        if (json_array_append_new(ranks, rank_json(&r[i])) != 0) {
            json_decref(doc);
            doc = NULL;
        }
    int rc = doc ? json_dump_file(doc, path, JSON_INDENT(1)) : -1;
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

/* The last line when a rank failed: the rank that failed first on its own (its own status, or
 * a signal if no rank exited by itself); a stop of the whole job (a lost task service, an
 * interrupt) is named before a rank merely killed by it. Returns the exit status. */
static int blame(const hvd_rank_result *r, size_t n, int bad, const char *stopped) {
    const hvd_rank_result *b = &r[bad];
    bool own = b->present && b->status > 0 && b->status < 128;
    if (own || (b->present && !stopped[0])) {
        fprintf(stderr, "hvd-driver: job failed: rank %d (task %u on %s) %s %d%s%s\n", b->rank,
                b->index, b->host_hash ? b->host_hash : "?",
                own ? "exited with status" : "was stopped with status", b->status,
                b->error ? ": " : "", b->error ? b->error : "");
        return own ? b->status : 1;
    }
    char missing[256];
    size_t nmissing = missing_ranks(r, n, missing, sizeof missing);
    if (stopped[0])
        fprintf(stderr, "hvd-driver: job failed: %s (%zu rank%s reported no result%s%s)\n", stopped,
                nmissing, nmissing == 1 ? "" : "s", nmissing ? ": " : "", missing);
    else
        /* Nothing named the cause: it is in the lines of hvd-rsh, hvd-task or mpirun above. */
        fprintf(stderr,
                "hvd-driver: job failed: %zu rank%s (%s) reported no result (see the messages "
                "above for the cause)\n",
                nmissing, nmissing == 1 ? "" : "s", missing);
    return 1;
}

int report_results(hvd_driver *d, const launch_opts *o, int mpirun_status, bool timed_out,
                   const char *stopped) {
    hvd_rank_result *r = NULL;
    size_t n = 0;
    hvd_err err;
    if (hvd_driver_results(d, &r, &n, &err) != 0) {
        fprintf(stderr, "hvd-driver: cannot collect the results: %s\n", err.msg);
        return mpirun_status ? mpirun_status : 1;
    }
    if (!o->quiet) print_table(r, n);
    int bad = hvd_first_failed_rank(r, n);
    if (o->results_json && write_json(o->results_json, r, n, mpirun_status, bad) != 0)
        fprintf(stderr, "hvd-driver: cannot write %s\n", o->results_json);
    char why[600];
    snprintf(why, sizeof why, "%s%s", stopped ? stopped : "",
             timed_out && !(stopped && stopped[0]) ? "the job ran past --timeout" : "");
    int rc = 0;
    if (bad >= 0) {
        rc = blame(r, n, bad, why);
        if (rc == 1 && mpirun_status > 0 && mpirun_status < 256 && !r[bad].present)
            rc = mpirun_status;
    } else if (mpirun_status != 0) {
        fprintf(stderr, "hvd-driver: every rank succeeded but mpirun exited with status %d\n",
                mpirun_status);
        rc = mpirun_status;
    }
    hvd_driver_results_free(r, n);
    return rc;
}
