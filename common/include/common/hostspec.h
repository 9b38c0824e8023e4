/* "[user@]host[:number]" host specifications, as users write them on command lines
 * (--ssh-hosts h1:2, ssh's user@host, -H host:slots). An IPv6 address is written in brackets
 * when a number follows ("[fe80::1]:2"); without brackets an address with more than one ':'
 * is taken whole as the host. */
#ifndef HVD_COMMON_HOSTSPEC_H
#define HVD_COMMON_HOSTSPEC_H

#include <stddef.h>

#include "hvd/error.h"

typedef struct hvd_hostspec {
    char user[64];  /* "" when none was given */
    char host[256]; /* the host name or address, brackets removed */
    long number;    /* the number after ':', or -1 when none was given */
} hvd_hostspec;

/* Parses s[0..len). Rejects an empty user or host, a host with white space or shell
 * metacharacters, and a number that is not a decimal in [min, max]. Returns 0, or -1 with err
 * quoting the entry and saying what is wrong. `what` names the number in messages ("slots",
 * "port"). */
int hvd_hostspec_parse(const char *s, size_t len, const char *what, long min, long max,
                       hvd_hostspec *out, hvd_err *err);

/* The most slots (ranks) one host may have, wherever hosts are given (-H, --ssh-hosts, a
 * hostfile). */
#define HVD_HOST_MAX_SLOTS 4096

/* Horovod's hostfile: "<host> slots=<n>" per line (one slot when slots= is left out), '#'
 * starts a comment, blank lines are skipped. The one reader of the format, for hvd-driver's
 * --hostfile and hvd_bridge.run(hostfile=). hvd_hostfile_parse turns the text into -H's form,
 * "host:n,host:n" (malloc'd into *out); `name` names the file in messages. It refuses any other
 * word (so a typo is not a host), n outside 1..HVD_HOST_MAX_SLOTS, "host:n" (that is -H's
 * form), a comma, an IPv6 address without brackets, a host hvd_hostspec_parse refuses, a NUL
 * byte (a UTF-16 file), and text that names no host: HVD_E_INVALID, the message naming the
 * file, the line and what to write. hvd_hostfile_read reads the file first (at most 16 MiB;
 * HVD_E_IO with errno set when it cannot). */
int hvd_hostfile_parse(const char *text, size_t len, const char *name, char **out, hvd_err *err);
int hvd_hostfile_read(const char *path, char **out, hvd_err *err);

#endif
