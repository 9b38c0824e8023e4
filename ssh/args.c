/* ssh-style command line parsing; see ssh/args.h. */
#include "ssh/args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/hostspec.h"

#define USAGE "usage: hvd-rsh [options] [user@]host [options] command..."

/* OpenSSH 9.x client flags: without an argument, and with one. */
static const char flags_noarg[] = "46AaCfGgKkMNnqsTtVvXxYy";
static const char flags_arg[] = "BbcDEeFIiJLlmOoPpQRSWw";

void hvd_ssh_args_free(hvd_ssh_args *a) {
    if (!a) return;
    free(a->host);
    free(a->user);
    free(a->command);
    for (size_t i = 0; i < a->n_identity_files; i++)
        free(a->identity_files[i]);
    for (size_t i = 0; i < a->n_user_known_hosts; i++)
        free(a->user_known_hosts[i]);
    for (size_t i = 0; i < a->n_global_known_hosts; i++)
        free(a->global_known_hosts[i]);
    memset(a, 0, sizeof(*a));
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Parses a whole decimal string into [lo, hi]. Returns 0, or -1. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_port(const char *s, int *port, hvd_err *err) {
    long v;
    if (parse_int(s, 1, 65535, &v) < 0)
        return hvd_err_set(err, HVD_E_INVALID, "bad port '%s': a port is a number from 1 to 65535",
                           s);
    if (*port == 0) *port = (int)v;
    return 0;
}

/* OpenSSH's convtime() for ConnectTimeout: "30", "30s", "2m", "1h", "1m30s". */
static int parse_seconds(const char *s, long *out) {
    long total = 0;
    if (!*s) return -1;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0) return -1;
        long mult = 1;
        switch (*end) {
        case '\0':
            break;
        case 's':
        case 'S':
            end++;
            break;
        case 'm':
        case 'M':
            mult = 60;
            end++;
            break;
        case 'h':
        case 'H':
            mult = 3600;
            end++;
            break;
        default:
            return -1;
        }
        if (v > (INT_MAX / 1000 - total) / mult) return -1;
        total += v * mult;
        s = end;
    }
    *out = total;
    return 0;
}

/* Host names must be printable and must not look like an option. */
static int check_host(const char *h, size_t n, hvd_err *err) {
    if (n == 0) return hvd_err_set(err, HVD_E_INVALID, "empty host name; " USAGE);
    if (h[0] == '-')
        return hvd_err_set(err, HVD_E_INVALID, "host name '%.*s' looks like an option", (int)n, h);
    for (size_t i = 0; i < n; i++)
        if (!isgraph((unsigned char)h[i]) || h[i] == '\'' || h[i] == '"' || h[i] == '`')
            return hvd_err_set(err, HVD_E_INVALID, "bad character in host name '%.*s'", (int)n, h);
    return 0;
}

static int set_user(hvd_ssh_args *a, const char *u, size_t n, hvd_err *err) {
    if (n == 0) return hvd_err_set(err, HVD_E_INVALID, "empty user name");
    if (a->user) return 0; /* first value wins */
    if (!(a->user = dup_n(u, n))) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    return 0;
}

/* ssh://[user@]host[:port][/]: the host and port part is a host spec (common/hostspec.h,
 * IPv6 addresses in brackets). The last '@' ends the user name, as in OpenSSH. */
static int parse_ssh_url(hvd_ssh_args *a, const char *d, hvd_err *err) {
    const char *auth = d + 6;
    size_t alen = strcspn(auth, "/");
    if (auth[alen] == '/' && auth[alen + 1] != '\0')
        return hvd_err_set(err, HVD_E_INVALID, "ssh:// destination '%s' must not have a path", d);
    const char *at = memrchr(auth, '@', alen);
    const char *hostport = at ? at + 1 : auth;
    hvd_hostspec hs;
    if (hvd_hostspec_parse(hostport, (size_t)(auth + alen - hostport), "port", 1, 65535, &hs, err) <
        0)
        return hvd_err_prefix(err, "bad ssh:// destination '%s': ", d);
    if (check_host(hs.host, strlen(hs.host), err) < 0) return -1;
    if (at && set_user(a, auth, (size_t)(at - auth), err) < 0) return -1;
    if (hs.number > 0 && a->port == 0) a->port = (int)hs.number;
    if (!(a->host = strdup(hs.host))) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    return 0;
}

