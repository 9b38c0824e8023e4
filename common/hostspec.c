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

/* s for a message: at most 80 characters, "..." marking a cut. */
static const char *quoted(const char *s, char *buf, size_t cap) {
    snprintf(buf, cap, "%.80s%s", s, strlen(s) > 80 ? "..." : "");
    return buf;
}

/* One line's words, cut at '#'. Returns the number found (at most max). */
static int split_words(char *line, char **w, int max) {
    line[strcspn(line, "#")] = '\0';
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, " \t\r\v\f", &save); t && n < max;
         t = strtok_r(NULL, " \t\r\v\f", &save))
        w[n++] = t;
    return n;
}

/* The host word w0 of a line: refused with what to write, or 0. */
static int hostfile_host(const char *w0, const char *at, hvd_err *err) {
    char q[96];
    if (strchr(w0, '='))
        return hvd_err_set(err, HVD_E_INVALID, "%s: '%s' names no host (write '<host> slots=<n>')",
                           at, quoted(w0, q, sizeof q));
    if (strchr(w0, ','))
        return hvd_err_set(err, HVD_E_INVALID,
                           "%s: '%s' holds a comma: write one '<host> slots=<n>' per line", at,
                           quoted(w0, q, sizeof q));
    const char *host = strrchr(w0, ']') ? strrchr(w0, ']') + 1 : w0;
    const char *colon = strchr(host, ':');
    if (colon && strchr(colon + 1, ':'))
        return hvd_err_set(err, HVD_E_INVALID,
                           "%s: write the IPv6 address %s in brackets ([%s] slots=<n>)", at,
                           quoted(w0, q, sizeof q), q);
    if (colon)
        return hvd_err_set(err, HVD_E_INVALID, "%s: write '%s' as '<host> slots=<n>'", at,
                           quoted(w0, q, sizeof q));
    hvd_hostspec hs;
    hvd_err why;
    if (hvd_hostspec_parse(w0, strlen(w0), "slots", 1, HVD_HOST_MAX_SLOTS, &hs, &why) != 0)
        return hvd_err_set(err, HVD_E_INVALID, "%s: %s", at, why.msg);
    return 0;
}

/* "host slots=n" of one line (words w[0..n), n >= 1) appended to b as "host:n". */
static int hostfile_line(hvd_strb *b, char **w, int n, const char *raw, const char *at,
                         hvd_err *err) {
    long slots = 1;
    char q[96];
    if (hostfile_host(w[0], at, err) != 0) return -1;
    for (int i = 1; i < n; i++) {
        const char *v = w[i] + 6;
        if (strncmp(w[i], "slots=", 6) != 0 ||
            parse_number(v, strlen(v), 1, HVD_HOST_MAX_SLOTS, &slots) != 0)
            return hvd_err_set(err, HVD_E_INVALID,
                               "%s: '%s' is not '<host> slots=<n>' with n from 1 to %d", at,
                               quoted(raw, q, sizeof q), HVD_HOST_MAX_SLOTS);
    }
    hvd_strb_addf(b, "%s:%ld", w[0], slots);
    return 0;
}

/* One line's text for messages: the comment cut off, a carriage return made a space, no
 * trailing white space. */
static void line_text(char *raw) {
    raw[strcspn(raw, "#")] = '\0';
    for (char *c = raw; (c = strchr(c, '\r')) != NULL;)
        *c = ' ';
    for (size_t k = strlen(raw); k > 0 && strchr(" \t\v\f", raw[k - 1]); k--)
        raw[k - 1] = '\0';
}

int hvd_hostfile_parse(const char *text, size_t len, const char *name, char **out, hvd_err *err) {
    *out = NULL;
    if (memchr(text, '\0', len))
        return hvd_err_set(err, HVD_E_INVALID,
                           "hostfile %s holds a NUL byte (saved as UTF-16?): save it as plain "
                           "text",
                           name);
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) { /* a UTF-8 byte order mark */
        text += 3;
        len -= 3;
    }
    hvd_strb b = {0};
    int rc = 0, number = 0;
    for (const char *p = text, *end = text + len; !rc && p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        char *line = strndup(p, n), *raw = strndup(p, n), *w[64], at[600];
        p = nl ? nl + 1 : end;
        snprintf(at, sizeof at, "hostfile %s line %d", name, ++number);
        if (!line || !raw) {
            rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", name);
        } else {
            line_text(raw);
            int words = split_words(line, w, 64);
            if (words == 64)
                rc = hvd_err_set(err, HVD_E_INVALID, "%s is not '<host> slots=<n>'", at);
            else if (words > 0)
                rc = hostfile_line(&b, w, words, raw, at, err);
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

/* A failure to read: HVD_E_IO with errno left as the system call set it. */
static int read_failed(hvd_err *err, const char *path) {
    int e = errno;
    hvd_err_set(err, HVD_E_IO, "cannot read hostfile %s: %s", path, strerror(e));
    errno = e;
    return -1;
}

int hvd_hostfile_read(const char *path, char **out, hvd_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return read_failed(err, path);
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            char *t = realloc(text, cap ? cap * 2 : 8192);
            if (!t) {
                rc = hvd_err_set(err, HVD_E_INTERNAL, "out of memory reading hostfile %s", path);
                break;
            }
            text = t;
            cap = cap ? cap * 2 : 8192;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (len > HOSTFILE_MAX_BYTES) {
            rc = hvd_err_set(err, HVD_E_INVALID, "hostfile %s is larger than %d MiB", path,
                             HOSTFILE_MAX_BYTES >> 20);
            break;
        }
        if (n == 0) {
            if (ferror(f)) rc = read_failed(err, path);
            break;
        }
    }
    int saved = errno;
    fclose(f);
    errno = saved;
    if (!rc) rc = hvd_hostfile_parse(text ? text : "", len, path, out, err);
    free(text);
    return rc ? -1 : 0;
}
