/* The table-driven message codec (include/hvd/message.h). */
#include "hvd/message.h"

#include <stdlib.h>
#include <string.h>

#define FIELD_PTR(msg, f) ((char *)(msg) + (f)->offset)

static int pack_str(msgpack_packer *pk, const char *s) {
    if (!s) return msgpack_pack_nil(pk);
    size_t n = strlen(s);
    if (n > UINT32_MAX) return -1;
    return msgpack_pack_str_with_body(pk, s, n);
}

int hvd_msg_pack(msgpack_packer *pk, const hvd_msg_desc *desc, const void *msg) {
    if (msgpack_pack_array(pk, desc->nfields) != 0) return -1;
    for (size_t i = 0; i < desc->nfields; i++) {
        const hvd_field *f = &desc->fields[i];
        const char *p = (const char *)msg + f->offset;
        int rc = 0;
        switch (f->kind) {
        case HVD_F_U16:
            rc = msgpack_pack_uint16(pk, *(const uint16_t *)p);
            break;
        case HVD_F_CHARS: {
            size_t n = strnlen(p, f->cap);
            if (n == f->cap) return -1; /* not terminated: the decoder would refuse it */
            rc = msgpack_pack_str_with_body(pk, p, n);
            break;
        }
        case HVD_F_U32V: {
            const hvd_u32v *uv = (const hvd_u32v *)p;
            if (uv->n > UINT32_MAX) return -1;
            rc = msgpack_pack_array(pk, uv->n);
            for (size_t j = 0; rc == 0 && j < uv->n; j++)
                rc = msgpack_pack_uint32(pk, uv->v[j]);
            break;
        }
        case HVD_F_U32:
            rc = msgpack_pack_uint32(pk, *(const uint32_t *)p);
            break;
        case HVD_F_U64:
            rc = msgpack_pack_uint64(pk, *(const uint64_t *)p);
            break;
        case HVD_F_I32:
            rc = msgpack_pack_int32(pk, *(const int32_t *)p);
            break;
        case HVD_F_I64:
            rc = msgpack_pack_int64(pk, *(const int64_t *)p);
            break;
        case HVD_F_BOOL:
            rc = *(const bool *)p ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
            break;
        case HVD_F_F64:
            rc = msgpack_pack_double(pk, *(const double *)p);
            break;
        case HVD_F_STR:
            rc = pack_str(pk, *(char *const *)p);
            break;
        case HVD_F_BIN: {
            const hvd_bytes *b = (const hvd_bytes *)p;
            if (b->len > UINT32_MAX) return -1;
            rc = msgpack_pack_bin_with_body(pk, b->data, b->len);
            break;
        }
        case HVD_F_STRV: {
            const hvd_strv *sv = (const hvd_strv *)p;
            if (sv->n > UINT32_MAX) return -1;
            rc = msgpack_pack_array(pk, sv->n);
            for (size_t j = 0; rc == 0 && j < sv->n; j++)
                rc = sv->v[j] ? pack_str(pk, sv->v[j]) : -1; /* lists hold no nil */
            break;
        }
        case HVD_F_LIST: {
            const hvd_list *l = (const hvd_list *)p;
            if (l->n > UINT32_MAX) return -1;
            rc = msgpack_pack_array(pk, l->n);
            for (size_t j = 0; rc == 0 && j < l->n; j++)
                rc = hvd_msg_pack(pk, f->elem, (const char *)l->v + j * f->elem->size);
            break;
        }
        }
        if (rc != 0) return -1;
    }
    return 0;
}

static const char *type_name(msgpack_object_type t) {
    switch (t) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return "unsigned integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "string";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_BIN:
        return "binary";
    case MSGPACK_OBJECT_EXT:
        return "extension";
    }
    return "unknown";
}

/* Reads an unsigned integer up to max, or a signed one within [min, max] (the two msgpack
 * integer kinds are handled separately). */
static int get_uint(const msgpack_object *o, uint64_t max, uint64_t *out) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) return -1;
    *out = o->via.u64;
    return 0;
}

static int get_int(const msgpack_object *o, int64_t min, int64_t max, int64_t *out) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)max) return -1;
        *out = (int64_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (o->via.i64 < min) return -1;
        *out = o->via.i64;
        return 0;
    }
    return -1;
}

