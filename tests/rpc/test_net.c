/* Unit tests for include/hvd/net.h and include/hvd/error.h: job secrets, address lists,
 * local interface discovery and the host hash.
 *
 * `test_net --print-host-hash` prints this process's host hash and exits; the host hash test
 * runs itself that way under `unshare --net` to see the hash change with the namespace. */
#include "hvd/error.h"
#include "hvd/net.h"
#include "hvd/rpc.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

static char tmpdir[1024];

static void tmp_path(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s", tmpdir, name);
}

static int contains(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

/* ---- error.h --------------------------------------------------------------------------- */

static void test_err(void) {
    hvd_err err = {0};
    CHECK(hvd_err_set(&err, HVD_E_IO, "open %s: %s", "x", "No such file") == -1);
    CHECK(err.code == HVD_E_IO);
    CHECK(strcmp(err.msg, "open x: No such file") == 0);
    CHECK(hvd_err_prefix(&err, "loading %s: ", "secret") == -1);
    CHECK(strcmp(err.msg, "loading secret: open x: No such file") == 0);
    CHECK(err.code == HVD_E_IO);
    /* Arguments may point into err->msg itself. */
    hvd_err_set(&err, HVD_E_AUTH, "outer (%s)", err.msg);
    CHECK(strcmp(err.msg, "outer (loading secret: open x: No such file)") == 0);
    /* No trailing newline, and long text is cut, not overflowed. */
    hvd_err_set(&err, HVD_E_INVALID, "line\n");
    CHECK(strcmp(err.msg, "line") == 0);
    char big[2 * HVD_ERR_MAX];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    hvd_err_set(&err, HVD_E_INVALID, "%s", big);
    CHECK(strlen(err.msg) == HVD_ERR_MAX - 1);
    CHECK(strcmp(err.msg + HVD_ERR_MAX - 4, "...") == 0); /* says it was cut */
    hvd_err_prefix(&err, "%s", "ctx: ");
    CHECK(strlen(err.msg) == HVD_ERR_MAX - 1 && strncmp(err.msg, "ctx: aaa", 8) == 0);
    CHECK(strcmp(err.msg + HVD_ERR_MAX - 4, "...") == 0);
    /* A sentence that fits exactly is not marked. */
    memset(big, 'b', HVD_ERR_MAX - 1);
    big[HVD_ERR_MAX - 1] = '\0';
    hvd_err_set(&err, HVD_E_INVALID, "%s", big);
    CHECK(strlen(err.msg) == HVD_ERR_MAX - 1 && err.msg[HVD_ERR_MAX - 2] == 'b');
    /* NULL err is allowed. */
    CHECK(hvd_err_set(NULL, HVD_E_IO, "x") == -1);
    CHECK(hvd_err_prefix(NULL, "x") == -1);
    CHECK(strcmp(hvd_status_name(HVD_E_NOT_FOUND), "not found") == 0);
    CHECK(strcmp(hvd_status_name(HVD_E_PROTOCOL), "protocol error") == 0);
    for (int c = -1; c <= 20; c++)
        CHECK(hvd_status_name(c) != NULL && hvd_status_name(c)[0] != '\0');
}

/* ---- secrets --------------------------------------------------------------------------- */

static int all_zero(const hvd_secret *s) {
    for (size_t i = 0; i < HVD_SECRET_LEN; i++)
        if (s->key[i]) return 0;
    return 1;
}

static void test_secret_generate(void) {
    hvd_secret a, b;
    hvd_err err = {0};
    CHECK(hvd_secret_generate(&a, &err) == 0);
    CHECK(hvd_secret_generate(&b, &err) == 0);
    CHECK(memcmp(a.key, b.key, HVD_SECRET_LEN) != 0);
    CHECK(!all_zero(&a) && !all_zero(&b));
    hvd_secret_wipe(&a);
    CHECK(all_zero(&a));
}

static void test_secret_base64(void) {
    hvd_secret s, t;
    hvd_err err = {0};
    for (int round = 0; round < 50; round++) {
        CHECK(hvd_secret_generate(&s, &err) == 0);
        char text[45];
        hvd_secret_to_base64(&s, text);
        CHECK(strlen(text) == 44 && text[43] == '=' && text[42] != '=');
        memset(&t, 0, sizeof t);
        CHECK_MSG(hvd_secret_from_base64(&t, text, &err) == 0, "%s", err.msg);
        CHECK(memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);
    }
    /* A known vector: bytes 0..31. */
    for (int i = 0; i < HVD_SECRET_LEN; i++)
        s.key[i] = (uint8_t)i;
    char text[45];
    hvd_secret_to_base64(&s, text);
    CHECK(strcmp(text, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=") == 0);
    /* Surrounding white space is allowed (a file ends in a newline). */
    memset(&t, 0, sizeof t);
    CHECK(hvd_secret_from_base64(&t, " \t AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\r\n",
                                 &err) == 0);
    CHECK(memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);
}

/* Expects text to be refused with a message containing `word`. */
static void expect_bad_b64(const char *text, const char *word) {
    hvd_secret s;
    memset(&s, 0x5a, sizeof s);
    hvd_err err = {0};
    int rc = hvd_secret_from_base64(&s, text, &err);
    CHECK_MSG(rc == -1, "accepted \"%s\"", text);
    CHECK(err.code == HVD_E_INVALID);
    CHECK_MSG(err.msg[0] != '\0' && contains(err.msg, word), "text \"%s\": message \"%s\"", text,
              err.msg);
    /* A refused secret leaves s untouched. */
    for (size_t i = 0; i < HVD_SECRET_LEN; i++)
        if (s.key[i] != 0x5a) {
            CHECK_MSG(0, "text \"%s\" changed the secret", text);
            break;
        }
}

static void test_secret_bad_base64(void) {
    unsigned char raw[40], text[64];
    memset(raw, 0xab, sizeof raw);

    expect_bad_b64("", "empty");
    expect_bad_b64("   \n", "empty");
    expect_bad_b64("abc", "base64");                                           /* length */
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", "base64");   /* 43 chars */
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8==", "base64"); /* 45 chars */
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd!h8=", "character 41");
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh*=", "character 43");
    /* base64url alphabet is not standard base64 */
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd-h_=", "character 41");
    /* white space inside, '=' inside */
    expect_bad_b64("AAECAwQFBgcICQoLDA0O DxAREhMUFRYXGBkaGxwdHh8=", "character 21");
    expect_bad_b64("AAECAwQFBgcICQoLDA0O=xAREhMUFRYXGBkaGxwdHh8=", "character 22");
    /* 31 and 33 bytes both have 44 base64 characters */
    CHECK(EVP_EncodeBlock(text, raw, 31) == 44);
    expect_bad_b64((const char *)text, "31 bytes");
    CHECK(EVP_EncodeBlock(text, raw, 33) == 44);
    expect_bad_b64((const char *)text, "33 bytes");
    CHECK(EVP_EncodeBlock(text, raw, 30) == 40);
    expect_bad_b64((const char *)text, "30 bytes");
    /* non-zero padding bits: '9' differs from the canonical '8' only in the unused bits */
    expect_bad_b64("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh9=", "canonical");
    expect_bad_b64(NULL, "missing");
}

static int make_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/hvd_test_net.XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int file_mode(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

static void write_text(const char *path, const char *text, mode_t mode) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    CHECK(fchmod(fd, mode) == 0);
    close(fd);
}

static void test_secret_files(void) {
    hvd_secret s, t;
    hvd_err err = {0};
    char path[PATH_MAX], text[45];
    CHECK(hvd_secret_generate(&s, &err) == 0);
    hvd_secret_to_base64(&s, text);

    /* write_file creates exactly 0600, even under a permissive umask */
    mode_t old = umask(0);
    tmp_path(path, sizeof path, "secret");
    CHECK_MSG(hvd_secret_write_file(&s, path, &err) == 0, "%s", err.msg);
    umask(old);
    CHECK(file_mode(path) == 0600);
    char buf[128] = {0};
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf - 1) == 45);
    if (fd >= 0) close(fd);
    CHECK(strncmp(buf, text, 44) == 0 && buf[44] == '\n');

    memset(&t, 0, sizeof t);
    CHECK_MSG(hvd_secret_read_file(&t, path, &err) == 0, "%s", err.msg);
    CHECK(memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);

    /* an existing file is never overwritten */
    err.msg[0] = '\0';
    CHECK(hvd_secret_write_file(&t, path, &err) == -1);
    CHECK(err.code == HVD_E_IO && contains(err.msg, path) && contains(err.msg, "exists"));
    /* nor is a symlink followed */
    char link[PATH_MAX], target[PATH_MAX];
    tmp_path(link, sizeof link, "link");
    tmp_path(target, sizeof target, "link-target");
    CHECK(symlink(target, link) == 0);
    CHECK(hvd_secret_write_file(&s, link, &err) == -1);
    CHECK(access(target, F_OK) != 0);
    unlink(link);

    /* group or other permission bits: refused */
    CHECK(chmod(path, 0644) == 0);
    err.msg[0] = '\0';
    CHECK(hvd_secret_read_file(&t, path, &err) == -1);
    CHECK_MSG(err.code == HVD_E_INVALID && contains(err.msg, "0644") &&
                  contains(err.msg, "chmod 600"),
              "%s", err.msg);
    CHECK(chmod(path, 0640) == 0);
    CHECK(hvd_secret_read_file(&t, path, &err) == -1);
    CHECK(chmod(path, 0602) == 0);
    CHECK(hvd_secret_read_file(&t, path, &err) == -1);
    CHECK(chmod(path, 0400) == 0);
    CHECK_MSG(hvd_secret_read_file(&t, path, &err) == 0, "%s", err.msg);
    CHECK(chmod(path, 0600) == 0);

    /* another owner: refused (only testable as root) */
    if (geteuid() == 0) {
        char other[PATH_MAX];
        tmp_path(other, sizeof other, "other-owner");
        write_text(other, text, 0600);
        CHECK(chown(other, 65534, 65534) == 0);
        CHECK(hvd_secret_read_file(&t, other, &err) == -1);
        CHECK_MSG(contains(err.msg, "owned by uid 65534"), "%s", err.msg);
        unlink(other);
    } else {
        fprintf(stderr, "skip: not root, not checking that a file of another owner is "
                        "refused\n");
    }

    /* missing file, a directory, bad content, too large */
    char bad[PATH_MAX];
    tmp_path(bad, sizeof bad, "missing");
    CHECK(hvd_secret_read_file(&t, bad, &err) == -1);
    CHECK(err.code == HVD_E_IO && contains(err.msg, bad));
    CHECK(hvd_secret_read_file(&t, tmpdir, &err) == -1);
    CHECK(contains(err.msg, "not a regular file"));
    tmp_path(bad, sizeof bad, "bad-content");
    write_text(bad, "not a secret\n", 0600);
    CHECK(hvd_secret_read_file(&t, bad, &err) == -1);
    CHECK(err.code == HVD_E_INVALID && contains(err.msg, bad));
    char *large = malloc(10000);
    memset(large, 'A', 9999);
    large[9999] = '\0';
    write_text(bad, large, 0600);
    free(large);
    CHECK(hvd_secret_read_file(&t, bad, &err) == -1);
    CHECK(contains(err.msg, "larger"));
    unlink(bad);
    unlink(path);
}

static void test_secret_load_env(void) {
    hvd_secret s, t;
    hvd_err err = {0};
    char text[45], path[PATH_MAX];
    CHECK(hvd_secret_generate(&s, &err) == 0);
    hvd_secret_to_base64(&s, text);
    unsetenv(HVD_SECRET_ENV);
    unsetenv(HVD_SECRET_FILE_ENV);

    /* neither set */
    CHECK(hvd_secret_load_env(&t, &err) == -1);
    CHECK(err.code == HVD_E_NOT_FOUND && contains(err.msg, "HVD_SECRET") &&
          contains(err.msg, "HVD_SECRET_FILE"));

    /* from $HVD_SECRET */
    setenv(HVD_SECRET_ENV, text, 1);
    memset(&t, 0, sizeof t);
    CHECK_MSG(hvd_secret_load_env(&t, &err) == 0, "%s", err.msg);
    CHECK(memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);
    setenv(HVD_SECRET_ENV, "garbage", 1);
    CHECK(hvd_secret_load_env(&t, &err) == -1);
    CHECK_MSG(contains(err.msg, "$HVD_SECRET:") && !contains(err.msg, "garbage"), "%s", err.msg);
    unsetenv(HVD_SECRET_ENV);

    /* from $HVD_SECRET_FILE */
    tmp_path(path, sizeof path, "env-secret");
    CHECK(hvd_secret_write_file(&s, path, &err) == 0);
    setenv(HVD_SECRET_FILE_ENV, path, 1);
    memset(&t, 0, sizeof t);
    CHECK_MSG(hvd_secret_load_env(&t, &err) == 0, "%s", err.msg);
    CHECK(memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);

    /* $HVD_SECRET wins over the file; an empty $HVD_SECRET counts as unset */
    hvd_secret u;
    CHECK(hvd_secret_generate(&u, &err) == 0);
    char utext[45];
    hvd_secret_to_base64(&u, utext);
    setenv(HVD_SECRET_ENV, utext, 1);
    CHECK(hvd_secret_load_env(&t, &err) == 0 && memcmp(u.key, t.key, HVD_SECRET_LEN) == 0);
    setenv(HVD_SECRET_ENV, "", 1);
    CHECK(hvd_secret_load_env(&t, &err) == 0 && memcmp(s.key, t.key, HVD_SECRET_LEN) == 0);
    unsetenv(HVD_SECRET_ENV);

    /* a file readable by others is refused, and the message says which source failed */
    CHECK(chmod(path, 0644) == 0);
    CHECK(hvd_secret_load_env(&t, &err) == -1);
    CHECK_MSG(contains(err.msg, "$HVD_SECRET_FILE:") && contains(err.msg, path) &&
                  contains(err.msg, "0644"),
              "%s", err.msg);
    unsetenv(HVD_SECRET_FILE_ENV);
    unlink(path);
}

/* ---- address lists --------------------------------------------------------------------- */

static void expect_roundtrip(const char *text, size_t n) {
    hvd_addr *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    hvd_err err = {0};
    CHECK_MSG(hvd_addrs_parse(text, &a, &na, &err) == 0, "\"%s\": %s", text, err.msg);
    CHECK_MSG(na == n, "\"%s\": %zu entries", text, na);
    char *f = a ? hvd_addrs_format(a, na) : NULL;
    CHECK_MSG(f && strcmp(f, text) == 0, "\"%s\" formatted as \"%s\"", text, f ? f : "(null)");
    if (f) {
        CHECK(hvd_addrs_parse(f, &b, &nb, &err) == 0);
        CHECK(nb == na);
        for (size_t i = 0; b && i < na && i < nb; i++) {
            CHECK(strcmp(a[i].ifname, b[i].ifname) == 0);
            CHECK(strcmp(a[i].host, b[i].host) == 0);
            CHECK(a[i].port == b[i].port);
        }
    }
    free(f);
    free(a);
    free(b);
}

static void test_addrs_roundtrip(void) {
    expect_roundtrip("lo=127.0.0.1:4000,eth0=10.0.0.2:4000,eth0=[fe80::1%eth0]:4000", 3);
    expect_roundtrip("10.0.0.1:1", 1);
    expect_roundtrip("[::1]:65535", 1);
    expect_roundtrip("[fe80::1%eth0]:80,192.168.1.1:22,ib0=[2001:db8::5]:1234", 3);
    expect_roundtrip("abcdefghijklmno=1.2.3.4:5", 1); /* 15-character interface name */
    expect_roundtrip("eth0=[::ffff:1.2.3.4]:80", 1);
    expect_roundtrip("v=[fe80::1%2]:80", 1); /* numeric scope */

    hvd_addr *a = NULL;
    size_t n = 0;
    hvd_err err = {0};
    CHECK(hvd_addrs_parse("lo=127.0.0.1:4000,eth0=[fe80::1%eth0]:4001,9.8.7.6:7", &a, &n, &err) ==
          0);
    CHECK(n == 3);
    if (n == 3) {
        CHECK(strcmp(a[0].ifname, "lo") == 0 && strcmp(a[0].host, "127.0.0.1") == 0 &&
              a[0].port == 4000);
        CHECK(strcmp(a[1].ifname, "eth0") == 0 && strcmp(a[1].host, "fe80::1%eth0") == 0 &&
              a[1].port == 4001);
        CHECK(a[2].ifname[0] == '\0' && strcmp(a[2].host, "9.8.7.6") == 0 && a[2].port == 7);
        char buf[128];
        CHECK(strcmp(hvd_addr_str(&a[0], buf, sizeof buf), "127.0.0.1:4000") == 0);
        CHECK(strcmp(hvd_addr_str(&a[1], buf, sizeof buf), "[fe80::1%eth0]:4001") == 0);
        CHECK(hvd_addr_str(&a[1], buf, 6) == buf && strcmp(buf, "[fe80") == 0);
    }
    free(a);

    /* IPv6 hosts are stored in canonical form */
    CHECK(hvd_addrs_parse("x=[FE80:0:0:0::0001%eth0]:80", &a, &n, &err) == 0);
    CHECK(n == 1 && strcmp(a[0].host, "fe80::1%eth0") == 0);
    char *f = hvd_addrs_format(a, n);
    CHECK(f && strcmp(f, "x=[fe80::1%eth0]:80") == 0);
    free(f);
    free(a);

    /* an empty list formats as "" */
    f = hvd_addrs_format(NULL, 0);
    CHECK(f && f[0] == '\0');
    free(f);
}

/* Expects text to be refused, with a message containing `word`. */
static void expect_bad_addrs(const char *text, const char *word) {
    hvd_addr sentinel;
    hvd_addr *a = &sentinel; /* must be reset to NULL */
    size_t n = 99;
    hvd_err err = {0};
    CHECK_MSG(hvd_addrs_parse(text, &a, &n, &err) == -1, "accepted \"%s\"", text);
    CHECK(a == NULL && n == 0);
    CHECK(err.code == HVD_E_INVALID);
    CHECK_MSG(contains(err.msg, word), "\"%s\": message \"%s\" lacks \"%s\"", text, err.msg, word);
    if (a != &sentinel) free(a);
}

static void test_addrs_malformed(void) {
    expect_bad_addrs("", "empty");
    expect_bad_addrs("lo=127.0.0.1", "entry 1 \"lo=127.0.0.1\""); /* missing port */
    expect_bad_addrs("lo=127.0.0.1", "port");                     /* missing port */
    expect_bad_addrs("127.0.0.1:", "port");                       /* empty port */
    expect_bad_addrs("lo=127.0.0.1:0", "port");                   /* port 0 */
    expect_bad_addrs("lo=127.0.0.1:65536", "port");               /* port 65536 */
    expect_bad_addrs("lo=127.0.0.1:123456", "port");              /* too many digits */
    expect_bad_addrs("lo=127.0.0.1:-1", "port");
    expect_bad_addrs("lo=127.0.0.1:+80", "port");
    expect_bad_addrs("lo=127.0.0.1:080", "port"); /* leading zero */
    expect_bad_addrs("lo=127.0.0.1:80x", "port");
    expect_bad_addrs("lo=localhost:80", "numeric"); /* non-numeric host */
    expect_bad_addrs("eth0=host.example.com:80", "numeric");
    expect_bad_addrs("256.1.1.1:80", "numeric");
    expect_bad_addrs("1.2.3:80", "numeric");
    expect_bad_addrs("01.2.3.4:80", "numeric");
    expect_bad_addrs("lo=127.0.0.1:80,,eth0=10.0.0.1:80", "entry 2 \"\""); /* empty entry */
    expect_bad_addrs(",lo=127.0.0.1:80", "entry 1");
    expect_bad_addrs("lo=127.0.0.1:80,", "entry 2");
    expect_bad_addrs("lo=127.0.0.1:80,eth0=10.0.0.1", "entry 2 \"eth0=10.0.0.1\"");
    expect_bad_addrs("abcdefghijklmnop=1.2.3.4:80", "16 characters"); /* ifname too long */
    expect_bad_addrs("=1.2.3.4:80", "interface name");
    expect_bad_addrs("e th0=1.2.3.4:80", "interface name");
    expect_bad_addrs("a/b=1.2.3.4:80", "interface name");
    expect_bad_addrs(":80", "host is empty");
    expect_bad_addrs("lo=:80", "host is empty");
    expect_bad_addrs("fe80::1:80", "brackets"); /* unbracketed IPv6 */
    expect_bad_addrs("[1.2.3.4]:80", "IPv6");   /* bracketed IPv4 */
    expect_bad_addrs("[::1]80", ":port");       /* no colon after ']' */
    expect_bad_addrs("[::1]", ":port");
    expect_bad_addrs("[::1:80", "']'");
    expect_bad_addrs("[]:80", "host is empty");
    expect_bad_addrs("[fe80::1%]:80", "scope");
    expect_bad_addrs("[fe80::1%abcdefghijklmnop]:80", "scope");
    expect_bad_addrs("[fe80::1%eth0%x]:80", "scope");
    expect_bad_addrs("1.2.3.4%eth0:80", "numeric");
    expect_bad_addrs(" lo=127.0.0.1:80", "interface name");
    expect_bad_addrs("lo=127.0.0.1:80 ", "port");
    expect_bad_addrs("lo=127.0.0.1:80\n", "port");
    expect_bad_addrs("lo=[gggg::1]:80", "IPv6");
    /* control bytes are not echoed raw into the message */
    hvd_addr *a = NULL;
    size_t n = 0;
    hvd_err err = {0};
    CHECK(hvd_addrs_parse("l\x01o=1.2.3.4:80", &a, &n, &err) == -1);
    CHECK(!contains(err.msg, "\x01") && contains(err.msg, "l?o="));
}

/* ---- local interfaces ------------------------------------------------------------------ */

static void test_local_addrs(void) {
    hvd_addr *a = NULL;
    size_t n = 0;
    hvd_err err = {0};
    CHECK_MSG(hvd_local_addrs(&a, &n, 4242, NULL, &err) == 0, "%s", err.msg);
    int lo4 = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(a[i].port == 4242);
        CHECK(a[i].ifname[0] != '\0' && !strchr(a[i].ifname, ':'));
        if (strcmp(a[i].ifname, "lo") == 0 && strcmp(a[i].host, "127.0.0.1") == 0) lo4 = 1;
        int v6 = strchr(a[i].host, ':') != NULL;
        /* link-local IPv6 carries "%ifname" */
        if (v6 && strncmp(a[i].host, "fe80:", 5) == 0) {
            char want[HVD_HOST_MAX];
            snprintf(want, sizeof want, "%%%s", a[i].ifname);
            CHECK_MSG(contains(a[i].host, want), "%s on %s", a[i].host, a[i].ifname);
        } else {
            CHECK_MSG(!strchr(a[i].host, '%'), "%s", a[i].host);
        }
        /* one interface's addresses are contiguous, IPv4 before IPv6 */
        if (i > 0 && strcmp(a[i - 1].ifname, a[i].ifname) == 0) {
            int prev_v6 = strchr(a[i - 1].host, ':') != NULL;
            CHECK_MSG(!(prev_v6 && !v6), "IPv4 %s after IPv6 on %s", a[i].host, a[i].ifname);
        }
        for (size_t j = 0; j + 1 < i; j++) {
            if (strcmp(a[j].ifname, a[i].ifname) == 0)
                CHECK_MSG(strcmp(a[j + 1].ifname, a[i].ifname) == 0, "%s is split", a[i].ifname);
        }
    }
    CHECK_MSG(lo4, "127.0.0.1 on lo not listed");

    /* the list survives the text form */
    char *text = hvd_addrs_format(a, n);
    hvd_addr *b = NULL;
    size_t nb = 0;
    CHECK_MSG(text && hvd_addrs_parse(text, &b, &nb, &err) == 0, "%s: %s", text, err.msg);
    CHECK(nb == n);
    for (size_t i = 0; b && i < n && i < nb; i++)
        CHECK(strcmp(a[i].host, b[i].host) == 0 && strcmp(a[i].ifname, b[i].ifname) == 0);
    free(b);
    free(text);
    size_t n_all = n;
    free(a);

    /* filter: only lo */
    const char *only_lo[] = {"lo", NULL};
    CHECK_MSG(hvd_local_addrs(&a, &n, 1, only_lo, &err) == 0, "%s", err.msg);
    CHECK(n >= 1 && n <= n_all);
    for (size_t i = 0; i < n; i++)
        CHECK(strcmp(a[i].ifname, "lo") == 0);
    free(a);

    /* a filter with a name that does not exist next to one that does */
    const char *mixed[] = {"nosuch0", "lo", NULL};
    CHECK(hvd_local_addrs(&a, &n, 1, mixed, &err) == 0 && n >= 1);
    free(a);

    /* a filter that matches nothing: error naming it */
    const char *none[] = {"nosuch0", "nosuch1", NULL};
    hvd_addr sentinel;
    a = &sentinel;
    CHECK(hvd_local_addrs(&a, &n, 1, none, &err) == -1);
    CHECK(a == NULL && n == 0);
    CHECK_MSG(err.code == HVD_E_NOT_FOUND && contains(err.msg, "nosuch0, nosuch1") &&
                  contains(err.msg, "lo"),
              "%s", err.msg);
    const char *empty[] = {NULL};
    CHECK(hvd_local_addrs(&a, &n, 1, empty, &err) == -1);
}

