#include "envelope.h"

#include <string.h>

#include "hvd/rpc.h"

const hvd_msg_desc hvd_ping_desc = HVD_MSG_EMPTY(HVD_MSG_PING, "ping");
const hvd_msg_desc hvd_ack_desc = HVD_MSG_EMPTY(HVD_MSG_ACK, "ack");

static const hvd_field pong_fields[] = {
    HVD_FIELD(hvd_pong, service, HVD_F_STR),
    HVD_FIELD(hvd_pong, peer_host, HVD_F_STR),
    HVD_FIELD(hvd_pong, version, HVD_F_U32),
};
const hvd_msg_desc hvd_pong_desc = HVD_MSG(HVD_MSG_PONG, "pong", hvd_pong, pong_fields);

static const hvd_field error_fields[] = {
    HVD_FIELD(hvd_error_body, code, HVD_F_U32),
    HVD_FIELD(hvd_error_body, message, HVD_F_STR),
};
const hvd_msg_desc hvd_error_desc = HVD_MSG(HVD_MSG_ERROR, "error", hvd_error_body, error_fields);

static const hvd_field chunk_fields[] = {
    HVD_FIELD(hvd_chunk, channel, HVD_F_U32),
    HVD_FIELD(hvd_chunk, data, HVD_F_BIN),
};
const hvd_msg_desc hvd_chunk_desc = HVD_MSG(0, "stream chunk", hvd_chunk, chunk_fields);

int hvd_envelope_pack(msgpack_sbuffer *sb, uint32_t kind, uint32_t type, uint64_t id,
                      const hvd_msg_desc *desc, const void *msg) {
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    if (msgpack_pack_array(&pk, 5) || msgpack_pack_uint8(&pk, HVD_PROTOCOL_VERSION) ||
        msgpack_pack_uint32(&pk, kind) || msgpack_pack_uint32(&pk, type) ||
        msgpack_pack_uint64(&pk, id))
        return -1;
    return hvd_msg_pack(&pk, desc, msg);
}

int hvd_envelope_unpack(const uint8_t *buf, size_t len, hvd_envelope *env, hvd_err *err) {
    memset(env, 0, sizeof *env);
    if (hvd_msgpack_check(buf, len, err) != 0) return -1;
    msgpack_unpacked_init(&env->unpacked);
    size_t off = 0;
    if (msgpack_unpack_next(&env->unpacked, (const char *)buf, len, &off) !=
        MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&env->unpacked);
        return hvd_err_set(err, HVD_E_PROTOCOL, "message is not valid msgpack");
    }
    const msgpack_object *o = &env->unpacked.data;
    const char *why = NULL;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 5) {
        why = "envelope is not an array of 5 elements";
    } else {
        const msgpack_object *a = o->via.array.ptr;
        if (a[3].type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            env->id = a[3].via.u64;
            env->has_id = 1;
        }
        if (a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[0].via.u64 != HVD_PROTOCOL_VERSION)
            why = "envelope has an unsupported version";
        else if (a[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[1].via.u64 > HVD_KIND_STREAM)
            why = "envelope has an invalid kind";
        else if (a[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[2].via.u64 > UINT32_MAX)
            why = "envelope has an invalid type";
        else if (!env->has_id)
            why = "envelope has an invalid request id";
        else {
            env->kind = (uint32_t)a[1].via.u64;
            env->type = (uint32_t)a[2].via.u64;
            env->body = &a[4];
        }
    }
    if (why) {
        int has_id = env->has_id;
        uint64_t id = env->id;
        msgpack_unpacked_destroy(&env->unpacked);
        memset(env, 0, sizeof *env);
        env->has_id = has_id;
        env->id = id;
        return hvd_err_set(err, HVD_E_PROTOCOL, "%s", why);
    }
    return 0;
}

void hvd_envelope_free(hvd_envelope *env) {
    msgpack_unpacked_destroy(&env->unpacked);
    memset(env, 0, sizeof *env);
}