static char *dup_str(const msgpack_object *o) {
    uint32_t n = o->via.str.size;
    if (n && memchr(o->via.str.ptr, '\0', n)) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    return s;
}

static int bad(hvd_err *err, const hvd_msg_desc *d, const hvd_field *f, const char *what,
               const msgpack_object *o) {
    return hvd_err_set(err, HVD_E_PROTOCOL, "message %s: field %s: %s (got %s)", d->name, f->name,
                       what, type_name(o->type));
}

static int unpack_field(const msgpack_object *o, const hvd_msg_desc *d, const hvd_field *f, char *p,
                        hvd_err *err) {
    uint64_t u;
    int64_t i;
    switch (f->kind) {
    case HVD_F_U16:
        if (get_uint(o, UINT16_MAX, &u) != 0)
            return bad(err, d, f, "expected a 16-bit unsigned", o);
        *(uint16_t *)p = (uint16_t)u;
        return 0;
    case HVD_F_CHARS:
        if (o->type != MSGPACK_OBJECT_STR) return bad(err, d, f, "expected a string", o);
        if (o->via.str.size >= f->cap) return bad(err, d, f, "string is too long", o);
        if (o->via.str.size && memchr(o->via.str.ptr, '\0', o->via.str.size))
            return bad(err, d, f, "string contains a NUL byte", o);
        if (o->via.str.size) memcpy(p, o->via.str.ptr, o->via.str.size);
        p[o->via.str.size] = '\0';
        return 0;
    case HVD_F_U32V: {
        hvd_u32v *uv = (hvd_u32v *)p;
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return bad(err, d, f, "expected a list of integers", o);
        uint32_t n = o->via.array.size;
        uv->v = calloc(n ? n : 1, sizeof(uint32_t));
        if (!uv->v) return bad(err, d, f, "out of memory", o);
        for (uint32_t j = 0; j < n; j++) {
            if (get_uint(&o->via.array.ptr[j], UINT32_MAX, &u) != 0)
                return bad(err, d, f, "list element is not a 32-bit unsigned",
                           &o->via.array.ptr[j]);
            uv->v[j] = (uint32_t)u;
        }
        uv->n = n;
        return 0;
    }
    case HVD_F_U32:
        if (get_uint(o, UINT32_MAX, &u) != 0)
            return bad(err, d, f, "expected a 32-bit unsigned", o);
        *(uint32_t *)p = (uint32_t)u;
        return 0;
    case HVD_F_U64:
        if (get_uint(o, UINT64_MAX, &u) != 0) return bad(err, d, f, "expected an unsigned", o);
        *(uint64_t *)p = u;
        return 0;
    case HVD_F_I32:
        if (get_int(o, INT32_MIN, INT32_MAX, &i) != 0)
            return bad(err, d, f, "expected a 32-bit integer", o);
        *(int32_t *)p = (int32_t)i;
        return 0;
    case HVD_F_I64:
        if (get_int(o, INT64_MIN, INT64_MAX, &i) != 0)
            return bad(err, d, f, "expected a 64-bit integer", o);
        *(int64_t *)p = i;
        return 0;
    case HVD_F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN) return bad(err, d, f, "expected a boolean", o);
        *(bool *)p = o->via.boolean;
        return 0;
    case HVD_F_F64:
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
            *(double *)p = o->via.f64;
        else if (get_int(o, INT64_MIN, INT64_MAX, &i) == 0)
            *(double *)p = (double)i;
        else
            return bad(err, d, f, "expected a number", o);
        return 0;
    case HVD_F_STR:
        if (o->type == MSGPACK_OBJECT_NIL) {
            *(char **)p = NULL;
            return 0;
        }
        if (o->type != MSGPACK_OBJECT_STR) return bad(err, d, f, "expected a string", o);
        if (!(*(char **)p = dup_str(o)))
            return bad(err, d, f, "string contains a NUL byte or memory ran out", o);
        return 0;
    case HVD_F_BIN: {
        hvd_bytes *b = (hvd_bytes *)p;
        if (o->type != MSGPACK_OBJECT_BIN && o->type != MSGPACK_OBJECT_STR)
            return bad(err, d, f, "expected bytes", o);
        uint32_t n = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.size : o->via.str.size;
        const void *src = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.ptr : o->via.str.ptr;
        b->data = malloc(n ? n : 1);
        if (!b->data) return bad(err, d, f, "out of memory", o);
        if (n) memcpy(b->data, src, n);
        b->len = n;
        return 0;
    }
    case HVD_F_STRV: {
        hvd_strv *sv = (hvd_strv *)p;
        if (o->type != MSGPACK_OBJECT_ARRAY) return bad(err, d, f, "expected a list of strings", o);
        uint32_t n = o->via.array.size;
        for (uint32_t j = 0; j < n; j++)
            if (o->via.array.ptr[j].type != MSGPACK_OBJECT_STR)
                return bad(err, d, f, "list element is not a string", &o->via.array.ptr[j]);
        sv->v = calloc((size_t)n + 1, sizeof(char *));
        if (!sv->v) return bad(err, d, f, "out of memory", o);
        for (uint32_t j = 0; j < n; j++) {
            const msgpack_object *e = &o->via.array.ptr[j];
            if (e->type != MSGPACK_OBJECT_STR || !(sv->v[j] = dup_str(e))) {
                sv->n = j;
                return bad(err, d, f, "list element is not a valid string", e);
            }
        }
        sv->n = n;
        return 0;
    }
    case HVD_F_LIST: {
        hvd_list *l = (hvd_list *)p;
        if (o->type != MSGPACK_OBJECT_ARRAY) return bad(err, d, f, "expected a list", o);
        uint32_t n = o->via.array.size;
        /* Every element must be a struct (an array) before room for n structs is taken. */
        for (uint32_t j = 0; j < n; j++)
            if (o->via.array.ptr[j].type != MSGPACK_OBJECT_ARRAY)
                return bad(err, d, f, "list element is not a message", &o->via.array.ptr[j]);
        l->v = calloc(n ? n : 1, f->elem->size ? f->elem->size : 1);
        if (!l->v) return bad(err, d, f, "out of memory", o);
        for (uint32_t j = 0; j < n; j++) {
            if (hvd_msg_unpack(&o->via.array.ptr[j], f->elem, (char *)l->v + j * f->elem->size,
                               err) != 0) {
                l->n = j;
                hvd_err_prefix(err, "message %s: field %s[%u]: ", d->name, f->name, j);
                return -1;
            }
        }
        l->n = n;
        return 0;
    }
    }
    return bad(err, d, f, "unknown field kind", o);
}

