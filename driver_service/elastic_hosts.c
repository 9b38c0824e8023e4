/* The hosts of an elastic job as its loop sees them (elastic.h): the discovery script and its
 * "host[:slots]" lines (Horovod's format), the blacklist with its cool-down (Horovod's
 * formula), and the choice of a launch's tasks. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/hostspec.h"
#include "common/proc.h"
#include "common/strv.h"
#include "elastic.h"

#define DISCOVERY_OUTPUT_MAX (1u << 20) /* more than any host list: the rest is dropped */

/* ---- The discovery script ---------------------------------------------------------------- */

/* Reads the script's stdout until end-of-file or the deadline. Returns 0, or -1 (timeout). */
static int read_output(hvd_proc *p, int64_t deadline, hvd_buf *out) {
    int fd = hvd_proc_stdout_fd(p);
    char chunk[4096];
    for (;;) {
        int left = hvd_ms_left(deadline);
        if (left <= 0) return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, left) < 0 && errno != EINTR) return -1;
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            return 0;
        }
        if (out->len + (size_t)n <= DISCOVERY_OUTPUT_MAX && hvd_buf_append(out, chunk, (size_t)n))
            return -1;
    }
}

/* Adds one "host[:slots]" line to the list (a repeated host: the last line wins). */
static int add_line(const char *s, size_t len, int default_slots, hvd_elastic_host **v, size_t *n,
                    hvd_err *err) {
    hvd_hostspec hs;
    if (hvd_hostspec_parse(s, len, "slots", 1, 1 << 20, &hs, err) != 0) return -1;
    if (hs.user[0])
        return hvd_err_set(err, HVD_E_INVALID, "a host discovery line is host[:slots], not '%.*s'",
                           (int)(len > 200 ? 200 : len), s);
    size_t i = 0;
    while (i < *n && strcmp((*v)[i].name, hs.host) != 0)
        i++;
    if (i == *n) {
        hvd_elastic_host *g = realloc(*v, (*n + 1) * sizeof *g);
        if (!g) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        *v = g;
        (*n)++;
    }
    snprintf((*v)[i].name, sizeof(*v)[i].name, "%s", hs.host);
    (*v)[i].slots = hs.number > 0 ? (int)hs.number : default_slots;
    return 0;
}

/* Parses the script's output: one host per line, blank lines skipped. */
static int parse_hosts(const char *text, size_t len, int default_slots, hvd_elastic_host **out,
                       size_t *n, hvd_err *err) {
    *out = NULL;
    *n = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *b = p;
        while (b < e && strchr(" \t\r", *b))
            b++;
        const char *t = e;
        while (t > b && strchr(" \t\r", t[-1]))
            t--;
        if (t > b && add_line(b, (size_t)(t - b), default_slots, out, n, err) != 0) {
            free(*out);
            *out = NULL;
            *n = 0;
            return hvd_err_prefix(err, "host discovery script: ");
        }
        p = nl ? nl + 1 : end;
    }
    return 0;
}

int el_discover(const char *script, int default_slots, hvd_elastic_host **out, size_t *n,
                hvd_err *err) {
    hvd_proc_spec spec = {.command = script, .pass_stderr = true, .stderr_fd = STDERR_FILENO};
    hvd_proc *p = hvd_proc_start(&spec, err);
    if (!p) return hvd_err_prefix(err, "cannot run the host discovery script: ");
    hvd_buf text = {0};
    int64_t deadline = hvd_now_ms() + HVD_DISCOVERY_TIMEOUT_MS;
    bool late = read_output(p, deadline, &text) != 0;
    int code = 0;
    if (late || hvd_proc_wait(p, hvd_ms_left(deadline), &code) != 0) {
        late = true;
        hvd_proc_abort(p);
    }
    hvd_proc_free(p);
    int rc;
    if (late)
        rc = hvd_err_set(err, HVD_E_TIMEOUT,
                         "the host discovery script '%.200s' did not end within %d s", script,
                         HVD_DISCOVERY_TIMEOUT_MS / 1000);
    else if (code != 0)
        rc = hvd_err_set(err, HVD_E_STATE, "the host discovery script '%.200s' exited with %d",
                         script, code);
    else
        rc =
            parse_hosts(text.data ? (const char *)text.data + text.off : "", hvd_buf_pending(&text),
                        default_slots > 0 ? default_slots : 1, out, n, err);
    hvd_buf_free(&text);
    return rc;
}

/* ---- Hosts and the blacklist ----------------------------------------------------------------- */

static bool is_hex32(const char *s) {
    size_t i = 0;
    for (; s[i]; i++)
        if (!strchr("0123456789abcdefABCDEF", s[i])) return false;
    return i == 32;
}

/* Whether hash is name with every character outside [A-Za-z0-9_-] made '-' (the host hash
 * hvd-driver --ssh gives a discovered host's tasks: "10.0.0.5" -> "10-0-0-5"). */
