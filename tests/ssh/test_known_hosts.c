/* Unit tests of ssh/known_hosts.c: OpenSSH's known_hosts format (plain, patterns,
 * negations, [host]:port, hashed names, markers, bad lines), line numbers, appends. Where
 * ssh-keygen is installed, entries are cross-checked with OpenSSH's own `ssh-keygen -F/-H`. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "ssh/known_hosts.h"
#include "testutil.h"

static char tmpdir[256];

/* A fake key blob: string type, string 32 bytes of `fill`. */
static size_t make_blob(unsigned char *out, const char *type, unsigned char fill) {
    size_t tl = strlen(type), n = 0;
    out[n++] = 0, out[n++] = 0, out[n++] = 0, out[n++] = (unsigned char)tl;
    memcpy(out + n, type, tl);
    n += tl;
    out[n++] = 0, out[n++] = 0, out[n++] = 0, out[n++] = 32;
    memset(out + n, fill, 32);
    return n + 32;
}

static void blob_b64(const unsigned char *blob, size_t len, char *out) {
    EVP_EncodeBlock((unsigned char *)out, blob, (int)len);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *read_file(const char *path) {
    static char buf[65536];
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static unsigned char ed_a[128], ed_b[128], ec_a[128];
static size_t ed_a_len, ed_b_len, ec_a_len;
static char ed_a64[256], ed_b64[256], ec_a64[256];

static void setup_keys(void) {
    ed_a_len = make_blob(ed_a, "ssh-ed25519", 0xAA);
    ed_b_len = make_blob(ed_b, "ssh-ed25519", 0xBB);
    ec_a_len = make_blob(ec_a, "ecdsa-sha2-nistp256", 0xCC);
    blob_b64(ed_a, ed_a_len, ed_a64);
    blob_b64(ed_b, ed_b_len, ed_b64);
    blob_b64(ec_a, ec_a_len, ec_a64);
}

static hvd_kh_result lookup1(const char *file, const char *host, int port, const unsigned char *key,
                             size_t len) {
    hvd_kh_result r;
    hvd_err err = {0};
    const char *files[] = {file};
    int rc = hvd_kh_lookup(files, 1, host, port, key, len, &r, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return r;
}

static void test_names(void) {
    char n[64];
    CHECK(hvd_kh_host_name("Host.Example", 22, n, sizeof(n)) == 0 && !strcmp(n, "host.example"));
    CHECK(hvd_kh_host_name("127.0.0.2", 2222, n, sizeof(n)) == 0 && !strcmp(n, "[127.0.0.2]:2222"));
    CHECK(hvd_kh_host_name("::1", 2200, n, sizeof(n)) == 0 && !strcmp(n, "[::1]:2200"));
    CHECK(hvd_kh_host_name("averyveryverylonghostname", 1, n, 8) == -1);
    char t[64];
    CHECK(hvd_kh_blob_type(ed_a, ed_a_len, t, sizeof(t)) == 0 && !strcmp(t, "ssh-ed25519"));
    CHECK(hvd_kh_blob_type(ed_a, 3, t, sizeof(t)) == -1);
    unsigned char bad[8] = {0, 0, 0, 200, 'a', 'b', 'c', 'd'};
    CHECK(hvd_kh_blob_type(bad, sizeof(bad), t, sizeof(t)) == -1);
    char fp[64];
    CHECK(hvd_kh_fingerprint(ed_a, ed_a_len, fp, sizeof(fp)) == 0);
    CHECK(strncmp(fp, "SHA256:", 7) == 0 && strlen(fp) == 7 + 43 && !strchr(fp, '='));
}

static void test_lookup_plain(void) {
    char path[512], text[4096];
    snprintf(path, sizeof(path), "%s/kh_plain", tmpdir);
    snprintf(text, sizeof(text),
             "# comment line\n"                                  /* 1 */
             "\n"                                                /* 2 */
             "other.host ssh-ed25519 %s\n"                       /* 3 */
             "garbage\n"                                         /* 4 */
             "alpha,beta.example,10.0.0.7 ssh-ed25519 %s c\n"    /* 5 */
             "[gamma]:2222 ssh-ed25519 %s\n"                     /* 6 */
             "*.wild.example,!bad.wild.example ssh-ed25519 %s\n" /* 7 */
             "  delta ecdsa-sha2-nistp256 %s\n"                  /* 8 */
             "eps ssh-ed25519 !!notbase64!!\n"                   /* 9 */
             "eps ssh-rsa %s\n"                                  /* 10: type mismatch */
             "@cert-authority zeta ssh-ed25519 %s\n"             /* 11 */
             "Theta ssh-ed25519 %s\n"                            /* 12: case-insensitive */
             "th?ta2 ssh-ed25519 %s",                            /* 13: no final newline */
             ed_b64, ed_a64, ed_a64, ed_a64, ec_a64, ed_a64, ed_a64, ed_a64, ed_a64);
    write_file(path, text);

    hvd_kh_result r = lookup1(path, "beta.example", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 5 && !strcmp(r.file, path));
    r = lookup1(path, "BETA.example", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH);
    r = lookup1(path, "beta.example", 22, ed_b, ed_b_len);
    CHECK(r.status == HVD_KH_CHANGED && r.line == 5);
    r = lookup1(path, "beta.example", 2222, ed_a, ed_a_len); /* other port: other name */
    CHECK(r.status == HVD_KH_UNKNOWN);
    r = lookup1(path, "gamma", 2222, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 6);
    r = lookup1(path, "gamma", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_UNKNOWN);
    r = lookup1(path, "x.wild.example", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 7);
    r = lookup1(path, "bad.wild.example", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_UNKNOWN);
    r = lookup1(path, "delta", 22, ed_a, ed_a_len); /* known only as ECDSA */
    CHECK(r.status == HVD_KH_OTHER_TYPE && !strcmp(r.types, "ecdsa-sha2-nistp256"));
    r = lookup1(path, "delta", 22, ec_a, ec_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 8);
    r = lookup1(path, "eps", 22, ed_a, ed_a_len); /* only bad lines */
    CHECK(r.status == HVD_KH_UNKNOWN);
    r = lookup1(path, "zeta", 22, ed_a, ed_a_len); /* CA lines are not host keys */
    CHECK(r.status == HVD_KH_UNKNOWN);
    r = lookup1(path, "theta", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 12);
    r = lookup1(path, "thxta2", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 13);
    r = lookup1(path, "nobody", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_UNKNOWN && r.types[0] == '\0');
    /* key == NULL: only the types */
    r = lookup1(path, "delta", 22, NULL, 0);
    CHECK(r.status == HVD_KH_OTHER_TYPE && !strcmp(r.types, "ecdsa-sha2-nistp256"));
}

static void test_lookup_precedence(void) {
    char u[512], g[512], text[2048];
    snprintf(u, sizeof(u), "%s/kh_user", tmpdir);
    snprintf(g, sizeof(g), "%s/kh_global", tmpdir);
    /* a stale key first, the right one later: MATCH wins (OpenSSH does the same) */
    snprintf(text, sizeof(text), "h ssh-ed25519 %s\nh ecdsa-sha2-nistp256 %s\n", ed_b64, ec_a64);
    write_file(u, text);
    snprintf(text, sizeof(text), "x ssh-ed25519 %s\nh ssh-ed25519 %s\n", ed_b64, ed_a64);
    write_file(g, text);
    const char *files[] = {u, NULL, "/nonexistent/kh", g};
    hvd_kh_result r;
    hvd_err err = {0};
    CHECK(hvd_kh_lookup(files, 4, "h", 22, ed_a, ed_a_len, &r, &err) == 0);
    CHECK(r.status == HVD_KH_MATCH && !strcmp(r.file, g) && r.line == 2);
    CHECK(!strcmp(r.types, "ssh-ed25519,ecdsa-sha2-nistp256"));
    /* only the user file: the first differing line of the same type is reported */
    CHECK(hvd_kh_lookup(files, 1, "h", 22, ed_a, ed_a_len, &r, &err) == 0);
    CHECK(r.status == HVD_KH_CHANGED && !strcmp(r.file, u) && r.line == 1);

    /* @revoked beats everything */
    snprintf(text, sizeof(text), "h ssh-ed25519 %s\n@revoked * ssh-ed25519 %s\n", ed_a64, ed_a64);
    write_file(u, text);
    CHECK(hvd_kh_lookup(files, 4, "h", 22, ed_a, ed_a_len, &r, &err) == 0);
    CHECK(r.status == HVD_KH_REVOKED && !strcmp(r.file, u) && r.line == 2);
    CHECK(hvd_kh_lookup(files, 4, "h", 22, ed_b, ed_b_len, &r, &err) == 0);
    CHECK(r.status == HVD_KH_CHANGED); /* ed_b is not revoked, differs from line 1 */

    /* an existing but unreadable file is an error (root can read anything: use a directory) */
    const char *dirs[] = {tmpdir};
    CHECK(hvd_kh_lookup(dirs, 1, "h", 22, ed_a, ed_a_len, &r, &err) == -1);
    CHECK(strstr(err.msg, tmpdir) != NULL);
}

static bool have_ssh_keygen(void) {
    return system("command -v ssh-keygen >/dev/null 2>&1") == 0;
}

/* Runs a shell command; returns its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_append(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/newdir/known_hosts", tmpdir);
    hvd_err err = {0};
    CHECK_MSG(hvd_kh_append(path, "127.0.0.2", 2222, ed_a, ed_a_len, false, &err) == 0, "%s",
              err.msg);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    char line[512];
    snprintf(line, sizeof(line), "[127.0.0.2]:2222 ssh-ed25519 %s\n", ed_a64);
    CHECK(!strcmp(read_file(path), line));
    hvd_kh_result r = lookup1(path, "127.0.0.2", 2222, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 1);

    /* a file without a final newline gets one before the new entry */
    char path2[512];
    snprintf(path2, sizeof(path2), "%s/kh_nonl", tmpdir);
    write_file(path2, "# no newline at the end");
    CHECK(hvd_kh_append(path2, "Host9", 22, ec_a, ec_a_len, false, &err) == 0);
    snprintf(line, sizeof(line), "# no newline at the end\nhost9 ecdsa-sha2-nistp256 %s\n", ec_a64);
    CHECK(!strcmp(read_file(path2), line));

    /* hashed entries: ours are found by us, and by OpenSSH */
    char path3[512];
    snprintf(path3, sizeof(path3), "%s/kh_hashed", tmpdir);
    CHECK(hvd_kh_append(path3, "127.0.0.3", 2200, ed_a, ed_a_len, true, &err) == 0);
    CHECK(hvd_kh_append(path3, "hashed.example", 22, ec_a, ec_a_len, true, &err) == 0);
    CHECK(strncmp(read_file(path3), "|1|", 3) == 0);
    CHECK(strstr(read_file(path3), "127.0.0.3") == NULL);
    r = lookup1(path3, "127.0.0.3", 2200, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 1);
    r = lookup1(path3, "hashed.example", 22, ec_a, ec_a_len);
    CHECK(r.status == HVD_KH_MATCH && r.line == 2);
    r = lookup1(path3, "127.0.0.3", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_UNKNOWN);

    /* an unwritable place gives an error naming the file */
    CHECK(hvd_kh_append("/proc/version", "h", 22, ed_a, ed_a_len, false, &err) == -1);
    CHECK(strstr(err.msg, "/proc/version") != NULL);

    if (!have_ssh_keygen()) {
        fprintf(stderr, "note: ssh-keygen not installed; OpenSSH cross-checks skipped\n");
        return;
    }
    /* OpenSSH finds our plain and hashed entries... */
    CHECK(sh("ssh-keygen -F '[127.0.0.2]:2222' -f '%s' >/dev/null", path) == 0);
    CHECK(sh("ssh-keygen -F '[127.0.0.3]:2200' -f '%s' >/dev/null", path3) == 0);
    CHECK(sh("ssh-keygen -F hashed.example -f '%s' >/dev/null", path3) == 0);
    /* ...and we find entries that OpenSSH hashed (ssh-keygen -H). */
    char path4[512], text[2048];
    snprintf(path4, sizeof(path4), "%s/kh_openssh", tmpdir);
    snprintf(text, sizeof(text),
             "one.example ssh-ed25519 %s\n[two.example]:2022,three ssh-ed25519 %s\n", ed_b64,
             ed_a64);
    write_file(path4, text);
    CHECK(sh("ssh-keygen -q -H -f '%s' >/dev/null 2>&1", path4) == 0);
    CHECK(strstr(read_file(path4), "two.example") == NULL);
    r = lookup1(path4, "two.example", 2022, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH);
    r = lookup1(path4, "three", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_MATCH);
    r = lookup1(path4, "one.example", 22, ed_a, ed_a_len);
    CHECK(r.status == HVD_KH_CHANGED && r.line == 1);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int main(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/hvd-kh-test.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    setup_keys();
    RUN(test_names);
    RUN(test_lookup_plain);
    RUN(test_lookup_precedence);
    RUN(test_append);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_finish();
}
