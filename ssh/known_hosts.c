/* OpenSSH known_hosts lookup and append; see ssh/known_hosts.h for the format. */
#include "ssh/known_hosts.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/io.h"

#define KH_LINE_MAX   65536 /* longer lines are skipped (an RSA-16384 entry is ~2.8 KiB) */
#define KH_HASH_MAGIC "|1|" /* prefix of a hashed host name */
#define KH_SHA1_LEN   20    /* salt and HMAC-SHA1 length in hashed names */

/* Decodes padded base64 of inlen characters into a new buffer. Returns its length (and the
 * buffer in *out, to be freed), or -1 if the text is not valid base64. */
static long b64_decode(const char *in, size_t inlen, unsigned char **out) {
    if (inlen == 0 || inlen % 4 != 0 || inlen > KH_LINE_MAX) return -1;
    unsigned char *buf = malloc(inlen / 4 * 3 + 1);
    if (!buf) return -1;
    int n = EVP_DecodeBlock(buf, (const unsigned char *)in, (int)inlen);
    if (n < 0) {
        free(buf);
        return -1;
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    if (in[inlen - 1] == '=') n--;
    if (in[inlen - 2] == '=') n--;
    *out = buf;
    return n;
}

/* Encodes len bytes as padded base64 into a new NUL-terminated string, or NULL. */
static char *b64_encode(const unsigned char *in, size_t len) {
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, in, (int)len);
    return out;
}

int hvd_kh_host_name(const char *host, int port, char *out, size_t outlen) {
    int n = (port == 22 || port <= 0) ? snprintf(out, outlen, "%s", host)
                                      : snprintf(out, outlen, "[%s]:%d", host, port);
    if (n < 0 || (size_t)n >= outlen) return -1;
    for (char *p = out; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
}

int hvd_kh_blob_type(const unsigned char *blob, size_t blob_len, char *out, size_t outlen) {
    if (blob_len < 4) return -1;
    size_t n = ((size_t)blob[0] << 24) | ((size_t)blob[1] << 16) | ((size_t)blob[2] << 8) | blob[3];
    if (n == 0 || n > blob_len - 4 || n >= outlen) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = blob[4 + i];
        if (!isalnum(c) && c != '-' && c != '@' && c != '.' && c != '_') return -1;
    }
    memcpy(out, blob + 4, n);
    out[n] = '\0';
    return 0;
}

int hvd_kh_fingerprint(const unsigned char *blob, size_t blob_len, char *out, size_t outlen) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (outlen < 52 || !EVP_Digest(blob, blob_len, md, &mdlen, EVP_sha256(), NULL)) return -1;
    char b64[64];
    EVP_EncodeBlock((unsigned char *)b64, md, (int)mdlen);
    char *eq = strchr(b64, '=');
    if (eq) *eq = '\0';
    snprintf(out, outlen, "SHA256:%s", b64);
    return 0;
}

/* OpenSSH's match_pattern(): `*` matches any run of characters, `?` exactly one. */
static bool glob_match(const char *s, const char *p, size_t plen) {
    size_t si = 0, pi = 0, star_p = (size_t)-1, star_s = 0, slen = strlen(s);
    while (si < slen) {
        if (pi < plen && (p[pi] == '?' || p[pi] == s[si])) {
            si++;
            pi++;
        } else if (pi < plen && p[pi] == '*') {
            star_p = pi++;
            star_s = si;
        } else if (star_p != (size_t)-1) {
            pi = star_p + 1;
            si = ++star_s;
        } else {
            return false;
        }
    }
    while (pi < plen && p[pi] == '*')
        pi++;
    return pi == plen;
}

/* OpenSSH's match_hostname() on a comma-separated pattern list: true if some positive
 * pattern matches and no negated one does. name is already lower case. */
