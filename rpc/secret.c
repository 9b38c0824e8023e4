/* The 32-byte job secret: generation, base64 text form, environment and file storage
 * (include/hvd/net.h). The secret never appears in an error message. */
#include "hvd/net.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

/* 32 bytes in standard base64: 10 full groups and one group carrying 2 bytes ("XXX="). */
#define B64_LEN 44
/* A secret file holds 44 characters and a newline; allow some slack for white space. */
#define SECRET_FILE_MAX 4096

int hvd_secret_generate(hvd_secret *s, hvd_err *err) {
    if (RAND_bytes(s->key, HVD_SECRET_LEN) != 1) {
        unsigned long e = ERR_get_error();
        char why[256];
        ERR_error_string_n(e, why, sizeof why);
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "generating the job secret failed: the OpenSSL random generator "
                           "reported %s",
                           e ? why : "an unknown error");
    }
    return 0;
}

void hvd_secret_to_base64(const hvd_secret *s, char out[45]) {
    EVP_EncodeBlock((unsigned char *)out, s->key, HVD_SECRET_LEN);
    out[B64_LEN] = '\0';
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_b64(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/';
}

/* The 6-bit value of a base64 character (is_b64(c) must hold). */
static unsigned b64_value(char c) {
    if (c >= 'A' && c <= 'Z') return (unsigned)(c - 'A');
    if (c >= 'a' && c <= 'z') return (unsigned)(c - 'a') + 26;
    if (c >= '0' && c <= '9') return (unsigned)(c - '0') + 52;
    return c == '+' ? 62 : 63;
}

int hvd_secret_from_base64(hvd_secret *s, const char *text, hvd_err *err) {
    if (!text) return hvd_err_set(err, HVD_E_INVALID, "the job secret text is missing");
    const char *b = text;
    while (is_space(*b))
        b++;
    const char *e = b + strlen(b);
    while (e > b && is_space(e[-1]))
        e--;
    size_t len = (size_t)(e - b);
    if (len == 0) return hvd_err_set(err, HVD_E_INVALID, "the job secret is empty");

    /* Check every character before decoding so the message can say what is wrong. */
    size_t pad = 0;
    for (size_t i = 0; i < len; i++) {
        char c = b[i];
        if (c == '=') {
            pad++;
            continue;
        }
        if (pad > 0 || !is_b64(c)) {
            return hvd_err_set(err, HVD_E_INVALID,
                               "the job secret is not standard base64: character %zu is %s; "
                               "expected 44 characters of A-Z a-z 0-9 + / ending in '='",
                               i + 1, pad > 0 ? "after '=' padding" : "not a base64 character");
        }
    }
    if (len % 4 != 0 || pad > 2) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "the job secret is not valid base64: %zu characters with %zu '=', "
                           "expected 44 characters encoding %d bytes",
                           len, pad, HVD_SECRET_LEN);
    }
    size_t nbytes = len / 4 * 3 - pad;
    if (nbytes != HVD_SECRET_LEN) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "the job secret decodes to %zu bytes, expected %d (44 base64 "
                           "characters)",
                           nbytes, HVD_SECRET_LEN);
    }
    /* Here len == 44 and pad == 1. The unused low 2 bits of the last data character must be
     * zero, so that each secret has exactly one text form. */
    if ((b64_value(b[B64_LEN - 2]) & 3u) != 0) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "the job secret is not canonical base64: its last character before "
                           "'=' carries non-zero padding bits");
    }

    /* EVP_DecodeBlock ignores padding when counting: 44 characters always give 33 bytes. */
    unsigned char raw[B64_LEN / 4 * 3];
    int r = EVP_DecodeBlock(raw, (const unsigned char *)b, B64_LEN);
    if (r != (int)sizeof raw) {
        OPENSSL_cleanse(raw, sizeof raw);
        return hvd_err_set(err, HVD_E_INVALID, "the job secret is not valid base64");
    }
    memcpy(s->key, raw, HVD_SECRET_LEN);
    OPENSSL_cleanse(raw, sizeof raw);
    return 0;
}