static bool is_spelled(const char *hash, const char *name) {
    size_t i = 0;
    for (; name[i] && hash[i]; i++) {
        char c = name[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '_' || c == '-';
        if (hash[i] != (plain ? c : '-')) return false;
    }
    return !name[i] && !hash[i];
}

bool el_host_matches(const char *hash, const char *name) {
    if (strcmp(hash, name) == 0 || is_spelled(hash, name)) return true;
    size_t label = strcspn(name, ".");
    return label > 0 && strncmp(hash, name, label) == 0 && hash[label] == '-' &&
           is_hex32(hash + label + 1);
}

el_host *el_host_get(el_hosts *h, const char *hash) {
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->v[i].hash, hash) == 0) return &h->v[i];
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        el_host *v = realloc(h->v, cap * sizeof *v);
        if (!v) return NULL;
        h->v = v;
        h->cap = cap;
    }
    el_host *e = &h->v[h->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->hash, sizeof e->hash, "%s", hash);
    e->seen = ++h->seq;
    return e;
}

int el_blacklist(el_hosts *h, const char *hash, int64_t now) {
    el_host *e = el_host_get(h, hash);
    if (!e) return -1;
    e->blacklists++;
    if (h->cooldown_min_s <= 0 || h->cooldown_max_s <= 0) {
        e->cooldown_until = INT64_MAX;
        return -1;
    }
    /* Horovod's cool-down: min * 2^k plus up to min at random, within [min, max]. */
    double lo = h->cooldown_min_s, hi = h->cooldown_max_s;
    int k = e->blacklists < 30 ? e->blacklists : 30;
    double delay = lo * (double)(1u << k) + lo * ((double)rand() / RAND_MAX);
    delay = delay > hi ? hi : delay < lo ? lo : delay;
    e->cooldown_until = now + (int64_t)(delay * 1000);
    return (int)(delay + 0.5);
}

static bool discovered(const el_hosts *h, const char *hash) {
    for (size_t i = 0; i < h->ndisc; i++)
        if (el_host_matches(hash, h->disc[i].name)) return true;
    return false;
}

bool el_host_usable(el_hosts *h, const char *hash, int64_t now) {
    el_host *e = el_host_get(h, hash);
    if (e && e->cooldown_until > now) return false;
    return !h->script || discovered(h, hash);
}

void el_hosts_free(el_hosts *h) {
    free(h->v);
    free(h->disc);
    memset(h, 0, sizeof *h);
}

/* ---- The plan of a launch ----------------------------------------------------------------------
 */

static uint64_t seen_of(const el_hosts *h, const char *hash) {
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->v[i].hash, hash) == 0) return h->v[i].seen;
    return UINT64_MAX;
}

static int by_host_then_index(const void *a, const void *b, void *hosts) {
    const hvd_task_brief *x = a, *y = b;
    uint64_t sx = seen_of(hosts, x->host_hash), sy = seen_of(hosts, y->host_hash);
    if (sx != sy) return sx < sy ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The slots a listed host grants (INT32_MAX without a script). */
static int host_slots(const el_hosts *h, const char *hash) {
    if (!h->script) return INT32_MAX;
    for (size_t i = 0; i < h->ndisc; i++)
        if (el_host_matches(hash, h->disc[i].name)) return h->disc[i].slots;
    return 0;
}

int el_plan_make(el_hosts *h, const hvd_task_brief *t, size_t n, int max_np, int64_t now,
                 el_plan *out) {
    memset(out, 0, sizeof *out);
    hvd_task_brief *u = malloc((n ? n : 1) * sizeof *u);
    out->idx = malloc((n ? n : 1) * sizeof *out->idx);
    if (!u || !out->idx) {
        free(u);
        el_plan_free(out);
        return -1;
    }
    size_t nu = 0;
    for (size_t i = 0; i < n; i++)
        if (!t[i].lost && el_host_usable(h, t[i].host_hash, now)) u[nu++] = t[i];
    qsort_r(u, nu, sizeof *u, by_host_then_index, h);
    /* A listed host runs at most its slots of its tasks. */
    const char *cur = NULL;
    int used = 0;
    for (size_t i = 0; i < nu; i++) {
        if (!cur || strcmp(cur, u[i].host_hash) != 0) {
            cur = u[i].host_hash;
            used = 0;
        }
        if (used++ >= host_slots(h, cur)) continue;
        out->usable++;
        if (max_np <= 0 || out->n < (size_t)max_np) out->idx[out->n++] = u[i].index;
    }
    free(u);
    return 0;
}

bool el_plan_same(const el_plan *a, const el_plan *b) {
    if (a->n != b->n) return false;
    for (size_t i = 0; i < a->n; i++)
        if (a->idx[i] != b->idx[i]) return false;
    return true;
}

void el_plan_free(el_plan *p) {
    free(p->idx);
    memset(p, 0, sizeof *p);
}

static const char *hash_of(const hvd_task_brief *t, size_t n, uint32_t index) {
    for (size_t i = 0; i < n; i++)
        if (t[i].index == index) return t[i].host_hash;
    return "?";
}

char *el_plan_hosts(const el_plan *p, const hvd_task_brief *t, size_t n) {
    hvd_strb b = {0};
    for (size_t i = 0; i < p->n;) {
        const char *h = hash_of(t, n, p->idx[i]);
        size_t k = i;
        while (k < p->n && strcmp(hash_of(t, n, p->idx[k]), h) == 0)
            k++;
        hvd_strb_addf(&b, "%s:%zu", h, k - i);
        i = k;
    }
    char **v = hvd_strb_finish(&b);
    char *s = v ? hvd_strv_join((const char *const *)v, ",") : NULL;
    hvd_strv_free(v);
    return s;
}
