/* Error reporting shared by every hvd-bridge library.
 *
 * Functions that can fail take an `hvd_err *` (which may be NULL) and, on failure, write one
 * human sentence into it that names what failed and, where it helps, what to do. They return
 * -1 (or NULL) on failure and 0 (or a valid pointer) on success. No library function exits
 * the process. */
#ifndef HVD_ERROR_H
#define HVD_ERROR_H

#include <stddef.h>

/* Status codes carried in error replies on the wire (docs/protocol.md, "Error replies") and
 * in hvd_err.code. The numbers are part of the protocol: never renumber. */
typedef enum hvd_status {
    HVD_OK = 0,
    HVD_E_PROTOCOL = 1,     /* malformed frame or message body */
    HVD_E_UNKNOWN_TYPE = 2, /* message type this service does not serve */
    HVD_E_INVALID = 3,      /* well-formed request with an invalid argument */
    HVD_E_NOT_FOUND = 4,    /* the thing named by the request does not exist */
    HVD_E_STATE = 5,        /* request not allowed in the service's current state */
    HVD_E_INTERNAL = 6,     /* the service failed (out of memory, fork failed, ...) */
    HVD_E_SHUTDOWN = 7,     /* the service is shutting down */
    HVD_E_TIMEOUT = 8,      /* an operation ran out of time */
    HVD_E_IO = 9,           /* a socket or file operation failed (local only, never sent) */
    HVD_E_AUTH = 10,        /* the handshake failed: wrong secret or wrong service (local only) */
} hvd_status;

/* Room for one sentence of error text. */
#define HVD_ERR_MAX 512

typedef struct hvd_err {
    int code;              /* an hvd_status */
    char msg[HVD_ERR_MAX]; /* NUL-terminated sentence, no trailing newline */
} hvd_err;

/* Sets err->code and formats err->msg (printf-style). err may be NULL. Returns -1 so callers
 * can write `return hvd_err_set(err, ...);`. Text that does not fit is cut and ends in "..."
 * (so does a prefixed one). */
int hvd_err_set(hvd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefixes err->msg with formatted context ("connecting to driver: " + old text). */
int hvd_err_prefix(hvd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The name of a status code ("protocol error", "not found", ...). Never NULL. */
const char *hvd_status_name(int code);

#endif
