/* OpenSSH known_hosts files: lookup of a host's keys and accept-new appends.
 *
 * Format (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"), one entry per line:
 *
 *     [@marker] hostpatterns keytype base64-key [comment]
 *
 * hostpatterns is either a comma-separated list of names with `*`/`?` wildcards and `!`
 * negations, or one hashed name `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`. A host on a
 * port other than 22 is named `[host]:port`. Markers: `@revoked` (the key must never be
 * accepted) and `@cert-authority` (a CA; certificates are not supported here, so those lines
 * are skipped). Blank lines and `#` comments are skipped, and so are lines that do not parse
 * (as OpenSSH does).
 *
 * Host names are compared in lower case. Key comparison is on the decoded key blob (the SSH
 * wire encoding), so "ssh-rsa" entries match servers that sign with rsa-sha2-256/512. */
#ifndef HVD_SSH_KNOWN_HOSTS_H
#define HVD_SSH_KNOWN_HOSTS_H

#include <stdbool.h>
#include <stddef.h>

#include "hvd/error.h"

/* Room for a key type name list ("ssh-ed25519,ecdsa-sha2-nistp256"). */
#define HVD_KH_TYPES_MAX 256
/* Room for a file path in a lookup result. */
#define HVD_KH_PATH_MAX 4096

typedef enum hvd_kh_status {
    HVD_KH_UNKNOWN = 0, /* no line names this host */
    HVD_KH_MATCH,       /* a line for this host holds exactly this key */
    HVD_KH_OTHER_TYPE,  /* the host is known, but only with keys of other types */
    HVD_KH_CHANGED,     /* a line for this host holds a different key of the same type */
    HVD_KH_REVOKED,     /* the key is listed under @revoked */
} hvd_kh_status;

typedef struct hvd_kh_result {
    hvd_kh_status status;
    char file[HVD_KH_PATH_MAX];   /* MATCH/CHANGED/REVOKED: the file of the deciding line */
    int line;                     /* ... and its 1-based line number */
    char types[HVD_KH_TYPES_MAX]; /* key types on file for the host, in file order, no dups */
} hvd_kh_result;

/* Writes the name known_hosts uses for host:port into out: the lower-cased host for port 22,
 * "[host]:port" otherwise. Returns 0, or -1 if it does not fit. */
int hvd_kh_host_name(const char *host, int port, char *out, size_t outlen);

/* The key type carried in an SSH key blob ("ssh-ed25519" ...), copied into out.
 * Returns 0, or -1 if the blob is malformed or the name does not fit. */
int hvd_kh_blob_type(const unsigned char *blob, size_t blob_len, char *out, size_t outlen);

/* Looks host:port up in files (NULL entries and missing files are skipped). With key == NULL
 * it only collects res->types (status UNKNOWN or OTHER_TYPE). Precedence, as in OpenSSH:
 * REVOKED, then MATCH (any line holding the key), then CHANGED (first line with a different
 * key of the key's type), then OTHER_TYPE, then UNKNOWN.
 * Returns 0 with *res filled, or -1 with err set when a file exists but cannot be read. */
int hvd_kh_lookup(const char *const *files, size_t nfiles, const char *host, int port,
                  const unsigned char *key, size_t key_len, hvd_kh_result *res, hvd_err *err);

/* Appends "name keytype base64" for host:port to file (hashed name when hash is true),
 * creating the file (mode 0600) and its parent directory (0700) if missing. Takes an flock on
 * the file while appending, and adds a newline first if the file does not end with one.
 * Returns 0, or -1 with err set. */
int hvd_kh_append(const char *file, const char *host, int port, const unsigned char *key,
                  size_t key_len, bool hash, hvd_err *err);

/* "SHA256:<unpadded base64>" fingerprint of a key blob, as OpenSSH prints it.
 * Returns 0, or -1 if out is too small (needs 52 bytes). */
int hvd_kh_fingerprint(const unsigned char *blob, size_t blob_len, char *out, size_t outlen);

#endif
