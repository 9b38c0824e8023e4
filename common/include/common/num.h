/* Numbers from command lines and the environment, validated: "12abc", "", "-3" where only
 * positives make sense, and overflows are errors, never silently 0 or truncated (atoi). */
#ifndef HVD_COMMON_NUM_H
#define HVD_COMMON_NUM_H

#include "hvd/error.h"

/* Parses a whole decimal integer (optional leading '-', no white space) in [min, max].
 * Returns 0 with *out, or -1 with err naming `what` ("--timeout"), the text and the range. */
int hvd_parse_long(const char *text, long min, long max, const char *what, long *out, hvd_err *err);

/* The same for an int. */
int hvd_parse_int(const char *text, int min, int max, const char *what, int *out, hvd_err *err);

/* A whole unsigned decimal number up to INT_MAX, with no library call (async-signal-safe: for
 * /proc entries and descriptor names in a forked child); -1 if s is not one. */
long hvd_parse_digits(const char *s);

#endif
