/* The one message codec: typed messages described by tables, encoded as msgpack.
 *
 * A message is a C struct plus an hvd_msg_desc that lists its fields in wire order. The body
 * of a message on the wire is a msgpack array with one element per field, in that order
 * (docs/protocol.md, "Message bodies"). Decoding checks every element's type, copies strings
 * and bytes into malloc'd memory owned by the struct, and accepts trailing elements it does
 * not know (a newer peer may append fields). hvd_msg_free releases what decoding allocated.
 *
 * Example:
 *   typedef struct { uint64_t index; char *host_hash; } reg_req;
 *   static const hvd_field reg_req_fields[] = {
 *       HVD_FIELD(reg_req, index, HVD_F_U64),
 *       HVD_FIELD(reg_req, host_hash, HVD_F_STR),
 *   };
 *   const hvd_msg_desc reg_req_desc = HVD_MSG(100, "register_task", reg_req, reg_req_fields);
 */
#ifndef HVD_MESSAGE_H
#define HVD_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "hvd/error.h"

/* Field kinds and the C type each one maps to. */
typedef enum hvd_field_kind {
    HVD_F_U32,   /* uint32_t */
    HVD_F_U64,   /* uint64_t */
    HVD_F_I32,   /* int32_t */
    HVD_F_I64,   /* int64_t */
    HVD_F_BOOL,  /* bool */
    HVD_F_F64,   /* double */
    HVD_F_STR,   /* char *: UTF-8 text without NUL bytes; NULL is sent as nil */
    HVD_F_BIN,   /* hvd_bytes: arbitrary bytes */
    HVD_F_STRV,  /* hvd_strv: list of strings */
    HVD_F_LIST,  /* hvd_list: list of structs described by `elem` */
    HVD_F_U16,   /* uint16_t */
    HVD_F_CHARS, /* char[cap]: a string in a fixed array; longer input is refused */
    HVD_F_U32V,  /* hvd_u32v: list of uint32_t */
} hvd_field_kind;

typedef struct hvd_bytes {
    uint8_t *data;
    size_t len;
} hvd_bytes;

typedef struct hvd_strv {
    char **v; /* v[n] is NULL after decoding */
    size_t n;
} hvd_strv;

typedef struct hvd_u32v {
    uint32_t *v;
    size_t n;
} hvd_u32v;

typedef struct hvd_list {
    void *v; /* array of n structs of elem->size bytes */
    size_t n;
} hvd_list;

struct hvd_msg_desc;

typedef struct hvd_field {
    const char *name; /* for error messages and docs */
    hvd_field_kind kind;
    size_t offset;                   /* offsetof(struct, member) */
    const struct hvd_msg_desc *elem; /* HVD_F_LIST only */
    size_t cap;                      /* HVD_F_CHARS only: the array's size */
} hvd_field;

typedef struct hvd_msg_desc {
    uint32_t type;    /* wire type number, unique per protocol */
    const char *name; /* "register_task" */
    size_t size;      /* sizeof(struct) */
    const hvd_field *fields;
    size_t nfields;
} hvd_msg_desc;

#define HVD_FIELD(T, member, kind)                                                                 \
    { #member, kind, offsetof(T, member), NULL, 0 }
#define HVD_FIELD_LIST(T, member, elem_desc)                                                       \
    { #member, HVD_F_LIST, offsetof(T, member), &(elem_desc), 0 }
#define HVD_FIELD_CHARS(T, member)                                                                 \
    { #member, HVD_F_CHARS, offsetof(T, member), NULL, sizeof(((T *)0)->member) }
#define HVD_MSG(type, name, T, fields)                                                             \
    { (type), (name), sizeof(T), (fields), sizeof(fields) / sizeof((fields)[0]) }
/* A message with no fields. */
#define HVD_MSG_EMPTY(type, name)                                                                  \
    { (type), (name), 0, NULL, 0 }

/* Appends the msgpack encoding of msg (a struct described by desc) to pk. Returns 0, or -1 if
 * a field cannot be encoded (a string over 4 GiB). */
int hvd_msg_pack(msgpack_packer *pk, const hvd_msg_desc *desc, const void *msg);

/* Decodes obj into msg (zeroed first). Returns 0, or -1 with err (code HVD_E_PROTOCOL) naming
 * the message, the field and what was wrong. On failure msg holds nothing to free. */
int hvd_msg_unpack(const msgpack_object *obj, const hvd_msg_desc *desc, void *msg, hvd_err *err);

/* Frees what hvd_msg_unpack allocated inside msg (not msg itself) and zeroes it. */
void hvd_msg_free(const hvd_msg_desc *desc, void *msg);

/* Checks that buf[0..len) is exactly one well-formed msgpack object whose containers do not
 * claim more elements than bytes remain, do not nest deeper than 16, and hold at most
 * HVD_MSGPACK_MAX_OBJECTS objects in all (msgpack-c spends about 24 bytes per object). msgpack-c
 * allocates a container's element array from the count in its header before reading the elements,
 * so this runs before msgpack_unpack on untrusted bytes. Returns 0, or -1 with err. */
/* Most objects one message may hold: bounds msgpack-c's memory per frame to about 24 MiB. */
#define HVD_MSGPACK_MAX_OBJECTS (1u << 20)

int hvd_msgpack_check(const uint8_t *buf, size_t len, hvd_err *err);

#endif
