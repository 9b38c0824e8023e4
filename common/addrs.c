/* Service addresses: local interface discovery and the text form of an address list
 * (include/hvd/net.h). */
#include "hvd/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Longest piece of untrusted text quoted back in an error message. */
#define QUOTE_MAX 64

/* Copies at most QUOTE_MAX bytes of s[0..n) into out (which holds QUOTE_MAX + 4), replacing
 * bytes that are not printable ASCII with '?' and marking a cut with "...". */
static void quote(char *out, const char *s, size_t n) {
    size_t k = n < QUOTE_MAX ? n : QUOTE_MAX;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (k < n) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}

/* An interface name (or IPv6 scope) as this format allows it: 1..15 printable ASCII
 * characters, none of the separators "=,:[]%" nor '/' or space (which Linux forbids). */
static int valid_ifname(const char *s, size_t n) {
    if (n == 0 || n >= HVD_IFNAME_MAX) return 0;
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || strchr("=,:[]%/", c)) return 0;
    }
    return 1;
}

/* ---- Local interfaces ------------------------------------------------------------------- */

/* The device name of a getifaddrs entry: IPv4 alias labels ("eth0:1") name their device. */
static void device_name(char out[HVD_IFNAME_MAX], const char *ifa_name) {
    size_t n = strcspn(ifa_name, ":");
    if (n >= HVD_IFNAME_MAX) n = HVD_IFNAME_MAX - 1;
    memcpy(out, ifa_name, n);
    out[n] = '\0';
}

static int usable(const struct ifaddrs *ifa) {
    return ifa->ifa_addr && (ifa->ifa_flags & IFF_UP) &&
           (ifa->ifa_addr->sa_family == AF_INET || ifa->ifa_addr->sa_family == AF_INET6);
}

static int wanted(const char *name, const char *const *only) {
    if (!only) return 1;
    for (size_t i = 0; only[i]; i++)
        if (strcmp(only[i], name) == 0) return 1;
    return 0;
}

/* Writes "a, b, c" (the strings of a NULL-terminated list) into buf, cut to len. */
static void join_names(char *buf, size_t len, const char *const *names) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; names[i] && used < len; i++) {
        int r = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
        if (r < 0) break;
        used += (size_t)r;
    }
}

/* Fills a from one getifaddrs entry; returns 0, or -1 if the address cannot be written. */
static int addr_from_ifa(hvd_addr *a, const struct ifaddrs *ifa, const char *dev, uint16_t port) {
    memset(a, 0, sizeof *a);
    snprintf(a->ifname, sizeof a->ifname, "%s", dev);
    a->port = port;
    if (ifa->ifa_addr->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ifa->ifa_addr;
        return inet_ntop(AF_INET, &sin->sin_addr, a->host, sizeof a->host) ? 0 : -1;
    }
    const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ifa->ifa_addr;
    if (!inet_ntop(AF_INET6, &sin6->sin6_addr, a->host, sizeof a->host)) return -1;
    if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) {
        /* A link-local address means nothing without its interface. */
        size_t used = strlen(a->host);
        int r = snprintf(a->host + used, sizeof a->host - used, "%%%s", dev);
        if (r < 0 || (size_t)r >= sizeof a->host - used) return -1;
    }
    return 0;
}

