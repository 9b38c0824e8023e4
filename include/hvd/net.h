/* Job secrets, service addresses, local interface discovery and the host hash.
 *
 * These are the identity pieces every hvd-bridge process needs before it can talk RPC:
 * the 32-byte job secret (never on a command line, never logged), the list of addresses a
 * service listens on (one or more per network interface), and the host hash that names an
 * executor's "host" to Open MPI. */
#ifndef HVD_NET_H
#define HVD_NET_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/error.h"

/* ---- Job secret ------------------------------------------------------------------------- */

#define HVD_SECRET_LEN 32

/* Environment variable holding the secret as standard base64 (44 characters). */
#define HVD_SECRET_ENV "HVD_SECRET"
/* Environment variable naming a file that holds the base64 secret; the file must be owned by
 * the current user and not readable by group or others. */
#define HVD_SECRET_FILE_ENV "HVD_SECRET_FILE"

typedef struct hvd_secret {
    uint8_t key[HVD_SECRET_LEN];
} hvd_secret;

/* Fills s with 32 bytes from the OS CSPRNG. Returns 0, or -1 with err. */
int hvd_secret_generate(hvd_secret *s, hvd_err *err);

/* Writes the base64 form (44 characters + NUL) into out, which must hold 45 bytes. */
void hvd_secret_to_base64(const hvd_secret *s, char out[45]);

/* Parses base64 text (surrounding white space allowed) that must decode to exactly 32 bytes.
 * Returns 0, or -1 with err. */
int hvd_secret_from_base64(hvd_secret *s, const char *text, hvd_err *err);

/* Loads the job secret: from $HVD_SECRET if set, else from the file named by
 * $HVD_SECRET_FILE. Returns 0, or -1 with err saying which source was tried and why it
 * failed (unset, bad base64, file readable by others, ...). */
int hvd_secret_load_env(hvd_secret *s, hvd_err *err);

/* Reads a secret file written by hvd_secret_write_file. Refuses a file that group or others
 * can read or that another user owns. Returns 0, or -1 with err. */
int hvd_secret_read_file(hvd_secret *s, const char *path, hvd_err *err);

/* Creates path (must not exist) with mode 0600 and writes the base64 secret and a newline.
 * Returns 0, or -1 with err. */
int hvd_secret_write_file(const hvd_secret *s, const char *path, hvd_err *err);

/* Overwrites the secret with zeros in a way the compiler cannot drop. */
void hvd_secret_wipe(hvd_secret *s);

/* ---- Addresses ---------------------------------------------------------------------------- */

#define HVD_IFNAME_MAX 16 /* IFNAMSIZ */
#define HVD_HOST_MAX   64 /* an IPv4 or IPv6 literal, IPv6 with "%scope" */

/* One address a service listens on. */
typedef struct hvd_addr {
    char ifname[HVD_IFNAME_MAX]; /* interface name ("lo", "eth0"); "" when unknown */
    char host[HVD_HOST_MAX];     /* numeric IP: "10.0.0.5", "fe80::1%eth0" */
    uint16_t port;
} hvd_addr;

/* Lists the addresses of this machine's interfaces that are up, IPv4 and IPv6 (link-local
 * IPv6 with its "%ifname" scope), each with the given port. If `only` is non-NULL it is a
 * NULL-terminated list of interface names to keep. Order: interfaces in the order the kernel
 * reports them, IPv4 before IPv6 within one interface. On success *out is a malloc'd array
 * (free with free()) and *n its length; returns 0. Returns -1 with err if discovery fails or
 * nothing is left after filtering (the message names the filter). */
int hvd_local_addrs(hvd_addr **out, size_t *n, uint16_t port, const char *const *only,
                    hvd_err *err);

/* Text form of an address list, used in environment variables and files:
 *   "lo=127.0.0.1:4000,eth0=10.0.0.2:4000,eth0=[fe80::1%eth0]:4000"
 * An entry without "ifname=" has an empty interface name. IPv6 hosts are bracketed.
 * hvd_addrs_format returns a malloc'd string (NULL only on out of memory). */
char *hvd_addrs_format(const hvd_addr *addrs, size_t n);

/* Parses the text form. Returns 0 with a malloc'd array in *out, or -1 with err naming the
 * offending entry. An empty string is an error. */
int hvd_addrs_parse(const char *text, hvd_addr **out, size_t *n, hvd_err *err);

/* Where a service listens, from what a user wrote (--bind, bind_host): a numeric IPv4 or IPv6
 * address is taken as it is; an interface name ("lo", "eth0") becomes its first address
 * (IPv4 before IPv6); "", "*", "0.0.0.0" and "::" mean every interface, written as "" into
 * out. Returns 0, or -1 with err naming the interfaces that are up when the name is none of
 * them. */
int hvd_bind_resolve(const char *spec, char *out, size_t len, hvd_err *err);

/* Formats one address as "host:port" or "[v6]:port" into buf; returns buf. */
char *hvd_addr_str(const hvd_addr *a, char *buf, size_t len);

/* ---- Host hash -------------------------------------------------------------------------- */

/* Environment variable that overrides the computed host hash (tests, fake hosts). */
#define HVD_HOST_HASH_ENV "HVD_HOST_HASH"

#define HVD_HOST_HASH_MAX 128

/* Computes this process's host hash: the first label of the hostname, '-', and the hex MD5
 * of "<hostname>-<ns links>" where <ns links> are the targets of the links in /proc/self/ns
 * joined by spaces in sorted order, followed by "-<salt>" if salt is non-NULL and
 * "-$CONTAINER_ID" if that is set. Characters other than [A-Za-z0-9_-] in the label become
 * '_' so the result never contains '.' or ':' (Open MPI would treat it as a local name or as
 * host:slots). $HVD_HOST_HASH, when set and valid, is returned instead. Returns 0, or -1 with
 * err (an invalid override names the bad character). */
int hvd_host_hash(char out[HVD_HOST_HASH_MAX], const char *salt, hvd_err *err);

/* True if s is a valid host hash: 1..127 characters of [A-Za-z0-9_-]. */
int hvd_host_hash_valid(const char *s);

#endif
