/* A structural pre-check of untrusted msgpack bytes (see hvd_msgpack_check in
 * include/hvd/message.h): msgpack-c sizes a container's element array from its header before
 * reading the elements, so a 5-byte "array of 4 billion" would make it allocate ~100 GB. */
#include "hvd/message.h"

/* Deeper nesting than any hvd-bridge message needs, and below msgpack-c's own stack limit. */
#define CHECK_MAX_DEPTH 16

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
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
        uint8_t b = buf[i++];
        uint64_t skip = 0;  /* payload bytes after the header */
        uint64_t items = 0; /* child objects, for containers */
        int container = 0;
        int hdr = 0; /* length bytes that follow the type byte */
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b <= 0x8f) {
            container = 1;
            items = (uint64_t)(b & 0x0f) * 2;
        } else if (b <= 0x9f) {
            container = 1;
            items = b & 0x0f;
        } else if (b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4:
            case 0xd9:
                hdr = 1;
                break;
            case 0xc5:
            case 0xda:
                hdr = 2;
                break;
            case 0xc6:
            case 0xdb:
                hdr = 4;
                break;
            case 0xc7:
                hdr = 1;
                skip = 1;
                break;
            case 0xc8:
                hdr = 2;
                skip = 1;
                break;
            case 0xc9:
                hdr = 4;
                skip = 1;
                break;
            case 0xca:
                skip = 4;
                break;
            case 0xcb:
                skip = 8;
                break;
            case 0xcc:
            case 0xd0:
                skip = 1;
                break;
            case 0xcd:
            case 0xd1:
                skip = 2;
                break;
            case 0xce:
            case 0xd2:
                skip = 4;
                break;
            case 0xcf:
            case 0xd3:
                skip = 8;
                break;
            case 0xd4:
                skip = 2;
                break;
            case 0xd5:
                skip = 3;
                break;
            case 0xd6:
                skip = 5;
                break;
            case 0xd7:
                skip = 9;
                break;
            case 0xd8:
                skip = 17;
                break;
            case 0xdc:
                hdr = 2;
                container = 1;
                break;
            case 0xdd:
                hdr = 4;
                container = 1;
                break;
            case 0xde:
                hdr = 2;
                container = 2;
                break;
            case 0xdf:
                hdr = 4;
                container = 2;
                break;
            default:
                return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body has the invalid byte 0x%02x",
                                   b);
            }
            if (hdr) {
                if (len - i < (size_t)hdr)
                    return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body is truncated");
                uint64_t n = be(buf + i, hdr);
                i += hdr;
                if (container)
                    items = n * (uint64_t)container;
                else
                    skip += n;
            }
        }
        if (skip > len - i) return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body is truncated");
        i += skip;
        if (container) {
            if (items > len - i)
                return hvd_err_set(err, HVD_E_PROTOCOL,
                                   "msgpack container claims %llu elements but only %zu bytes "
                                   "remain",
                                   (unsigned long long)items, len - i);
            if (depth == CHECK_MAX_DEPTH)
                return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body nests deeper than %d",
                                   CHECK_MAX_DEPTH);
            pending[++depth] = items;
        }
    }
    if (i != len)
        return hvd_err_set(err, HVD_E_PROTOCOL, "msgpack body has %zu trailing bytes", len - i);
    return 0;
}