/* [user@]host (the last '@' ends the user name; the host is taken whole, as OpenSSH does:
 * no port here), or an ssh:// URL. */
static int parse_destination(hvd_ssh_args *a, const char *d, hvd_err *err) {
    if (strncmp(d, "ssh://", 6) == 0) return parse_ssh_url(a, d, err);
    const char *at = strrchr(d, '@'), *host = at ? at + 1 : d;
    size_t hlen = strlen(host);
    if (check_host(host, hlen, err) < 0) return -1;
    if (at && set_user(a, d, (size_t)(at - d), err) < 0) return -1;
    if (!(a->host = dup_n(host, hlen))) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    return 0;
}

static int add_to_list(char **list, size_t *n, const char *s, size_t len, const char *what,
                       hvd_err *err) {
    if (*n >= HVD_SSH_ARGS_LIST_MAX)
        return hvd_err_set(err, HVD_E_INVALID, "too many %s (at most %d)", what,
                           HVD_SSH_ARGS_LIST_MAX);
    if (len >= 2 && s[0] == '"' && s[len - 1] == '"') { /* -o 'IdentityFile="a b"' */
        s++;
        len -= 2;
    }
    if (!(list[*n] = dup_n(s, len))) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    (*n)++;
    return 0;
}

/* A whitespace-separated list of files, stored once (first value wins). */
static int set_file_list(char **list, size_t *n, const char *v, const char *what, hvd_err *err) {
    if (*n > 0) return 0;
    while (*v) {
        v += strspn(v, " \t");
        size_t len = strcspn(v, " \t");
        if (len && add_to_list(list, n, v, len, what, err) < 0) return -1;
        v += len;
    }
    return 0;
}

static int yes_no(const char *v) {
    if (!strcasecmp(v, "yes") || !strcasecmp(v, "true")) return 1;
    if (!strcasecmp(v, "no") || !strcasecmp(v, "false")) return 0;
    return -1;
}

/* -o KEY=VALUE or -o "KEY VALUE". */
static int parse_o(hvd_ssh_args *a, const char *opt, hvd_err *err) {
    opt += strspn(opt, " \t");
    size_t klen = strcspn(opt, "= \t");
    char key[64];
    if (klen == 0 || klen >= sizeof(key))
        return hvd_err_set(err, HVD_E_INVALID, "bad -o option '%s'", opt);
    memcpy(key, opt, klen);
    key[klen] = '\0';
    const char *v = opt + klen;
    v += strspn(v, " \t");
    if (*v == '=') v++;
    v += strspn(v, " \t");
    char val[4096];
    size_t vlen = strlen(v);
    while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;
    if (vlen == 0) return hvd_err_set(err, HVD_E_INVALID, "-o %s: missing value", key);
    if (vlen >= sizeof(val)) return hvd_err_set(err, HVD_E_INVALID, "-o %s: value too long", key);
    memcpy(val, v, vlen);
    val[vlen] = '\0';

    if (!strcasecmp(key, "Port")) return parse_port(val, &a->port, err);
    if (!strcasecmp(key, "User")) return set_user(a, val, vlen, err);
    if (!strcasecmp(key, "IdentityFile"))
        return add_to_list(a->identity_files, &a->n_identity_files, val, vlen, "identity files",
                           err);
    if (!strcasecmp(key, "UserKnownHostsFile"))
        return set_file_list(a->user_known_hosts, &a->n_user_known_hosts, val, "known_hosts files",
                             err);
    if (!strcasecmp(key, "GlobalKnownHostsFile"))
        return set_file_list(a->global_known_hosts, &a->n_global_known_hosts, val,
                             "known_hosts files", err);
    if (!strcasecmp(key, "HashKnownHosts")) {
        int b = yes_no(val);
        if (b < 0)
            return hvd_err_set(err, HVD_E_INVALID, "-o HashKnownHosts: bad value '%s' (yes or no)",
                               val);
        if (a->hash_known_hosts < 0) a->hash_known_hosts = b;
        return 0;
    }
    if (!strcasecmp(key, "ConnectTimeout")) {
        long s;
        if (!strcasecmp(val, "none"))
            s = 0;
        else if (parse_seconds(val, &s) < 0)
            return hvd_err_set(err, HVD_E_INVALID, "-o ConnectTimeout: bad time '%s'", val);
        if (a->connect_timeout_ms == 0) a->connect_timeout_ms = (int)(s * 1000);
        return 0;
    }
    if (!strcasecmp(key, "StrictHostKeyChecking")) {
        hvd_ssh_hostkey_policy p;
        if (!strcasecmp(val, "accept-new") || !strcasecmp(val, "no") || !strcasecmp(val, "off") ||
            !strcasecmp(val, "false"))
            p = HVD_SSH_HOSTKEY_ACCEPT_NEW;
        else if (!strcasecmp(val, "yes") || !strcasecmp(val, "ask") || !strcasecmp(val, "true"))
            p = HVD_SSH_HOSTKEY_STRICT;
        else
            return hvd_err_set(err, HVD_E_INVALID,
                               "-o StrictHostKeyChecking: bad value '%s' (yes, accept-new or no)",
                               val);
        if (a->hostkey_policy == HVD_SSH_HOSTKEY_UNSET) a->hostkey_policy = p;
        return 0;
    }
    return 0; /* any other ssh_config keyword: accepted and ignored */
}