int hvd_secret_read_file(hvd_secret *s, const char *path, hvd_err *err) {
    /* O_NONBLOCK: opening a FIFO planted at path must not hang; it is refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        return hvd_err_set(err, HVD_E_IO, "cannot open the secret file %s: %s", path,
                           strerror(errno));
    }
    /* Check the file we opened, not the path, so it cannot be swapped in between. */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hvd_err_set(err, HVD_E_IO, "cannot stat the secret file %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hvd_err_set(err, HVD_E_INVALID, "the secret file %s is not a regular file", path);
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        return hvd_err_set(err, HVD_E_INVALID,
                           "the secret file %s is owned by uid %u, not by this user (uid %u); "
                           "refusing to trust it",
                           path, (unsigned)st.st_uid, (unsigned)geteuid());
    }
    if ((st.st_mode & 077) != 0) {
        close(fd);
        return hvd_err_set(err, HVD_E_INVALID,
                           "the secret file %s has mode %04o: group and others must have no "
                           "access (run chmod 600 %s)",
                           path, (unsigned)(st.st_mode & 07777), path);
    }

    char buf[SECRET_FILE_MAX + 1];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            OPENSSL_cleanse(buf, got);
            return hvd_err_set(err, HVD_E_IO, "cannot read the secret file %s: %s", path,
                               strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got == sizeof buf - 1) {
            close(fd);
            OPENSSL_cleanse(buf, got);
            return hvd_err_set(err, HVD_E_INVALID,
                               "the secret file %s is larger than %d bytes; it should hold "
                               "only the 44-character base64 secret",
                               path, SECRET_FILE_MAX);
        }
    }
    close(fd);
    buf[got] = '\0';
    int rc = 0;
    if (memchr(buf, '\0', got) != NULL) {
        rc = hvd_err_set(err, HVD_E_INVALID, "the secret file %s contains a NUL byte", path);
    } else if (hvd_secret_from_base64(s, buf, err) != 0) {
        rc = hvd_err_prefix(err, "secret file %s: ", path);
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

int hvd_secret_write_file(const hvd_secret *s, const char *path, hvd_err *err) {
    /* O_EXCL: never overwrite (or follow a symlink planted at path). */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
    if (fd < 0) {
        return hvd_err_set(err, HVD_E_IO, "cannot create the secret file %s: %s%s", path,
                           strerror(errno),
                           errno == EEXIST ? " (it is never overwritten; remove it first)" : "");
    }
    /* The umask may have removed owner bits; make the mode exactly 0600. */
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return hvd_err_set(err, HVD_E_IO, "cannot set mode 0600 on the secret file %s: %s", path,
                           strerror(e));
    }
    char text[B64_LEN + 2];
    hvd_secret_to_base64(s, text);
    text[B64_LEN] = '\n';
    text[B64_LEN + 1] = '\0';
    size_t off = 0;
    int e = 0;
    while (off < B64_LEN + 1) {
        ssize_t w = write(fd, text + off, B64_LEN + 1 - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        off += (size_t)w;
    }
    OPENSSL_cleanse(text, sizeof text);
    if (close(fd) != 0 && e == 0) e = errno;
    if (e != 0) {
        unlink(path);
        return hvd_err_set(err, HVD_E_IO, "cannot write the secret file %s: %s", path, strerror(e));
    }
    return 0;
}

int hvd_secret_load_env(hvd_secret *s, hvd_err *err) {
    /* An empty variable counts as unset, so `HVD_SECRET= cmd` falls back to the file. */
    const char *text = getenv(HVD_SECRET_ENV);
    if (text && *text) {
        if (hvd_secret_from_base64(s, text, err) != 0)
            return hvd_err_prefix(err, "$" HVD_SECRET_ENV ": ");
        return 0;
    }
    const char *path = getenv(HVD_SECRET_FILE_ENV);
    if (path && *path) {
        if (hvd_secret_read_file(s, path, err) != 0)
            return hvd_err_prefix(err, "$" HVD_SECRET_FILE_ENV ": ");
        return 0;
    }
    return hvd_err_set(err, HVD_E_NOT_FOUND,
                       "no job secret: neither $" HVD_SECRET_ENV " (base64) nor "
                       "$" HVD_SECRET_FILE_ENV " (a file holding it) is set");
}

void hvd_secret_wipe(hvd_secret *s) {
    OPENSSL_cleanse(s, sizeof *s);
}