int hvd_local_addrs(hvd_addr **out, size_t *n, uint16_t port, const char *const *only,
                    hvd_err *err) {
    *out = NULL;
    *n = 0;
    struct ifaddrs *list;
    if (getifaddrs(&list) != 0) {
        return hvd_err_set(err, HVD_E_IO, "listing the network interfaces failed: %s",
                           strerror(errno));
    }

    size_t total = 0;
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next)
        if (usable(ifa)) total++;
    hvd_addr *addrs = calloc(total ? total : 1, sizeof *addrs);
    /* Device names in the order the kernel lists them (link entries come first). */
    size_t ndev = 0, cap = 0;
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next)
        cap++;
    char(*devs)[HVD_IFNAME_MAX] = calloc(cap ? cap : 1, sizeof *devs);
    if (!addrs || !devs) {
        free(addrs);
        free(devs);
        freeifaddrs(list);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory listing network interfaces");
    }
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        char dev[HVD_IFNAME_MAX];
        device_name(dev, ifa->ifa_name);
        size_t i = 0;
        while (i < ndev && strcmp(devs[i], dev) != 0)
            i++;
        if (i == ndev) memcpy(devs[ndev++], dev, sizeof dev);
    }

    /* Per device: IPv4 addresses, then IPv6, each in kernel order. */
    size_t count = 0;
    static const int families[2] = {AF_INET, AF_INET6};
    for (size_t d = 0; d < ndev; d++) {
        if (!wanted(devs[d], only)) continue;
        for (int f = 0; f < 2; f++) {
            for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
                if (!usable(ifa) || ifa->ifa_addr->sa_family != families[f]) continue;
                char dev[HVD_IFNAME_MAX];
                device_name(dev, ifa->ifa_name);
                if (strcmp(dev, devs[d]) != 0) continue;
                if (addr_from_ifa(&addrs[count], ifa, dev, port) == 0) count++;
            }
        }
    }
    if (count == 0) {
        /* Name the filter and what it could have matched. */
        char names[256], up[256];
        names[0] = '\0';
        if (only) join_names(names, sizeof names, only);
        size_t used = 0;
        up[0] = '\0';
        for (size_t d = 0; d < ndev && used < sizeof up; d++) {
            int has = 0;
            for (struct ifaddrs *ifa = list; ifa && !has; ifa = ifa->ifa_next) {
                char dev[HVD_IFNAME_MAX];
                device_name(dev, ifa->ifa_name);
                has = usable(ifa) && strcmp(dev, devs[d]) == 0;
            }
            if (!has) continue;
            int r = snprintf(up + used, sizeof up - used, "%s%s", used ? ", " : "", devs[d]);
            if (r < 0) break;
            used += (size_t)r;
        }
        free(addrs);
        free(devs);
        freeifaddrs(list);
        if (!only) {
            return hvd_err_set(err, HVD_E_NOT_FOUND,
                               "no network interface that is up has an IPv4 or IPv6 address");
        }
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "no interface in the filter [%s] is up with an IPv4 or IPv6 "
                           "address (interfaces up with addresses: %s)",
                           names, used ? up : "none");
    }
    free(devs);
    freeifaddrs(list);
    *out = addrs;
    *n = count;
    return 0;
}

static bool numeric_ip(const char *s) {
    struct in6_addr a6;
    struct in_addr a4;
    char plain[HVD_HOST_MAX];
    snprintf(plain, sizeof plain, "%s", s);
    char *scope = strchr(plain, '%'); /* fe80::1%eth0 */
    if (scope) *scope = '\0';
    return inet_pton(AF_INET, plain, &a4) == 1 || inet_pton(AF_INET6, plain, &a6) == 1;
}

int hvd_bind_resolve(const char *spec, char *out, size_t len, hvd_err *err) {
    if (!spec || !*spec || !strcmp(spec, "*") || !strcmp(spec, "0.0.0.0") || !strcmp(spec, "::")) {
        snprintf(out, len, "%s", "");
        return 0;
    }
    if (strlen(spec) >= HVD_HOST_MAX || strlen(spec) >= len)
        return hvd_err_set(err, HVD_E_INVALID, "bind address '%.64s...' is too long", spec);
    if (numeric_ip(spec)) {
        snprintf(out, len, "%s", spec);
        return 0;
    }
    const char *only[2] = {spec, NULL};
    hvd_addr *a;
    size_t n;
    if (hvd_local_addrs(&a, &n, 0, only, err) != 0) {
        hvd_err_prefix(err,
                       "bind address '%.64s' is neither a numeric IP nor an interface: ", spec);
        return -1;
    }
    snprintf(out, len, "%s", a[0].host);
    free(a);
    return 0;
}

