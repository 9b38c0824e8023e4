/* A structural pre-check of untrusted msgpack bytes (see hvd_msgpack_check in
 * include/hvd/message.h): msgpack-c sizes a container's element array from its header before
 * reading the elements, so a 5-byte "array of 4 billion" would make it allocate ~100 GB. */
#include "hvd/message.h"

#include <stdbool.h>

/* Deeper nesting than any hvd-bridge message needs, and below msgpack-c's own stack limit. */
#define CHECK_MAX_DEPTH 16

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The layout of the type bytes 0xc0..0xdf: length bytes after the type byte (hdr), fixed payload
 * bytes (skip, before the length's own payload), and whether the length counts array items (1)
 * or map pairs (2). 0xc1 is never used (valid = 0). */
typedef struct layout {
    uint8_t valid, hdr, skip, container;
} layout;
static const layout LAYOUTS[0x20] = {
    [0x00] = {1, 0, 0, 0},  /* nil */
    [0x02] = {1, 0, 0, 0},  /* false */
    [0x03] = {1, 0, 0, 0},  /* true */
    [0x04] = {1, 1, 0, 0},  /* bin 8 */
    [0x05] = {1, 2, 0, 0},  /* bin 16 */
    [0x06] = {1, 4, 0, 0},  /* bin 32 */
    [0x07] = {1, 1, 1, 0},  /* ext 8 */
    [0x08] = {1, 2, 1, 0},  /* ext 16 */
    [0x09] = {1, 4, 1, 0},  /* ext 32 */
    [0x0a] = {1, 0, 4, 0},  /* float 32 */
    [0x0b] = {1, 0, 8, 0},  /* float 64 */
    [0x0c] = {1, 0, 1, 0},  /* uint 8 */
    [0x0d] = {1, 0, 2, 0},  /* uint 16 */
    [0x0e] = {1, 0, 4, 0},  /* uint 32 */
    [0x0f] = {1, 0, 8, 0},  /* uint 64 */
    [0x10] = {1, 0, 1, 0},  /* int 8 */
    [0x11] = {1, 0, 2, 0},  /* int 16 */
    [0x12] = {1, 0, 4, 0},  /* int 32 */
    [0x13] = {1, 0, 8, 0},  /* int 64 */
    [0x14] = {1, 0, 2, 0},  /* fixext 1 */
    [0x15] = {1, 0, 3, 0},  /* fixext 2 */
    [0x16] = {1, 0, 5, 0},  /* fixext 4 */
    [0x17] = {1, 0, 9, 0},  /* fixext 8 */
    [0x18] = {1, 0, 17, 0}, /* fixext 16 */
    [0x19] = {1, 1, 0, 0},  /* str 8 */
    [0x1a] = {1, 2, 0, 0},  /* str 16 */
    [0x1b] = {1, 4, 0, 0},  /* str 32 */
    [0x1c] = {1, 2, 0, 1},  /* array 16 */
    [0x1d] = {1, 4, 0, 1},  /* array 32 */
    [0x1e] = {1, 2, 0, 2},  /* map 16 */
    [0x1f] = {1, 4, 0, 2},  /* map 32 */
};

/* The object that starts at buf[*i] (its type byte): moves *i past its own bytes (not its
 * children's) and sets *items to its children, 0 for scalars. Returns 0, or -1 with err. */
static int read_object(const uint8_t *buf, size_t len, size_t *i, uint64_t *items, bool *container,
                       hvd_err *err) {
    uint8_t b = buf[(*i)++];
    uint64_t skip = 0;
    *items = 0;
    *container = false;
    if (b <= 0x7f || b >= 0xe0) {
        /* positive and negative fixint */
    } else if (b <= 0x8f) {
        *container = true;
        *items = (uint64_t)(b & 0x0f) * 2;
    } else if (b <= 0x9f) {
        *container = true;
        *items = b & 0x0f;
    } else if (b <= 0xbf) {
        skip = b & 0x1f; /* fixstr */
    } else {
        const layout *l = &LAYOUTS[b - 0xc0];
        if (!l->valid)
            return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body has the invalid byte 0x%02x", b);
        skip = l->skip;
        if (l->hdr) {
            if (len - *i < l->hdr)
                return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body is truncated");
            uint64_t n = be(buf + *i, l->hdr);
            *i += l->hdr;
            if (l->container) {
                *container = true;
                *items = n * l->container;
            } else {
                skip += n;
            }
        }
    }
    if (skip > len - *i) return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body is truncated");
    *i += skip;
    return 0;
}

int hvd_msgpack_check(const uint8_t *buf, size_t len, hvd_err *err) {
    uint64_t pending[CHECK_MAX_DEPTH + 1]; /* objects still to read at each open level */
    int depth = 0;
    size_t i = 0, objects = 0;
    pending[0] = 1;
    while (depth >= 0) {
        if (pending[depth] == 0) {
            depth--;
            continue;
        }
        pending[depth]--;
        if (++objects > HVD_MSGPACK_MAX_OBJECTS)
            return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body holds more than %u objects",
                               HVD_MSGPACK_MAX_OBJECTS);
        if (i >= len) return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body is truncated");
        uint64_t items;
        bool container;
        if (read_object(buf, len, &i, &items, &container, err) != 0) return -1;
        if (!container) continue;
        if (items > len - i)
            return hvd_err_set(err, HVD_E_PROTOCOL,
                               "msgpack container claims %llu elements but only %zu bytes remain",
                               (unsigned long long)items, len - i);
        if (depth == CHECK_MAX_DEPTH)
            return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body nests deeper than %d",
                               CHECK_MAX_DEPTH);
        pending[++depth] = items;
    }
    if (i != len)
        return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body has %zu trailing bytes", len - i);
    return 0;
}
