/* The end of a job: a summary table, the results as JSON, and the exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher.h"

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void json_bytes(FILE *f, const uint8_t *d, size_t n) {
    /* Results are bytes: written as a JSON string when they are printable UTF-8-free ASCII,
     * and always as hex too, so nothing is lost. */
    bool text = true;
    for (size_t i = 0; i < n; i++)
        if (d[i] < 0x20 || d[i] > 0x7e) text = false;
    fprintf(f, "\"result_hex\": \"");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", d[i]);
    fprintf(f, "\"");
    if (text) {
        char *s = malloc(n + 1);
        memcpy(s, d, n);
        s[n] = '\0';
        fprintf(f, ", \"result_text\": ");
        json_string(f, s);
        free(s);
    }
}

static int write_json(const char *path, const hvd_rank_result *r, size_t n, int mpirun_status) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"mpirun_status\": %d, \"ranks\": [\n", mpirun_status);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "  {\"rank\": %d, \"task\": %u, \"host_hash\": ", r[i].rank, r[i].index);
        json_string(f, r[i].host_hash ? r[i].host_hash : "");
        fprintf(f, ", \"reported\": %s, \"status\": %d, ", r[i].present ? "true" : "false",
                r[i].status);
        json_bytes(f, r[i].data, r[i].len);
        fprintf(f, ", \"error\": ");
        if (r[i].error)
            json_string(f, r[i].error);
        else
            fprintf(f, "null");
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : -1;
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

int report_results(hvd_driver *d, const launch_opts *o, int mpirun_status, bool timed_out) {
    hvd_rank_result *r = NULL;
    size_t n = 0;
    hvd_err err;
    if (hvd_driver_results(d, &r, &n, &err) != 0) {
        fprintf(stderr, "hvd-driver: cannot collect the results: %s\n", err.msg);
        return mpirun_status ? mpirun_status : 1;
    }
    fprintf(stderr, "hvd-driver: %-5s %-5s %-40s %-7s %s\n", "rank", "task", "host hash", "status",
            "error, or result");
    const hvd_rank_result *first_bad = NULL;
    for (size_t i = 0; i < n; i++) {
        char st[16];
        if (r[i].present)
            snprintf(st, sizeof st, "%d", r[i].status);
        else
            snprintf(st, sizeof st, "-");
        char shown[128];
        printable_result(&r[i], shown, sizeof shown);
        fprintf(stderr, "hvd-driver: %-5d %-5u %-40s %-7s %s\n", r[i].rank, r[i].index,
                r[i].host_hash ? r[i].host_hash : "?", st,
                r[i].error ? r[i].error : (r[i].present ? shown : "(no result reported)"));
        if (!first_bad && (!r[i].present || r[i].status != 0)) first_bad = &r[i];
    }
    if (o->results_json && write_json(o->results_json, r, n, mpirun_status) != 0)
        fprintf(stderr, "hvd-driver: cannot write %s\n", o->results_json);
    int rc = 0;
    if (first_bad && first_bad->present) {
        fprintf(stderr,
                "hvd-driver: job failed: rank %d (task %u on %s) exited with status %d%s%s\n",
                first_bad->rank, first_bad->index,
                first_bad->host_hash ? first_bad->host_hash : "?", first_bad->status,
                first_bad->error ? ": " : "", first_bad->error ? first_bad->error : "");
        rc = first_bad->status > 0 && first_bad->status < 256 ? first_bad->status : 1;
    } else if (first_bad) {
        /* No rank failed by itself: name every rank that is missing (the cause, a lost task,
         * an agent or orted that died, is in the lines of hvd-rsh, hvd-task or mpirun above,
         * or in hvd-driver's "stopping the job" line). */
        char missing[256] = "";
        size_t nmissing = 0;
        for (size_t i = 0; i < n; i++) {
            if (r[i].present) continue;
            size_t used = strlen(missing);
            if (nmissing < 16)
                snprintf(missing + used, sizeof missing - used, "%s%d", nmissing ? "," : "",
                         r[i].rank);
            else if (nmissing == 16)
                snprintf(missing + used, sizeof missing - used, ",...");
            nmissing++;
        }
        fprintf(stderr,
                "hvd-driver: job failed: %zu rank%s (%s) reported no result; mpirun exited with "
                "status %d%s (see the messages above for the cause)\n",
                nmissing, nmissing == 1 ? "" : "s", missing, mpirun_status,
                timed_out ? " after the timeout" : "");
        rc = mpirun_status ? mpirun_status : 1;
    } else if (mpirun_status != 0) {
        fprintf(stderr, "hvd-driver: every rank succeeded but mpirun exited with status %d\n",
                mpirun_status);
        rc = mpirun_status;
    }
    hvd_driver_results_free(r, n);
    return rc;
}
