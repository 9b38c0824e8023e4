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

#endif