/* ---- host hash ------------------------------------------------------------------------- */

static int hash_chars_ok(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* Runs argv with stdout into out (NUL-terminated); returns the exit status, or -1. */
static int run_capture(char *const argv[], char *out, size_t len) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(p[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t got = 0;
    for (;;) {
        ssize_t r = read(p[0], out + got, len - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        if (got == len - 1) break;
    }
    out[got] = '\0';
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --bind: numeric addresses as given, interface names to their first address, wildcards to
 * "" (everywhere); a server bound through a name listens and advertises only there. */
static void test_bind_resolve(void) {
    char out[HVD_HOST_MAX];
    hvd_err err;
    CHECK(hvd_bind_resolve("lo", out, sizeof out, &err) == 0 && strcmp(out, "127.0.0.1") == 0);
    CHECK(hvd_bind_resolve("10.1.2.3", out, sizeof out, &err) == 0 && !strcmp(out, "10.1.2.3"));
    CHECK(hvd_bind_resolve("::1", out, sizeof out, &err) == 0 && strcmp(out, "::1") == 0);
    CHECK(hvd_bind_resolve("fe80::1%lo", out, sizeof out, &err) == 0 && !strcmp(out, "fe80::1%lo"));
    const char *wild[] = {NULL, "", "*", "0.0.0.0", "::"};
    for (size_t i = 0; i < sizeof wild / sizeof *wild; i++)
        CHECK(hvd_bind_resolve(wild[i], out, sizeof out, &err) == 0 && out[0] == '\0');
    CHECK(hvd_bind_resolve("nosuchif0", out, sizeof out, &err) == -1);
    CHECK_MSG(strstr(err.msg, "'nosuchif0' is neither a numeric IP nor an interface") &&
                  strstr(err.msg, "lo"),
              "%s", err.msg);
    CHECK(hvd_bind_resolve("300.1.1.1", out, sizeof out, &err) == -1);

    hvd_server_config sc = {.name = "bound", .bind_host = "lo"};
    hvd_server *s = hvd_server_create(&sc, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    hvd_addr *a = NULL;
    size_t n = 0;
    CHECK(s && hvd_server_addrs(s, NULL, &a, &n, &err) == 0);
    CHECK(n == 1 && a && strcmp(a[0].host, "127.0.0.1") == 0 && strcmp(a[0].ifname, "lo") == 0);
    free(a);
    if (s) hvd_server_destroy(s);
}

static void test_host_hash(void) {
    char h1[HVD_HOST_HASH_MAX], h2[HVD_HOST_HASH_MAX], h3[HVD_HOST_HASH_MAX];
    hvd_err err = {0};
    CHECK_MSG(hvd_host_hash(h1, NULL, &err) == 0, "%s", err.msg);
    CHECK(!strchr(h1, '.') && !strchr(h1, ':'));
    CHECK_MSG(hash_chars_ok(h1) && hvd_host_hash_valid(h1), "%s", h1);
    /* "<label>-<32 hex>" whose label comes from the hostname */
    size_t len = strlen(h1);
    CHECK(len > 33 && h1[len - 33] == '-');
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    size_t label = strcspn(host, ".");
    CHECK(len - 33 == label);
    for (size_t i = 0; i < label && i < len; i++)
        CHECK(h1[i] == host[i] || (h1[i] == '_' && !hash_chars_ok((char[]){host[i], 0})));

    /* stable */
    CHECK(hvd_host_hash(h2, NULL, &err) == 0 && strcmp(h1, h2) == 0);
    /* a salt changes it, the same salt twice does not */
    CHECK(hvd_host_hash(h2, "3-1700000000.5", &err) == 0 && strcmp(h1, h2) != 0);
    CHECK(hvd_host_hash(h3, "3-1700000000.5", &err) == 0 && strcmp(h2, h3) == 0);
    CHECK(hvd_host_hash_valid(h2) && !strchr(h2, '.'));
    CHECK(hvd_host_hash(h3, "4-1700000000.5", &err) == 0 && strcmp(h2, h3) != 0);
    /* the label stays the same: only the digest moves */
    CHECK(strncmp(h1, h2, len - 32) == 0);

    /* $CONTAINER_ID changes it, alone and next to a salt */
    setenv("CONTAINER_ID", "container_e01_1700000000000_0001_01_000002", 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == 0 && strcmp(h1, h2) != 0);
    CHECK(hvd_host_hash(h3, "x", &err) == 0 && strcmp(h2, h3) != 0);
    setenv("CONTAINER_ID", "container_e01_1700000000000_0001_01_000003", 1);
    CHECK(hvd_host_hash(h3, NULL, &err) == 0 && strcmp(h2, h3) != 0);
    unsetenv("CONTAINER_ID");
    CHECK(hvd_host_hash(h2, NULL, &err) == 0 && strcmp(h1, h2) == 0);

    /* $HVD_HOST_HASH overrides, and is checked */
    setenv(HVD_HOST_HASH_ENV, "fakehost-7", 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == 0 && strcmp(h2, "fakehost-7") == 0);
    CHECK(hvd_host_hash(h2, "salt", &err) == 0 && strcmp(h2, "fakehost-7") == 0);
    setenv(HVD_HOST_HASH_ENV, "node1.example.com", 1);
    err.msg[0] = '\0';
    CHECK(hvd_host_hash(h2, NULL, &err) == -1);
    CHECK_MSG(err.code == HVD_E_INVALID && contains(err.msg, "'.'") &&
                  contains(err.msg, "position 6"),
              "%s", err.msg);
    setenv(HVD_HOST_HASH_ENV, "node1:4", 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == -1 && contains(err.msg, "':'"));
    setenv(HVD_HOST_HASH_ENV, "", 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == -1 && contains(err.msg, "empty"));
    char longer[HVD_HOST_HASH_MAX + 1];
    memset(longer, 'a', HVD_HOST_HASH_MAX);
    longer[HVD_HOST_HASH_MAX] = '\0';
    setenv(HVD_HOST_HASH_ENV, longer, 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == -1 && contains(err.msg, "128 characters"));
    longer[HVD_HOST_HASH_MAX - 1] = '\0';
    setenv(HVD_HOST_HASH_ENV, longer, 1);
    CHECK(hvd_host_hash(h2, NULL, &err) == 0 && strcmp(h2, longer) == 0);
    unsetenv(HVD_HOST_HASH_ENV);

    CHECK(hvd_host_hash_valid("a") && hvd_host_hash_valid("A-z_09"));
    CHECK(!hvd_host_hash_valid("") && !hvd_host_hash_valid(NULL));
    CHECK(!hvd_host_hash_valid("a.b") && !hvd_host_hash_valid("a:1") &&
          !hvd_host_hash_valid("a b") && !hvd_host_hash_valid("a/b"));
    CHECK(hvd_host_hash_valid(longer));
    longer[HVD_HOST_HASH_MAX - 1] = 'a';
    CHECK(!hvd_host_hash_valid(longer));
}

/* The hash must change with the network namespace (two containers sharing a hostname). */
static void test_host_hash_netns(void) {
    char self[PATH_MAX];
    ssize_t r = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(r > 0);
    if (r <= 0) return;
    self[r] = '\0';

    char here[HVD_HOST_HASH_MAX], same[256], other[256];
    hvd_err err = {0};
    CHECK(hvd_host_hash(here, NULL, &err) == 0);
    /* control: a child in the same namespaces computes the same hash */
    char *same_argv[] = {self, "--print-host-hash", NULL};
    CHECK(run_capture(same_argv, same, sizeof same) == 0);
    same[strcspn(same, "\n")] = '\0';
    CHECK_MSG(strcmp(same, here) == 0, "child %s, parent %s", same, here);

    char probe[16];
    char *probe_argv[] = {"unshare", "--net", "true", NULL};
    if (run_capture(probe_argv, probe, sizeof probe) != 0) {
        fprintf(stderr, "skip: `unshare --net` does not work here (needs root or user "
                        "namespaces); not checking that the host hash changes with the network "
                        "namespace\n");
        return;
    }
    char *argv[] = {"unshare", "--net", self, "--print-host-hash", NULL};
    CHECK(run_capture(argv, other, sizeof other) == 0);
    other[strcspn(other, "\n")] = '\0';
    CHECK_MSG(hvd_host_hash_valid(other), "\"%s\"", other);
    CHECK_MSG(strcmp(other, here) != 0, "same hash %s in a new network namespace", here);
    /* same hostname, so the same label */
    size_t label = strlen(here) - 32;
    CHECK(strncmp(other, here, label) == 0);
}

int main(int argc, char **argv) {
    /* The environment of the caller must not steer the results. */
    unsetenv(HVD_HOST_HASH_ENV);
    unsetenv("CONTAINER_ID");
    if (argc == 2 && strcmp(argv[1], "--print-host-hash") == 0) {
        char h[HVD_HOST_HASH_MAX];
        hvd_err err = {0};
        if (hvd_host_hash(h, NULL, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("%s\n", h);
        return 0;
    }
    unsetenv(HVD_SECRET_ENV);
    unsetenv(HVD_SECRET_FILE_ENV);
    if (make_tmpdir() != 0) {
        fprintf(stderr, "cannot create a temporary directory: %s\n", strerror(errno));
        return 1;
    }

    RUN(test_err);
    RUN(test_secret_generate);
    RUN(test_secret_base64);
    RUN(test_secret_bad_base64);
    RUN(test_secret_files);
    RUN(test_secret_load_env);
    RUN(test_addrs_roundtrip);
    RUN(test_addrs_malformed);
    RUN(test_local_addrs);
    RUN(test_bind_resolve);
    RUN(test_host_hash);
    RUN(test_host_hash_netns);

    rmdir(tmpdir);
    return test_finish();
}
