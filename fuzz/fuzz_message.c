/* libFuzzer target for the message decoder: arbitrary bytes through the msgpack pre-check,
 * msgpack-c, and hvd_msg_unpack against every message description the RPC layer defines
 * and the driver and task services (include/hvd/proto.h), plus one that uses every field
 * kind (nested lists included). Whatever decodes must encode
 * and decode again to the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct inner {
    uint32_t a;
    char *s;
    hvd_strv v;
} inner;
static const hvd_field inner_fields[] = {HVD_FIELD(inner, a, HVD_F_U32),
                                         HVD_FIELD(inner, s, HVD_F_STR),
                                         HVD_FIELD(inner, v, HVD_F_STRV)};
static const hvd_msg_desc inner_desc = HVD_MSG(0, "inner", inner, inner_fields);

typedef struct all {
    uint64_t u64;
    int32_t i32;
    int64_t i64;
    bool b;
    double f;
    hvd_bytes bin;
    hvd_list list;
} all;
static const hvd_field all_fields[] = {
    HVD_FIELD(all, u64, HVD_F_U64),        HVD_FIELD(all, i32, HVD_F_I32),
    HVD_FIELD(all, i64, HVD_F_I64),        HVD_FIELD(all, b, HVD_F_BOOL),
    HVD_FIELD(all, f, HVD_F_F64),          HVD_FIELD(all, bin, HVD_F_BIN),
    HVD_FIELD_LIST(all, list, inner_desc),
};
static const hvd_msg_desc all_desc = HVD_MSG(0, "all", all, all_fields);

static void roundtrip(const hvd_msg_desc *d, const void *msg) {
    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &a, msgpack_sbuffer_write);
    if (hvd_msg_pack(&pk, d, msg) != 0) abort();
    hvd_err err;
    if (hvd_msgpack_check((const uint8_t *)a.data, a.size, &err) != 0) abort();
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, a.data, a.size, &off) != MSGPACK_UNPACK_SUCCESS) abort();
    void *again = calloc(1, d->size ? d->size : 1);
    if (hvd_msg_unpack(&u.data, d, again, &err) != 0) abort();
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    if (hvd_msg_pack(&pk, d, again) != 0) abort();
    if (a.size != b.size || memcmp(a.data, b.data, a.size) != 0) abort();
    hvd_msg_free(d, again);
    free(again);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hvd_err err;
    if (hvd_msgpack_check(data, size, &err) != 0) return 0;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, (const char *)data, size, &off) != MSGPACK_UNPACK_SUCCESS)
        abort(); /* the pre-check accepted it, so msgpack-c must too */
    const hvd_msg_desc *descs[] = {&hvd_pong_desc, &hvd_error_desc, &hvd_chunk_desc, &all_desc};
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++) {
        void *msg = calloc(1, descs[i]->size ? descs[i]->size : 1);
        if (hvd_msg_unpack(&u.data, descs[i], msg, &err) == 0) {
            roundtrip(descs[i], msg);
            hvd_msg_free(descs[i], msg);
        }
        free(msg);
    }
    for (size_t i = 0; i < hvd_proto_count; i++) {
        const hvd_msg_desc *d = hvd_proto_all[i];
        void *msg = calloc(1, d->size ? d->size : 1);
        if (hvd_msg_unpack(&u.data, d, msg, &err) == 0) {
            roundtrip(d, msg);
            hvd_msg_free(d, msg);
        }
        free(msg);
    }
    msgpack_unpacked_destroy(&u);
    hvd_envelope env;
    if (hvd_envelope_unpack(data, size, &env, &err) == 0) hvd_envelope_free(&env);
    return 0;
}
