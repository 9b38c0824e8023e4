/* The message envelope: the plaintext of every frame after the handshake is one msgpack array
 *   [version, kind, type, id, body]
 * version: HVD_PROTOCOL_VERSION; kind: request, reply or stream chunk; type: the message type
 * (for a reply, the reply's own type, HVD_MSG_ERROR for errors); id: the request id chosen by
 * the client (replies and chunks carry the id of their request); body: the message fields
 * (docs/protocol.md, "Envelope"). */
#ifndef HVD_RPC_ENVELOPE_H
#define HVD_RPC_ENVELOPE_H

#include <stdint.h>

#include <msgpack.h>

#include "hvd/error.h"
#include "hvd/message.h"

enum { HVD_KIND_REQUEST = 0, HVD_KIND_REPLY = 1, HVD_KIND_STREAM = 2 };

/* A stream chunk's body: [channel, data]. */
typedef struct hvd_chunk {
    uint32_t channel;
    hvd_bytes data;
} hvd_chunk;
extern const hvd_msg_desc hvd_chunk_desc;

typedef struct hvd_envelope {
    uint32_t kind;
    uint32_t type;
    uint64_t id;
    int has_id;                 /* id was readable even if something else was wrong */
    const msgpack_object *body; /* points into the unpacked object */
    msgpack_unpacked unpacked;  /* owns the decoded objects */
} hvd_envelope;

/* Encodes an envelope around msg (described by desc) into sb (cleared first). Returns 0, or
 * -1 if encoding fails. */
int hvd_envelope_pack(msgpack_sbuffer *sb, uint32_t kind, uint32_t type, uint64_t id,
                      const hvd_msg_desc *desc, const void *msg);

/* Decodes a frame payload. On success returns 0 and env must be released with
 * hvd_envelope_free. On failure returns -1 with err (HVD_E_PROTOCOL); env->has_id tells
 * whether env->id names the request so an error reply can be sent; nothing to free. */
int hvd_envelope_unpack(const uint8_t *buf, size_t len, hvd_envelope *env, hvd_err *err);

void hvd_envelope_free(hvd_envelope *env);

#endif