int hvd_msg_unpack(const msgpack_object *obj, const hvd_msg_desc *desc, void *msg, hvd_err *err) {
    if (desc->size) memset(msg, 0, desc->size);
    if (obj->type != MSGPACK_OBJECT_ARRAY)
        return hvd_err_set(err, HVD_E_PROTOCOL, "message %s: body is a %s, expected an array",
                           desc->name, type_name(obj->type));
    if (obj->via.array.size < desc->nfields)
        return hvd_err_set(err, HVD_E_PROTOCOL, "message %s: body has %u fields, expected %zu",
                           desc->name, obj->via.array.size, desc->nfields);
    for (size_t i = 0; i < desc->nfields; i++) {
        const hvd_field *f = &desc->fields[i];
        if (unpack_field(&obj->via.array.ptr[i], desc, f, FIELD_PTR(msg, f), err) != 0) {
            hvd_msg_free(desc, msg);
            return -1;
        }
    }
    return 0;
}

void hvd_msg_free(const hvd_msg_desc *desc, void *msg) {
    if (!msg) return;
    for (size_t i = 0; i < desc->nfields; i++) {
        const hvd_field *f = &desc->fields[i];
        char *p = FIELD_PTR(msg, f);
        switch (f->kind) {
        case HVD_F_STR:
            free(*(char **)p);
            break;
        case HVD_F_BIN:
            free(((hvd_bytes *)p)->data);
            break;
        case HVD_F_U32V:
            free(((hvd_u32v *)p)->v);
            break;
        case HVD_F_STRV: {
            hvd_strv *sv = (hvd_strv *)p;
            for (size_t j = 0; sv->v && j < sv->n; j++)
                free(sv->v[j]);
            free(sv->v);
            break;
        }
        case HVD_F_LIST: {
            hvd_list *l = (hvd_list *)p;
            for (size_t j = 0; l->v && j < l->n; j++)
                hvd_msg_free(f->elem, (char *)l->v + j * f->elem->size);
            free(l->v);
            break;
        }
        default:
            break;
        }
    }
    if (desc->size) memset(msg, 0, desc->size);
}
