#include "frame.h"

int hvd_frame_header(const uint8_t hdr[HVD_FRAME_HDR], size_t max_payload, size_t *sealed_len,
                     hvd_err *err) {
    uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (n < HVD_TAG_LEN)
        return hvd_err_set(err, HVD_E_PROTOCOL, "frame length %u is shorter than its tag", n);
    if ((size_t)n - HVD_TAG_LEN > max_payload)
        return hvd_err_set(err, HVD_E_PROTOCOL,
                           "frame of %u bytes exceeds the maximum of %zu bytes; raise the "
                           "maximum frame size on both sides if this is legitimate",
                           n - HVD_TAG_LEN, max_payload);
    *sealed_len = n;
    return 0;
}

int hvd_frame_seal(hvd_seal *tx, const uint8_t *payload, size_t len, hvd_buf *out) {
    if (len > (size_t)INT32_MAX - HVD_TAG_LEN) return -1;
    size_t sealed = len + HVD_TAG_LEN;
    if (hvd_buf_reserve(out, HVD_FRAME_HDR + sealed) != 0) return -1;
    uint8_t *p = out->data + out->len;
    p[0] = (uint8_t)(sealed >> 24);
    p[1] = (uint8_t)(sealed >> 16);
    p[2] = (uint8_t)(sealed >> 8);
    p[3] = (uint8_t)sealed;
    if (hvd_seal_frame(tx, p, HVD_FRAME_HDR, payload, len, p + HVD_FRAME_HDR) != 0) return -1;
    out->len += HVD_FRAME_HDR + sealed;
    return 0;
}

int hvd_frame_open(hvd_seal *rx, uint8_t *frame, size_t sealed_len, size_t *payload_len,
                   hvd_err *err) {
    if (sealed_len < HVD_TAG_LEN)
        return hvd_err_set(err, HVD_E_PROTOCOL, "frame shorter than its tag");
    if (hvd_open_frame(rx, frame, HVD_FRAME_HDR, frame + HVD_FRAME_HDR, sealed_len) != 0)
        return hvd_err_set(err, HVD_E_PROTOCOL,
                           "frame failed authentication (tampered, replayed, reordered, "
                           "reflected or sealed with another key)");
    *payload_len = sealed_len - HVD_TAG_LEN;
    return 0;
}
