/* "[user@]host[:number]" and Horovod's hostfile (common/hostspec.h). */
#include "common/hostspec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strv.h"

/* Characters a host may not hold: white space, quotes and shell metacharacters (the host ends
 * up in command lines and messages). */
#define HOST_BAD " \t\r\n'\"\\$`;&|<>(){}*?!#"

static int bad(hvd_err *err, const char *s, size_t len, const char *what, long min, long max,
               const char *why) {
    return hvd_err_set(err, HVD_E_INVALID,
                       "bad host '%.*s': %s (write [user@]host[:%s], %s %ld-%ld)",
                       (int)(len > 200 ? 200 : len), s, why, what, what, min, max);
}

static int parse_number(const char *p, size_t n, long min, long max, long *out) {
    if (n == 0 || n > 10) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    if (v < min || v > max) return -1;
    *out = v;
    return 0;
}

int hvd_hostspec_parse(const char *s, size_t len, const char *what, long min, long max,
                       hvd_hostspec *out, hvd_err *err) {
    memset(out, 0, sizeof *out);
    out->number = -1;
    const char *p = s, *end = s + len;
    const char *at = memchr(p, '@', len);
    if (at) {
        size_t ulen = (size_t)(at - p);
        if (ulen == 0 || ulen >= sizeof out->user)
            return bad(err, s, len, what, min, max, "bad user name");
        memcpy(out->user, p, ulen);
        if (strpbrk(out->user, HOST_BAD)) return bad(err, s, len, what, min, max, "bad user name");
        p = at + 1;
    }
    const char *host = p, *host_end = end, *num = NULL;
    if (p < end && *p == '[') { /* [IPv6] or [IPv6]:number */
        const char *close = memchr(p, ']', (size_t)(end - p));
        if (!close) return bad(err, s, len, what, min, max, "no ']' after '['");
        if (close + 1 < end && close[1] != ':')
            return bad(err, s, len, what, min, max, "only ':' may follow ']'");
        host = p + 1;
        host_end = close;
        if (close + 1 < end) num = close + 2;
    } else {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        /* One ':' only: host:number. More: an IPv6 address without a number. */
        if (colon && !memchr(colon + 1, ':', (size_t)(end - colon - 1))) {
            host_end = colon;
            num = colon + 1;
        }
    }
    size_t hlen = (size_t)(host_end - host);
    if (hlen == 0) return bad(err, s, len, what, min, max, "no host");
    if (hlen >= sizeof out->host) return bad(err, s, len, what, min, max, "host name too long");
    memcpy(out->host, host, hlen);
    if (strpbrk(out->host, HOST_BAD))
        return bad(err, s, len, what, min, max, "the host holds white space or a shell character");
    if (num && parse_number(num, (size_t)(end - num), min, max, &out->number) != 0) {
        char why[64];
        snprintf(why, sizeof why, "%s must be a number", what);
        return bad(err, s, len, what, min, max, why);
    }
    return 0;
}

/* ---- hostfiles ---------------------------------------------------------------------------- */

/* One line's words, cut at '#'. Returns the number found (at most max). */
static int split_words(char *line, char **w, int max) {
    line[strcspn(line, "#")] = '\0';
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, " \t\r\v\f", &save); t && n < max;
         t = strtok_r(NULL, " \t\r\v\f", &save))
        w[n++] = t;
    return n;
}

/* "host slots=n" of one line (words w[0..n), n >= 1) appended to b as "host:n". */
static int hostfile_line(hvd_strb *b, char **w, int n, const char *raw, const char *name,
                         int number, hvd_err *err) {
    long slots = 1;
    if (strchr(w[0], '='))
        return hvd_err_set(err, HVD_E_INVALID,
                           "hostfile %s line %d: '%s' names no host (write '<host> slots=<n>')",
                           name, number, raw);
    for (int i = 1; i < n; i++) {
        const char *v = w[i] + 6;
        if (strncmp(w[i], "slots=", 6) != 0 ||
            parse_number(v, strlen(v), 1, HVD_HOSTFILE_MAX_SLOTS, &slots) != 0)
            return hvd_err_set(err, HVD_E_INVALID,
                               "hostfile %s line %d: '%s' is not '<host> slots=<n>' with n at "
                               "least 1",
                               name, number, raw);
    }
    const char *host = strrchr(w[0], ']') ? strrchr(w[0], ']') + 1 : w[0];
    const char *colon = strchr(host, ':');
    if (colon && strchr(colon + 1, ':'))
        return hvd_err_set(err, HVD_E_INVALID,
                           "hostfile %s line %d: write the IPv6 address %s in brackets ([%s] "
                           "slots=<n>)",
                           name, number, w[0], w[0]);
    if (colon)
        return hvd_err_set(err, HVD_E_INVALID,
                           "hostfile %s line %d: write '%s' as '<host> slots=<n>'", name, number,
                           w[0]);
    hvd_strb_addf(b, "%s:%ld", w[0], slots);
    return 0;
}

int hvd_hostfile_parse(const char *text, size_t len, const char *name, char **out, hvd_err *err) {
    *out = NULL;
    hvd_strb b = {0};
    int rc = 0, number = 0;
    for (const char *p = text, *end = text + len; !rc && p < end; number++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        char *line = strndup(p, n), *raw = strndup(p, n), *w[64];
        p = nl ? nl + 1 : end;
        if (!line || !raw) {
            rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", name);
        } else {
            raw[strcspn(raw, "#\r")] = '\0';
            for (size_t k = strlen(raw); k > 0 && strchr(" \t\v\f", raw[k - 1]); k--)
                raw[k - 1] = '\0';
            int words = split_words(line, w, 64);
            if (words == 64)
                rc = hvd_err_set(err, HVD_E_INVALID,
                                 "hostfile %s line %d: '%.80s...' is not '<host> slots=<n>'", name,
                                 number + 1, raw);
            else if (words > 0)
                rc = hostfile_line(&b, w, words, raw, name, number + 1, err);
        }
        free(line);
        free(raw);
    }
    char **v = hvd_strb_finish(&b);
    if (!rc && !v) rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", name);
    if (!rc && !v[0]) rc = hvd_err_set(err, HVD_E_INVALID, "hostfile %s names no host", name);
    if (!rc && !(*out = hvd_strv_join((const char *const *)v, ",")))
        rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", name);
    hvd_strv_free(v);
    return rc ? -1 : 0;
}

#define HOSTFILE_MAX_BYTES (16 << 20)

int hvd_hostfile_read(const char *path, char **out, hvd_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return hvd_err_set(err, HVD_E_IO, "cannot read hostfile %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len >= HOSTFILE_MAX_BYTES) {
            rc = hvd_err_set(err, HVD_E_INVALID, "hostfile %s is larger than %d MiB", path,
                             HOSTFILE_MAX_BYTES >> 20);
            break;
        }
        if (len + 4096 > cap) {
            char *t = realloc(text, cap = cap ? cap * 2 : 8192);
            if (!t) {
                rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", path);
                break;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = hvd_err_set(err, HVD_E_IO, "cannot read hostfile %s: %s", path,
                                 strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!rc) rc = hvd_hostfile_parse(text ? text : "", len, path, out, err);
    free(text);
    return rc ? -1 : 0;
}
