#include "common/buf.h"

#include <stdlib.h>
#include <string.h>

/* Buffers larger than this are released once drained, so one big frame does not pin memory
 * for the life of a connection. */
#define BUF_KEEP_MAX (64 * 1024)

int hvd_buf_reserve(hvd_buf *b, size_t n) {
    if (b->cap - b->len >= n) return 0;
    if (b->off > 0) { /* compact first */
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= n) return 0;
    }
    size_t need = b->len + n;
    if (need < b->len) return -1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int hvd_buf_append(hvd_buf *b, const void *p, size_t n) {
    if (n == 0) return 0;
    if (hvd_buf_reserve(b, n) != 0) return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void hvd_buf_consume(hvd_buf *b, size_t n) {
    b->off += n;
    if (b->off < b->len) return;
    b->off = b->len = 0;
    if (b->cap > BUF_KEEP_MAX) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

void hvd_buf_free(hvd_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}