/* One option letter c with its argument (NULL for flags). */
static int apply_option(hvd_ssh_args *a, char c, const char *arg, hvd_err *err) {
    switch (c) {
    case 'p':
        return parse_port(arg, &a->port, err);
    case 'l':
        return set_user(a, arg, strlen(arg), err);
    case 'i':
        return add_to_list(a->identity_files, &a->n_identity_files, arg, strlen(arg),
                           "identity files", err);
    case 'o':
        return parse_o(a, arg, err);
    case 'q':
        a->quiet = true;
        return 0;
    case 'v':
        a->verbose++;
        return 0;
    default:
        return 0; /* -x and the rest: accepted and ignored */
    }
}

/* Parses one "-abc" / "-pVALUE" / "-p VALUE" word at argv[*i], advancing *i past what it
 * consumed. */
static int parse_option_word(hvd_ssh_args *a, int argc, char *const argv[], int *i, hvd_err *err) {
    const char *w = argv[*i];
    for (size_t j = 1; w[j]; j++) {
        char c = w[j];
        if (strchr(flags_arg, c)) {
            const char *arg = w[j + 1] ? &w[j + 1] : NULL;
            if (!arg) {
                if (*i + 1 >= argc)
                    return hvd_err_set(err, HVD_E_INVALID, "option -%c needs an argument", c);
                arg = argv[++*i];
            }
            (*i)++;
            return apply_option(a, c, arg, err);
        }
        if (!strchr(flags_noarg, c))
            return hvd_err_set(err, HVD_E_INVALID, "unknown option -%c; " USAGE,
                               isprint((unsigned char)c) ? c : '?');
        if (apply_option(a, c, NULL, err) < 0) return -1;
    }
    (*i)++;
    return 0;
}

static int join_words(hvd_ssh_args *a, int argc, char *const argv[], int first, hvd_err *err) {
    a->first_word = first;
    if (first >= argc) return 0;
    size_t len = 0;
    for (int i = first; i < argc; i++)
        len += strlen(argv[i]) + 1;
    char *cmd = malloc(len);
    if (!cmd) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    char *p = cmd;
    for (int i = first; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (i > first) *p++ = ' ';
        memcpy(p, argv[i], n);
        p += n;
    }
    *p = '\0';
    a->command = cmd;
    return 0;
}

int hvd_ssh_args_parse(int argc, char *const argv[], hvd_ssh_args *out, hvd_err *err) {
    memset(out, 0, sizeof(*out));
    out->hash_known_hosts = -1;
    int i = 1;
    bool have_host = false;
    while (i < argc) {
        const char *w = argv[i];
        if (w[0] == '-' && w[1] != '\0') {
            if (strcmp(w, "--") == 0) {
                i++;
                if (have_host) break; /* the command follows */
                continue;             /* the host follows, then options again (as ssh) */
            }
            if (parse_option_word(out, argc, argv, &i, err) < 0) goto fail;
        } else if (!have_host) {
            if (parse_destination(out, w, err) < 0) goto fail;
            have_host = true;
            i++;
        } else {
            break; /* first command word */
        }
    }
    if (!have_host) {
        hvd_err_set(err, HVD_E_INVALID, "missing host name; " USAGE);
        goto fail;
    }
    if (join_words(out, argc, argv, i, err) < 0) goto fail;
    return 0;
fail:
    hvd_ssh_args_free(out);
    out->hash_known_hosts = -1;
    return -1;
}