static bool patterns_match(const char *name, char *list) {
    bool positive = false;
    for (char *p = list; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    for (char *pat = list; pat && *pat;) {
        char *comma = strchr(pat, ',');
        size_t len = comma ? (size_t)(comma - pat) : strlen(pat);
        bool neg = len > 0 && pat[0] == '!';
        if (neg ? glob_match(name, pat + 1, len - 1) : glob_match(name, pat, len)) {
            if (neg) return false;
            positive = true;
        }
        pat = comma ? comma + 1 : NULL;
    }
    return positive;
}

/* Does the hashed entry "|1|salt|hash" name `name`? */
static bool hashed_match(const char *name, const char *entry) {
    const char *salt64 = entry + strlen(KH_HASH_MAGIC);
    const char *bar = strchr(salt64, '|');
    if (!bar) return false;
    unsigned char *salt = NULL, *hash = NULL;
    long saltlen = b64_decode(salt64, (size_t)(bar - salt64), &salt);
    long hashlen = saltlen < 0 ? -1 : b64_decode(bar + 1, strlen(bar + 1), &hash);
    bool ok = false;
    if (saltlen == KH_SHA1_LEN && hashlen == KH_SHA1_LEN) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        if (HMAC(EVP_sha1(), salt, (int)saltlen, (const unsigned char *)name, strlen(name), md,
                 &mdlen) &&
            mdlen == KH_SHA1_LEN)
            ok = memcmp(md, hash, KH_SHA1_LEN) == 0;
    }
    free(salt);
    free(hash);
    return ok;
}

/* Splits off the next whitespace-separated field of *p (NUL-terminating it), or NULL. */
static char *next_field(char **p) {
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0' || *s == '\n' || *s == '\r') return NULL;
    char *start = s;
    while (*s && *s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
        s++;
    if (*s) *s++ = '\0';
    *p = s;
    return start;
}

static void add_type(char *types, const char *type) {
    size_t tl = strlen(type);
    for (const char *t = types; *t;) { /* already listed? */
        const char *comma = strchr(t, ',');
        size_t len = comma ? (size_t)(comma - t) : strlen(t);
        if (len == tl && strncmp(t, type, tl) == 0) return;
        t = comma ? comma + 1 : t + len;
    }
    size_t used = strlen(types);
    if (used + (used ? 1 : 0) + tl + 1 > HVD_KH_TYPES_MAX) return;
    snprintf(types + used, HVD_KH_TYPES_MAX - used, "%s%s", used ? "," : "", type);
}

/* What one file contributed to a lookup. */
typedef struct kh_scan {
    const char *name;             /* host name as known_hosts spells it */
    const unsigned char *key;     /* server key blob, or NULL */
    size_t key_len;               /* its length */
    char key_type[64];            /* its type */
    bool revoked, match, changed; /* first line of each kind found so far */
} kh_scan;

/* Remembers the deciding line; a later, stronger kind (MATCH over CHANGED, REVOKED over both)
 * overwrites it. */
static void record(hvd_kh_result *res, const char *file, int line) {
    snprintf(res->file, sizeof(res->file), "%s", file);
    res->line = line;
}

static int scan_file(const char *file, kh_scan *sc, hvd_kh_result *res, hvd_err *err) {
    FILE *f = fopen(file, "re");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        return hvd_err_set(err, HVD_E_IO, "cannot read known_hosts file %s: %s", file,
                           strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > KH_LINE_MAX) continue;
        char *p = line;
        char *hosts = next_field(&p);
        if (!hosts || hosts[0] == '#') continue;
        bool revoked = false;
        if (hosts[0] == '@') {
            if (strcmp(hosts, "@revoked") != 0) continue; /* @cert-authority, unknown */
            revoked = true;
            if (!(hosts = next_field(&p))) continue;
        }
        char *type = next_field(&p);
        char *key64 = type ? next_field(&p) : NULL;
        if (!key64) continue;
        bool named = strncmp(hosts, KH_HASH_MAGIC, strlen(KH_HASH_MAGIC)) == 0
                         ? hashed_match(sc->name, hosts)
                         : patterns_match(sc->name, hosts);
        if (!named) continue;
        unsigned char *blob = NULL;
        long blen = b64_decode(key64, strlen(key64), &blob);
        char btype[64];
        if (blen < 0 || hvd_kh_blob_type(blob, (size_t)blen, btype, sizeof(btype)) < 0 ||
            strcmp(btype, type) != 0) {
            free(blob); /* not a valid entry: skipped, as OpenSSH does */
            continue;
        }
        bool same = sc->key && (size_t)blen == sc->key_len && memcmp(blob, sc->key, blen) == 0;
        free(blob);
        if (revoked) {
            if (same && !sc->revoked) {
                sc->revoked = true;
                record(res, file, lineno);
            }
            continue;
        }
        add_type(res->types, btype);
        if (sc->revoked || !sc->key) continue;
        if (same && !sc->match) {
            sc->match = true;
            record(res, file, lineno);
        } else if (!same && !sc->match && !sc->changed && strcmp(btype, sc->key_type) == 0) {
            sc->changed = true;
            record(res, file, lineno);
        }
    }
    free(line);
    bool failed = ferror(f);
    fclose(f);
    if (failed) return hvd_err_set(err, HVD_E_IO, "error reading known_hosts file %s", file);
    return 0;
}

