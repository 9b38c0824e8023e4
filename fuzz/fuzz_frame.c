/* libFuzzer target for the frame decoder and everything behind it.
 *
 * The first input byte picks a mode:
 *   even: the rest is a byte stream as a server receives it after the handshake: frames are
 *         cut by their length header (checked against a small maximum) and opened with a fixed
 *         key. Nearly everything must fail authentication, cleanly.
 *   odd:  the rest is the plaintext of one frame: it is sealed with the fixed key, then cut,
 *         opened, and decoded as an envelope and as each RPC message body, as a service would
 *         after authenticating its peer.
 * Also feeds the first 40 bytes to the HELLO parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "frame.h"
#include "handshake.h"
#include "hvd/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_FRAME 4096

static const uint8_t KEY[HVD_KEY_LEN] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                         12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                         23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void decode_payload(const uint8_t *p, size_t n) {
    hvd_envelope env;
    hvd_err err;
    if (hvd_envelope_unpack(p, n, &env, &err) != 0) return;
    const hvd_msg_desc *descs[] = {&hvd_pong_desc, &hvd_error_desc, &hvd_chunk_desc};
    union {
        hvd_pong pong;
        hvd_error_body e;
        hvd_chunk ch;
    } msg;
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++)
        if (hvd_msg_unpack(env.body, descs[i], &msg, &err) == 0) hvd_msg_free(descs[i], &msg);
    hvd_envelope_free(&env);
}

/* Cuts and opens frames from a stream the way the server does. */
static void consume_stream(hvd_seal *rx, uint8_t *buf, size_t size) {
    size_t off = 0;
    while (size - off >= HVD_FRAME_HDR) {
        size_t sealed, plen;
        hvd_err err;
        if (hvd_frame_header(buf + off, FUZZ_MAX_FRAME, &sealed, &err) != 0) return;
        if (size - off - HVD_FRAME_HDR < sealed) return;
        if (hvd_frame_open(rx, buf + off, sealed, &plen, &err) != 0) return;
        decode_payload(buf + off + HVD_FRAME_HDR, plen);
        off += HVD_FRAME_HDR + sealed;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (size >= 1 + HVD_HELLO_LEN) {
        uint8_t nc[HVD_NONCE_LEN];
        int bad;
        hvd_err err;
        hvd_hs_parse_hello(data + 1, nc, &bad, &err);
    }
    hvd_seal rx;
    if (hvd_seal_init(&rx, KEY, 0) != 0) abort();
    if (data[0] % 2 == 0) {
        uint8_t *copy = malloc(size);
        memcpy(copy, data + 1, size - 1);
        consume_stream(&rx, copy, size - 1);
        free(copy);
    } else if (size - 1 <= FUZZ_MAX_FRAME) {
        hvd_seal tx;
        hvd_buf out = {0};
        if (hvd_seal_init(&tx, KEY, 1) != 0) abort();
        if (hvd_frame_seal(&tx, data + 1, size - 1, &out) != 0) abort();
        consume_stream(&rx, out.data, out.len);
        hvd_buf_free(&out);
        hvd_seal_free(&tx);
    }
    hvd_seal_free(&rx);
    return 0;
}
