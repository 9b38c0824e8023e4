/* The connection handshake (docs/protocol.md, "Handshake"):
 *
 *   client -> server  HELLO     "HVDB" | version | 0 | 0 0 | Nc[32]              (40 bytes)
 *   server -> client  CHALLENGE "HVDB" | version | status | 0 0 | Ns[32] | Ps[32] (72 bytes)
 *   client -> server  PROOF     Pc[32]                                            (32 bytes)
 *   server -> client  first sealed frame, empty payload (confirms the client's proof)
 *
 *   Ps = HMAC-SHA256(K, "hvd-bridge/1 server" | 0x00 | len16(name) | name | Nc | Ns)
 *   Pc = HMAC-SHA256(K, "hvd-bridge/1 client" | 0x00 | len16(name) | name | Nc | Ns)
 *   c2s key | s2c key = HKDF-SHA256(ikm = K, salt = Nc | Ns, info = "hvd-bridge/1 keys" | 0x00 |
 * name)
 *
 * where K is the job secret and name the server's service name. */
#ifndef HVD_RPC_HANDSHAKE_H
#define HVD_RPC_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"
#include "hvd/error.h"
#include "hvd/net.h"

#define HVD_NONCE_LEN     32
#define HVD_HELLO_LEN     40
#define HVD_CHALLENGE_LEN 72
#define HVD_PROOF_LEN     32

/* CHALLENGE status byte. */
#define HVD_HS_OK          0
#define HVD_HS_BAD_VERSION 1

/* Fills a fresh random nonce. Returns 0, or -1. */
int hvd_hs_nonce(uint8_t nonce[HVD_NONCE_LEN]);

void hvd_hs_hello(const uint8_t nc[HVD_NONCE_LEN], uint8_t out[HVD_HELLO_LEN]);

/* Parses HELLO. Returns 0 with the client nonce, or -1 with err (bad magic: not our protocol;
 * another version: *bad_version set to 1). */
int hvd_hs_parse_hello(const uint8_t in[HVD_HELLO_LEN], uint8_t nc[HVD_NONCE_LEN], int *bad_version,
                       hvd_err *err);

/* Proof for one side (server = 1, client = 0). Returns 0, or -1. */
int hvd_hs_proof(const hvd_secret *k, const char *name, int server, const uint8_t nc[HVD_NONCE_LEN],
                 const uint8_t ns[HVD_NONCE_LEN], uint8_t out[HVD_MAC_LEN]);

/* Builds CHALLENGE (status, Ns, Ps). */
void hvd_hs_challenge(uint8_t status, const uint8_t ns[HVD_NONCE_LEN],
                      const uint8_t ps[HVD_MAC_LEN], uint8_t out[HVD_CHALLENGE_LEN]);

/* Derives the two direction keys. Returns 0, or -1. */
int hvd_hs_keys(const hvd_secret *k, const char *name, const uint8_t nc[HVD_NONCE_LEN],
                const uint8_t ns[HVD_NONCE_LEN], uint8_t c2s[HVD_KEY_LEN],
                uint8_t s2c[HVD_KEY_LEN]);

#endif
