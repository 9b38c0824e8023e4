#include "crypto.h"

#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

int hvd_hmac_sha256(const uint8_t key[HVD_KEY_LEN], const void *const *parts, const size_t *lens,
                    size_t n, uint8_t out[HVD_MAC_LEN]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!mac) return -1;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    int rc = -1;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    if (!ctx || !EVP_MAC_init(ctx, key, HVD_KEY_LEN, params)) goto out;
    for (size_t i = 0; i < n; i++)
        if (lens[i] && !EVP_MAC_update(ctx, parts[i], lens[i])) goto out;
    size_t outlen = 0;
    if (!EVP_MAC_final(ctx, out, &outlen, HVD_MAC_LEN) || outlen != HVD_MAC_LEN) goto out;
    rc = 0;
out:
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return rc;
}

int hvd_hkdf_sha256(const uint8_t *ikm, size_t ikm_len, const uint8_t *salt, size_t salt_len,
                    const uint8_t *info, size_t info_len, uint8_t *out, size_t outlen) {
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    if (!kdf) return -1;
    EVP_KDF_CTX *ctx = EVP_KDF_CTX_new(kdf);
    EVP_KDF_free(kdf);
    if (!ctx) return -1;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm, ikm_len),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len),
        OSSL_PARAM_construct_end(),
    };
    int rc = EVP_KDF_derive(ctx, out, outlen, params) == 1 ? 0 : -1;
    EVP_KDF_CTX_free(ctx);
    return rc;
}

int hvd_ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
    return CRYPTO_memcmp(a, b, n) == 0;
}

int hvd_seal_init(hvd_seal *s, const uint8_t key[HVD_KEY_LEN], int encrypt) {
    memset(s, 0, sizeof *s);
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx) return -1;
    int ok = encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                     : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL);
    if (!ok) {
        EVP_CIPHER_CTX_free(ctx);
        return -1;
    }
    s->ctx = ctx;
    s->encrypt = encrypt;
    return 0;
}

void hvd_seal_free(hvd_seal *s) {
    EVP_CIPHER_CTX_free(s->ctx);
    memset(s, 0, sizeof *s);
}

static void make_nonce(uint64_t counter, uint8_t iv[12]) {
    memset(iv, 0, 4);
    for (int i = 0; i < 8; i++)
        iv[4 + i] = (uint8_t)(counter >> (56 - 8 * i));
}

int hvd_seal_frame(hvd_seal *s, const uint8_t *aad, size_t aad_len, const uint8_t *in, size_t len,
                   uint8_t *out) {
    EVP_CIPHER_CTX *ctx = s->ctx;
    uint8_t iv[12];
    int n = 0;
    if (!ctx || !s->encrypt || s->counter == UINT64_MAX || len > INT32_MAX) return -1;
    make_nonce(s->counter, iv);
    if (!EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv)) return -1;
    if (aad_len && !EVP_EncryptUpdate(ctx, NULL, &n, aad, (int)aad_len)) return -1;
    if (len && !EVP_EncryptUpdate(ctx, out, &n, in, (int)len)) return -1;
    if (!EVP_EncryptFinal_ex(ctx, out + len, &n)) return -1;
    if (!EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, HVD_TAG_LEN, out + len)) return -1;
    s->counter++;
    return 0;
}

int hvd_open_frame(hvd_seal *s, const uint8_t *aad, size_t aad_len, uint8_t *buf, size_t len) {
    EVP_CIPHER_CTX *ctx = s->ctx;
    uint8_t iv[12];
    int n = 0;
    if (!ctx || s->encrypt || len < HVD_TAG_LEN || len > INT32_MAX || s->counter == UINT64_MAX)
        return -1;
    size_t clen = len - HVD_TAG_LEN;
    make_nonce(s->counter, iv);
    if (!EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, iv)) return -1;
    if (aad_len && !EVP_DecryptUpdate(ctx, NULL, &n, aad, (int)aad_len)) return -1;
    if (clen && !EVP_DecryptUpdate(ctx, buf, &n, buf, (int)clen)) return -1;
    if (!EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, HVD_TAG_LEN, buf + clen)) return -1;
    if (EVP_DecryptFinal_ex(ctx, buf + clen, &n) != 1) return -1;
    s->counter++;
    return 0;
}
