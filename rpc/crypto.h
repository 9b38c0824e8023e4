/* The cryptographic primitives of the protocol, on OpenSSL: HMAC-SHA256 for the handshake
 * proofs, HKDF-SHA256 for the per-connection keys, AES-256-GCM with counter nonces for
 * sealing frames (docs/protocol.md, "Handshake" and "Frames"). */
#ifndef HVD_RPC_CRYPTO_H
#define HVD_RPC_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define HVD_MAC_LEN 32
#define HVD_KEY_LEN 32
#define HVD_TAG_LEN 16

/* out = HMAC-SHA256(key, concatenation of the n parts). Returns 0, or -1 on failure. */
int hvd_hmac_sha256(const uint8_t key[HVD_KEY_LEN], const void *const *parts, const size_t *lens,
                    size_t n, uint8_t out[HVD_MAC_LEN]);

/* out = HKDF-SHA256(ikm, salt, info), outlen bytes. Returns 0, or -1. */
int hvd_hkdf_sha256(const uint8_t *ikm, size_t ikm_len, const uint8_t *salt, size_t salt_len,
                    const uint8_t *info, size_t info_len, uint8_t *out, size_t outlen);

/* Constant-time comparison; 1 if equal. */
int hvd_ct_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* One direction of a connection: AES-256-GCM under one key, nonce = 4 zero bytes followed by
 * a 64-bit big-endian counter that starts at 0 and grows by one per frame. */
typedef struct hvd_seal {
    void *ctx;        /* EVP_CIPHER_CTX */
    uint64_t counter; /* nonce of the next frame */
    int encrypt;      /* 1 sealing, 0 opening */
} hvd_seal;

/* Prepares a direction with its key. Returns 0, or -1. */
int hvd_seal_init(hvd_seal *s, const uint8_t key[HVD_KEY_LEN], int encrypt);
void hvd_seal_free(hvd_seal *s);

/* Seals len bytes of in into out (len bytes of ciphertext followed by the 16-byte tag), with
 * aad authenticated, and advances the counter. in and out may be the same. Returns 0, or -1. */
int hvd_seal_frame(hvd_seal *s, const uint8_t *aad, size_t aad_len, const uint8_t *in, size_t len,
                   uint8_t *out);

/* Opens len bytes (ciphertext + tag, len >= 16) in place into the first len-16 bytes and
 * advances the counter. Returns 0, or -1 if authentication fails (tampered, replayed,
 * reordered, reflected or wrongly keyed frame). */
int hvd_open_frame(hvd_seal *s, const uint8_t *aad, size_t aad_len, uint8_t *buf, size_t len);

#endif
