/* The host hash: the name under which an executor's "host" is known to Open MPI
 * (include/hvd/net.h; Horovod's runner/common/util/host_hash.py and spark/common/util.py). */
#include "hvd/net.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#define NS_DIR "/proc/self/ns"

static int hash_char_ok(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

int hvd_host_hash_valid(const char *s) {
    if (!s) return 0;
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= HVD_HOST_HASH_MAX - 1 || !hash_char_ok(s[n])) return 0;
    return n > 0;
}

/* Checks $HVD_HOST_HASH and copies it to out; the error names what is wrong with it. */
static int use_override(char out[HVD_HOST_HASH_MAX], const char *v, hvd_err *err) {
    size_t n = strlen(v);
    if (n == 0) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "$" HVD_HOST_HASH_ENV " is set but empty: unset it or give a host "
                           "hash of [A-Za-z0-9_-]");
    }
    if (n > HVD_HOST_HASH_MAX - 1) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "$" HVD_HOST_HASH_ENV " is %zu characters long, at most %d allowed", n,
                           HVD_HOST_HASH_MAX - 1);
    }
    for (size_t i = 0; i < n; i++) {
        if (hash_char_ok(v[i])) continue;
        unsigned char c = (unsigned char)v[i];
        char shown[8];
        if (c >= 0x20 && c < 0x7f)
            snprintf(shown, sizeof shown, "'%c'", c);
        else
            snprintf(shown, sizeof shown, "\\x%02x", c);
        return hvd_err_set(err, HVD_E_INVALID,
                           "$" HVD_HOST_HASH_ENV " has the character %s at position %zu; a "
                           "host hash may contain only A-Z a-z 0-9 _ - (Open MPI reads '.' "
                           "as a domain and ':' as a slot count)",
                           shown, i + 1);
    }
    memcpy(out, v, n + 1);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_strv(char **v, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Reads the targets of the links in /proc/self/ns ("net:[4026531833]"), sorted and joined by
 * spaces, into a malloc'd string. Returns NULL with err on failure. */
static char *ns_links(hvd_err *err) {
    DIR *d = opendir(NS_DIR);
    if (!d) {
        hvd_err_set(err, HVD_E_IO,
                    "cannot list " NS_DIR " to compute the host hash: %s (is /proc mounted? "
                    "set $" HVD_HOST_HASH_ENV " to override)",
                    strerror(errno));
        return NULL;
    }
    char **links = NULL;
    size_t n = 0, cap = 0, total = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char target[PATH_MAX];
        ssize_t r = readlinkat(dirfd(d), de->d_name, target, sizeof target - 1);
        if (r < 0) {
            hvd_err_set(err, HVD_E_IO, "cannot read the link " NS_DIR "/%s: %s", de->d_name,
                        strerror(errno));
            goto fail;
        }
        target[r] = '\0';
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nl = realloc(links, ncap * sizeof *nl);
            if (!nl) goto oom;
            links = nl;
            cap = ncap;
        }
        if (!(links[n] = strdup(target))) goto oom;
        n++;
        total += (size_t)r + 1;
        errno = 0;
    }
    if (errno != 0) {
        hvd_err_set(err, HVD_E_IO, "cannot list " NS_DIR ": %s", strerror(errno));
        goto fail;
    }
    closedir(d);
    d = NULL;

    /* Sorted, unlike Horovod's listdir order, so the result does not depend on the order
     * in which the kernel happens to list the entries. */
    qsort(links, n, sizeof *links, cmp_str);
    char *joined = malloc(total + 1);
    if (!joined) goto oom;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(links[i]);
        if (i) joined[used++] = ' ';
        memcpy(joined + used, links[i], l);
        used += l;
    }
    joined[used] = '\0';
    free_strv(links, n);
    return joined;

oom:
    hvd_err_set(err, HVD_E_INTERNAL, "out of memory computing the host hash");
fail:
    if (d) closedir(d);
    free_strv(links, n);
    return NULL;
}

int hvd_host_hash(char out[HVD_HOST_HASH_MAX], const char *salt, hvd_err *err) {
    const char *override = getenv(HVD_HOST_HASH_ENV);
    if (override) return use_override(out, override, err);

    char host[HOST_NAME_MAX + 1];
    if (gethostname(host, sizeof host) != 0) {
        return hvd_err_set(err, HVD_E_IO, "cannot read the hostname for the host hash: %s",
                           strerror(errno));
    }
    host[sizeof host - 1] = '\0';

    char *ns = ns_links(err);
    if (!ns) return -1;

    /* "<hostname>-<ns links>[-<salt>][-<container id>]" */
    const char *container = getenv("CONTAINER_ID");
    if (container && !*container) container = NULL;
    size_t len = strlen(host) + 1 + strlen(ns) + (salt ? 1 + strlen(salt) : 0) +
                 (container ? 1 + strlen(container) : 0);
    char *info = malloc(len + 1);
    if (!info) {
        free(ns);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory computing the host hash");
    }
    snprintf(info, len + 1, "%s-%s%s%s%s%s", host, ns, salt ? "-" : "", salt ? salt : "",
             container ? "-" : "", container ? container : "");
    free(ns);

    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_Digest(info, len, md, &mdlen, EVP_md5(), NULL);
    free(info);
    if (!ok || mdlen != 16) {
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "MD5 is not available from OpenSSL (FIPS mode?), so the host hash "
                           "cannot be computed; set $" HVD_HOST_HASH_ENV " instead");
    }

    /* The first hostname label, with anything outside [A-Za-z0-9_-] replaced. */
    size_t label = strcspn(host, ".");
    size_t o = 0;
    for (size_t i = 0; i < label; i++)
        out[o++] = hash_char_ok(host[i]) ? host[i] : '_';
    out[o++] = '-';
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < mdlen; i++) {
        out[o++] = hex[md[i] >> 4];
        out[o++] = hex[md[i] & 15];
    }
    out[o] = '\0'; /* at most 64 + 1 + 32 characters */
    return 0;
}
