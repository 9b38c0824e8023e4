/* Frames: a 4-byte big-endian length, then that many bytes of AES-256-GCM ciphertext and tag.
 * The length counts ciphertext + tag (payload + 16) and is authenticated as associated data.
 * It is checked against the maximum before anything is allocated (docs/protocol.md, "Frames"). */
#ifndef HVD_RPC_FRAME_H
#define HVD_RPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "crypto.h"
#include "hvd/error.h"

#define HVD_FRAME_HDR 4

/* Reads the length from a frame header. Returns 0 with *sealed_len (bytes that follow the
 * header), or -1 with err (HVD_E_PROTOCOL) if it is below 16 or above max_payload + 16. */
int hvd_frame_header(const uint8_t hdr[HVD_FRAME_HDR], size_t max_payload, size_t *sealed_len,
                     hvd_err *err);

/* Seals payload into one frame appended to out. Returns 0, or -1 (out of memory, counter
 * exhausted, payload over 2 GiB). */
int hvd_frame_seal(hvd_seal *tx, const uint8_t *payload, size_t len, hvd_buf *out);

/* Opens the frame at frame[0 .. HVD_FRAME_HDR + sealed_len) in place. Returns 0 with the
 * payload at frame + HVD_FRAME_HDR and its length in *payload_len, or -1 with err
 * (HVD_E_PROTOCOL) if the frame does not authenticate. */
int hvd_frame_open(hvd_seal *rx, uint8_t *frame, size_t sealed_len, size_t *payload_len,
                   hvd_err *err);

#endif