/* ---- Text form -------------------------------------------------------------------------- */

char *hvd_addr_str(const hvd_addr *a, char *buf, size_t len) {
    if (len == 0) return buf;
    int h = (int)strnlen(a->host, sizeof a->host);
    if (memchr(a->host, ':', (size_t)h)) /* IPv6 */
        snprintf(buf, len, "[%.*s]:%u", h, a->host, (unsigned)a->port);
    else
        snprintf(buf, len, "%.*s:%u", h, a->host, (unsigned)a->port);
    return buf;
}

char *hvd_addrs_format(const hvd_addr *addrs, size_t n) {
    /* Longest entry: ifname (15) '=' '[' host (63) ']' ':' port (5) ',' */
    const size_t entry_max = HVD_IFNAME_MAX + HVD_HOST_MAX + 10;
    if (n > (SIZE_MAX - 1) / entry_max) return NULL;
    size_t cap = n * entry_max + 1;
    char *s = malloc(cap);
    if (!s) return NULL;
    size_t used = 0;
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const hvd_addr *a = &addrs[i];
        int ifn = (int)strnlen(a->ifname, sizeof a->ifname);
        char hp[HVD_HOST_MAX + 16];
        hvd_addr_str(a, hp, sizeof hp);
        int r = snprintf(s + used, cap - used, "%s%.*s%s%s", i ? "," : "", ifn, a->ifname,
                         ifn ? "=" : "", hp);
        if (r < 0 || (size_t)r >= cap - used) {
            free(s);
            return NULL;
        }
        used += (size_t)r;
    }
    return s;
}

/* Parses a port: 1..5 decimal digits without sign or leading zero, value 1..65535. */
static int parse_port(const char *s, size_t n, uint16_t *port) {
    if (n == 0 || n > 5 || s[0] == '0') return -1;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v < 1 || v > 65535) return -1;
    *port = (uint16_t)v;
    return 0;
}

/* Writes the reason into why and returns -1. */
static int reason(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int reason(char *why, size_t why_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return -1;
}

/* The optional "ifname=" prefix of *s: into a->ifname, *s and *n moved past it. */
static int parse_ifname(const char **s, size_t *n, hvd_addr *a, char *why, size_t why_len) {
    const char *eq = memchr(*s, '=', *n);
    if (!eq) return 0;
    size_t ifn = (size_t)(eq - *s);
    if (ifn == 0) return reason(why, why_len, "the interface name before '=' is empty");
    if (ifn >= HVD_IFNAME_MAX)
        return reason(why, why_len, "the interface name is %zu characters, at most %d allowed", ifn,
                      HVD_IFNAME_MAX - 1);
    if (!valid_ifname(*s, ifn))
        return reason(why, why_len,
                      "the interface name may not contain spaces, control characters or any "
                      "of =,:[]%%/");
    memcpy(a->ifname, *s, ifn);
    a->ifname[ifn] = '\0';
    *n -= ifn + 1;
    *s = eq + 1;
    return 0;
}

/* Where the host and the port of "host:port" or "[v6]:port" are. */
typedef struct host_port {
    const char *host, *port;
    size_t hn, pn;
    bool v6;
} host_port;

static int split_host_port(const char *s, size_t n, host_port *hp, char *why, size_t why_len) {
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) return reason(why, why_len, "'[' without a matching ']'");
        size_t rest = n - (size_t)(close + 1 - s);
        if (rest == 0 || close[1] != ':')
            return reason(why, why_len, "no \":port\" after the bracketed address");
        *hp = (host_port){s + 1, close + 2, (size_t)(close - s - 1), rest - 1, true};
    } else {
        const char *colon = memchr(s, ':', n);
        if (!colon) return reason(why, why_len, "no \":port\" (expected host:port)");
        size_t hn = (size_t)(colon - s);
        *hp = (host_port){s, colon + 1, hn, n - hn - 1, false};
        if (memchr(hp->port, ':', hp->pn))
            return reason(why, why_len, "an IPv6 address must be written in brackets: [addr]:port");
    }
    if (hp->hn == 0) return reason(why, why_len, "the host is empty");
    return 0;
}

