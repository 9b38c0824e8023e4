#include "handshake.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "hvd/rpc.h"

static const uint8_t MAGIC[4] = {'H', 'V', 'D', 'B'};

int hvd_hs_nonce(uint8_t nonce[HVD_NONCE_LEN]) {
    return RAND_bytes(nonce, HVD_NONCE_LEN) == 1 ? 0 : -1;
}

void hvd_hs_hello(const uint8_t nc[HVD_NONCE_LEN], uint8_t out[HVD_HELLO_LEN]) {
    memcpy(out, MAGIC, 4);
    out[4] = HVD_PROTOCOL_VERSION;
    out[5] = out[6] = out[7] = 0;
    memcpy(out + 8, nc, HVD_NONCE_LEN);
}

int hvd_hs_parse_hello(const uint8_t in[HVD_HELLO_LEN], uint8_t nc[HVD_NONCE_LEN], int *bad_version,
                       hvd_err *err) {
    *bad_version = 0;
    if (memcmp(in, MAGIC, 4) != 0)
        return hvd_err_set(err, HVD_E_PROTOCOL, "peer does not speak the hvd-bridge protocol");
    if (in[4] != HVD_PROTOCOL_VERSION) {
        *bad_version = 1;
        return hvd_err_set(err, HVD_E_PROTOCOL, "peer speaks protocol version %u, we speak %u",
                           in[4], HVD_PROTOCOL_VERSION);
    }
    memcpy(nc, in + 8, HVD_NONCE_LEN);
    return 0;
}

int hvd_hs_proof(const hvd_secret *k, const char *name, int server, const uint8_t nc[HVD_NONCE_LEN],
                 const uint8_t ns[HVD_NONCE_LEN], uint8_t out[HVD_MAC_LEN]) {
    static const char server_label[] = "hvd-bridge/1 server";
    static const char client_label[] = "hvd-bridge/1 client";
    size_t nlen = strlen(name);
    if (nlen > HVD_SERVICE_NAME_LEN_MAX) return -1;
    uint8_t sep_len[3] = {0, (uint8_t)(nlen >> 8), (uint8_t)nlen};
    const void *parts[] = {server ? server_label : client_label, sep_len, name, nc, ns};
    size_t lens[] = {sizeof server_label - 1, 3, nlen, HVD_NONCE_LEN, HVD_NONCE_LEN};
    return hvd_hmac_sha256(k->key, parts, lens, 5, out);
}

void hvd_hs_challenge(uint8_t status, const uint8_t ns[HVD_NONCE_LEN],
                      const uint8_t ps[HVD_MAC_LEN], uint8_t out[HVD_CHALLENGE_LEN]) {
    memcpy(out, MAGIC, 4);
    out[4] = HVD_PROTOCOL_VERSION;
    out[5] = status;
    out[6] = out[7] = 0;
    memcpy(out + 8, ns, HVD_NONCE_LEN);
    memcpy(out + 8 + HVD_NONCE_LEN, ps, HVD_MAC_LEN);
}

int hvd_hs_keys(const hvd_secret *k, const char *name, const uint8_t nc[HVD_NONCE_LEN],
                const uint8_t ns[HVD_NONCE_LEN], uint8_t c2s[HVD_KEY_LEN],
                uint8_t s2c[HVD_KEY_LEN]) {
    static const char label[] = "hvd-bridge/1 keys";
    uint8_t salt[2 * HVD_NONCE_LEN];
    memcpy(salt, nc, HVD_NONCE_LEN);
    memcpy(salt + HVD_NONCE_LEN, ns, HVD_NONCE_LEN);
    size_t nlen = strlen(name);
    uint8_t info[sizeof label + HVD_SERVICE_NAME_LEN_MAX];
    if (nlen > HVD_SERVICE_NAME_LEN_MAX) return -1;
    memcpy(info, label, sizeof label); /* includes the 0x00 separator */
    memcpy(info + sizeof label, name, nlen);
    uint8_t okm[2 * HVD_KEY_LEN];
    if (hvd_hkdf_sha256(k->key, HVD_SECRET_LEN, salt, sizeof salt, info, sizeof label + nlen, okm,
                        sizeof okm) != 0)
        return -1;
    memcpy(c2s, okm, HVD_KEY_LEN);
    memcpy(s2c, okm + HVD_KEY_LEN, HVD_KEY_LEN);
    OPENSSL_cleanse(okm, sizeof okm);
    return 0;
}
