/* A growable byte buffer with a read offset: bytes are appended at the end and consumed from
 * the front. Used for connection input and output. */
#ifndef HVD_COMMON_BUF_H
#define HVD_COMMON_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct hvd_buf {
    uint8_t *data;
    size_t off; /* first unconsumed byte */
    size_t len; /* end of valid bytes */
    size_t cap;
} hvd_buf;

/* Bytes held and not yet consumed. */
static inline size_t hvd_buf_pending(const hvd_buf *b) {
    return b->len - b->off;
}

/* Makes room for n more bytes at the end. Returns 0, or -1 on out of memory. */
int hvd_buf_reserve(hvd_buf *b, size_t n);
/* Appends n bytes. Returns 0, or -1 on out of memory. */
int hvd_buf_append(hvd_buf *b, const void *p, size_t n);
/* Consumes n bytes from the front; compacts or releases memory when it is worth it. */
void hvd_buf_consume(hvd_buf *b, size_t n);
void hvd_buf_free(hvd_buf *b);

#endif