/* The host as a numeric address (inet_pton) in its canonical text form into a->host, so that
 * addresses compare equal as strings; an IPv6 scope ("%eth0") is kept. */
static int canonical_host(const host_port *hp, hvd_addr *a, char *why, size_t why_len) {
    char tmp[HVD_HOST_MAX];
    if (hp->hn >= sizeof tmp)
        return reason(why, why_len, "the host is too long for a numeric IP address");
    memcpy(tmp, hp->host, hp->hn);
    tmp[hp->hn] = '\0';
    if (!hp->v6) {
        struct in_addr in4;
        if (inet_pton(AF_INET, tmp, &in4) != 1)
            return reason(why, why_len,
                          "the host is not a numeric IPv4 address (names are not resolved; IPv6 "
                          "goes in brackets)");
        inet_ntop(AF_INET, &in4, a->host, sizeof a->host);
        return 0;
    }
    char *pct = strchr(tmp, '%');
    const char *scope = NULL;
    if (pct) {
        *pct = '\0';
        scope = pct + 1;
        if (!valid_ifname(scope, strlen(scope)))
            return reason(why, why_len,
                          "the IPv6 scope after '%%' must be an interface name of 1 to %d "
                          "characters",
                          HVD_IFNAME_MAX - 1);
    }
    struct in6_addr in6;
    if (inet_pton(AF_INET6, tmp, &in6) != 1)
        return reason(why, why_len, "the bracketed host is not a numeric IPv6 address");
    inet_ntop(AF_INET6, &in6, a->host, sizeof a->host);
    if (scope) {
        size_t used = strlen(a->host);
        /* Fits: 45 (longest IPv6 text) + '%' + 15 < HVD_HOST_MAX. */
        snprintf(a->host + used, sizeof a->host - used, "%%%s", scope);
    }
    return 0;
}

/* Parses one entry s[0..n) into a. On failure writes the reason into why. */
static int parse_entry(const char *s, size_t n, hvd_addr *a, char *why, size_t why_len) {
    memset(a, 0, sizeof *a);
    if (n == 0) return reason(why, why_len, "it is empty");
    host_port hp = {NULL, NULL, 0, 0, false};
    if (parse_ifname(&s, &n, a, why, why_len) != 0 || split_host_port(s, n, &hp, why, why_len) != 0)
        return -1;
    if (parse_port(hp.port, hp.pn, &a->port) != 0)
        return reason(why, why_len, "the port must be a decimal number from 1 to 65535");
    return canonical_host(&hp, a, why, why_len);
}

int hvd_addrs_parse(const char *text, hvd_addr **out, size_t *n, hvd_err *err) {
    *out = NULL;
    *n = 0;
    if (!text || !*text) return hvd_err_set(err, HVD_E_INVALID, "the address list is empty");
    size_t entries = 1;
    for (const char *p = text; *p; p++)
        if (*p == ',') entries++;
    hvd_addr *addrs = calloc(entries, sizeof *addrs);
    if (!addrs) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory parsing an address list");

    const char *p = text;
    for (size_t i = 0; i < entries; i++) {
        size_t len = strcspn(p, ",");
        char why[160];
        if (parse_entry(p, len, &addrs[i], why, sizeof why) != 0) {
            char q[QUOTE_MAX + 4];
            quote(q, p, len);
            free(addrs);
            return hvd_err_set(err, HVD_E_INVALID,
                               "address list entry %zu \"%s\" is invalid: %s (expected "
                               "[ifname=]host:port, e.g. eth0=10.0.0.2:4000 or "
                               "eth0=[fe80::1%%eth0]:4000)",
                               i + 1, q, why);
        }
        p += len + (p[len] == ',');
    }
    *out = addrs;
    *n = entries;
    return 0;
}
