/* Error sentences (include/hvd/error.h). */
#include "hvd/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Drops trailing newlines so callers can pass strerror-like text without care. */
static void trim_newlines(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

/* Ends a sentence that did not fit in "...", so a cut fingerprint or path is not read as
 * whole. */
static void mark_cut(char *s) {
    memcpy(s + HVD_ERR_MAX - 4, "...", 4);
}

int hvd_err_set(hvd_err *err, int code, const char *fmt, ...) {
    if (!err) return -1;
    /* Format into a scratch buffer first: arguments may point into err->msg itself
     * ("...: %s", err->msg), and vsnprintf with overlapping buffers is undefined. */
    char tmp[HVD_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (r < 0) snprintf(tmp, sizeof tmp, "(unformattable error message)");
    if (r >= (int)sizeof tmp) mark_cut(tmp);
    trim_newlines(tmp);
    err->code = code;
    memcpy(err->msg, tmp, strlen(tmp) + 1);
    return -1;
}

int hvd_err_prefix(hvd_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char tmp[HVD_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (r < 0) tmp[0] = '\0';
    size_t used = strlen(tmp), rest = strlen(err->msg);
    if (used < sizeof tmp - 1) snprintf(tmp + used, sizeof tmp - used, "%s", err->msg);
    if (r >= (int)sizeof tmp || used + rest >= sizeof tmp) mark_cut(tmp);
    trim_newlines(tmp);
    memcpy(err->msg, tmp, strlen(tmp) + 1);
    return -1;
}

const char *hvd_status_name(int code) {
    switch (code) {
    case HVD_OK:
        return "ok";
    case HVD_E_PROTOCOL:
        return "protocol error";
    case HVD_E_UNKNOWN_TYPE:
        return "unknown message type";
    case HVD_E_INVALID:
        return "invalid argument";
    case HVD_E_NOT_FOUND:
        return "not found";
    case HVD_E_STATE:
        return "not allowed in the current state";
    case HVD_E_INTERNAL:
        return "internal error";
    case HVD_E_SHUTDOWN:
        return "shutting down";
    case HVD_E_TIMEOUT:
        return "timed out";
    case HVD_E_IO:
        return "I/O error";
    case HVD_E_AUTH:
        return "authentication failed";
    default:
        return "unknown status";
    }
}