int hvd_kh_lookup(const char *const *files, size_t nfiles, const char *host, int port,
                  const unsigned char *key, size_t key_len, hvd_kh_result *res, hvd_err *err) {
    char name[1024];
    memset(res, 0, sizeof(*res));
    if (hvd_kh_host_name(host, port, name, sizeof(name)) < 0)
        return hvd_err_set(err, HVD_E_INVALID, "host name %.64s... is too long", host);
    kh_scan sc = {.name = name, .key = key, .key_len = key_len};
    if (key && hvd_kh_blob_type(key, key_len, sc.key_type, sizeof(sc.key_type)) < 0)
        return hvd_err_set(err, HVD_E_PROTOCOL, "the server's host key is malformed");
    for (size_t i = 0; i < nfiles; i++) {
        if (!files[i]) continue;
        if (scan_file(files[i], &sc, res, err) < 0) return -1;
        if (sc.revoked) break;
    }
    if (sc.revoked)
        res->status = HVD_KH_REVOKED;
    else if (sc.match)
        res->status = HVD_KH_MATCH;
    else if (sc.changed)
        res->status = HVD_KH_CHANGED;
    else
        res->status = res->types[0] ? HVD_KH_OTHER_TYPE : HVD_KH_UNKNOWN;
    return 0;
}

/* "|1|salt|hash" for name, into a new string. */
static char *hash_name(const char *name) {
    unsigned char salt[KH_SHA1_LEN], md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (RAND_bytes(salt, sizeof(salt)) != 1 ||
        !HMAC(EVP_sha1(), salt, sizeof(salt), (const unsigned char *)name, strlen(name), md,
              &mdlen))
        return NULL;
    char *s64 = b64_encode(salt, sizeof(salt)), *h64 = b64_encode(md, mdlen), *out = NULL;
    if (s64 && h64 && asprintf(&out, KH_HASH_MAGIC "%s|%s", s64, h64) < 0) out = NULL;
    free(s64);
    free(h64);
    return out;
}

/* Creates the parent directory of path (one level, mode 0700) if it is missing. */
static void make_parent_dir(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = '\0';
    (void)mkdir(dir, 0700);
}

int hvd_kh_append(const char *file, const char *host, int port, const unsigned char *key,
                  size_t key_len, bool hash, hvd_err *err) {
    char name[1024], type[64];
    if (hvd_kh_host_name(host, port, name, sizeof(name)) < 0)
        return hvd_err_set(err, HVD_E_INVALID, "host name %.64s... is too long", host);
    if (hvd_kh_blob_type(key, key_len, type, sizeof(type)) < 0)
        return hvd_err_set(err, HVD_E_PROTOCOL, "the server's host key is malformed");
    char *hashed = hash ? hash_name(name) : NULL;
    char *key64 = b64_encode(key, key_len), *entry = NULL;
    if ((hash && !hashed) || !key64 ||
        asprintf(&entry, "%s %s %s\n", hash ? hashed : name, type, key64) < 0)
        entry = NULL;
    free(hashed);
    free(key64);
    if (!entry) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory adding a known_hosts entry");

    int fd = open(file, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
        make_parent_dir(file);
        fd = open(file, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        free(entry);
        return hvd_err_set(err, HVD_E_IO, "cannot open known_hosts file %s: %s", file,
                           strerror(errno));
    }
    int rc = 0;
    struct stat st;
    char last = '\n';
    /* Concurrent agents (mpirun starts one per host at once) must not interleave lines. */
    while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
    }
    if (fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1)
        last = '\n';
    if ((last != '\n' && hvd_write_all(fd, "\n", 1) < 0) ||
        hvd_write_all(fd, entry, strlen(entry)) < 0)
        rc = hvd_err_set(err, HVD_E_IO, "cannot write known_hosts file %s: %s", file,
                         strerror(errno));
    (void)flock(fd, LOCK_UN);
    if (close(fd) < 0 && rc == 0)
        rc = hvd_err_set(err, HVD_E_IO, "cannot write known_hosts file %s: %s", file,
                         strerror(errno));
    free(entry);
    return rc;
}
