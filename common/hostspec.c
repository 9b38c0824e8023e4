/* "[user@]host[:number]" (common/hostspec.h). */
#include "common/hostspec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
