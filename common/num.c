/* Validated numbers (common/num.h). */
#include "common/num.h"

#include <errno.h>
#include <stdlib.h>

int hvd_parse_long(const char *text, long min, long max, const char *what, long *out,
                   hvd_err *err) {
    char *end = NULL;
    errno = 0;
    long v = text && *text && *text != ' ' && *text != '+' ? strtol(text, &end, 10) : 0;
    if (!end || *end || errno == ERANGE || v < min || v > max)
        return hvd_err_set(err, HVD_E_INVALID,
                           "%s must be a whole number from %ld to %ld, not '%.40s'", what, min, max,
                           text ? text : "");
    *out = v;
    return 0;
}

int hvd_parse_int(const char *text, int min, int max, const char *what, int *out, hvd_err *err) {
    long v;
    if (hvd_parse_long(text, min, max, what, &v, err) != 0) return -1;
    *out = (int)v;
    return 0;
}

long hvd_parse_digits(const char *s) {
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 0x7fffffff / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}
