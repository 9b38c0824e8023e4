/* Exceptions, conversions between Java arrays and C strings and the stderr log sink shared by
 * the JNI glue; JNI_OnLoad. */
#include "jni_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"
#include "common/strv.h"
#include "org_hvdbridge_NativeLibrary.h"

jni_cache jni_classes;

static jclass global_class(JNIEnv *env, const char *name) {
    jclass local = (*env)->FindClass(env, name);
    if (!local) return NULL;
    jclass global = (*env)->NewGlobalRef(env, local);
    (*env)->DeleteLocalRef(env, local);
    return global;
}

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
    (void)reserved;
    JNIEnv *env;
    if ((*vm)->GetEnv(vm, (void **)&env, JNI_VERSION_1_8) != JNI_OK) return JNI_ERR;
    jni_cache *c = &jni_classes;
    /* FindClass here uses the class loader of the class that loaded this library, so the
     * org.hvdbridge classes are the ones of the same jar. */
    if (!(c->hvd_exception = global_class(env, "org/hvdbridge/HvdException")) ||
        !(c->rank_result = global_class(env, "org/hvdbridge/RankResult")) ||
        !(c->illegal_state = global_class(env, "java/lang/IllegalStateException")) ||
        !(c->illegal_argument = global_class(env, "java/lang/IllegalArgumentException")) ||
        !(c->null_pointer = global_class(env, "java/lang/NullPointerException")) ||
        !(c->out_of_memory = global_class(env, "java/lang/OutOfMemoryError")) ||
        !(c->byte_array = global_class(env, "[B")))
        return JNI_ERR;
    c->hvd_exception_ctor = (*env)->GetMethodID(env, c->hvd_exception, "<init>", "([BI)V");
    c->rank_result_ctor = (*env)->GetMethodID(env, c->rank_result, "<init>", "(II[BZI[B[BZ)V");
    if (!c->hvd_exception_ctor || !c->rank_result_ctor) return JNI_ERR;
    return JNI_VERSION_1_8;
}

JNIEXPORT jint JNICALL Java_org_hvdbridge_NativeLibrary_nativeAbi(JNIEnv *env, jclass cls) {
    (void)env;
    (void)cls;
    return HVD_JNI_ABI;
}

static void throw_hvd_text(JNIEnv *env, int code, const char *msg) {
    jbyteArray m = jni_new_bytes(env, msg, strlen(msg));
    if (!m) return;
    jobject ex = (*env)->NewObject(env, jni_classes.hvd_exception, jni_classes.hvd_exception_ctor,
                                   m, (jint)code);
    (*env)->DeleteLocalRef(env, m);
    if (ex) {
        (*env)->Throw(env, (jthrowable)ex);
        (*env)->DeleteLocalRef(env, ex);
    }
}

void jni_throw_err(JNIEnv *env, const hvd_err *err) {
    if ((*env)->ExceptionCheck(env)) return;
    throw_hvd_text(env, err->code ? err->code : HVD_E_INTERNAL,
                   err->msg[0] ? err->msg : "unknown error in the native library");
}

/* Throws cls (one of jni_classes) with the formatted message, or HvdException with code when
 * cls is NULL. Keeps an exception already pending. */
static void throw_v(JNIEnv *env, jclass cls, int code, const char *fmt, va_list ap) {
    if ((*env)->ExceptionCheck(env)) return;
    char msg[HVD_ERR_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (!cls)
        throw_hvd_text(env, code, msg);
    else /* The messages are ASCII sentences of the glue's callers: valid modified UTF-8. */
        (*env)->ThrowNew(env, cls, msg);
}

void jni_throw_hvd(JNIEnv *env, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    throw_v(env, NULL, code, fmt, ap);
    va_end(ap);
}

void jni_throw(JNIEnv *env, jclass cls, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    throw_v(env, cls, 0, fmt, ap);
    va_end(ap);
}

void jni_throw_oom(JNIEnv *env, const char *what) {
    jni_throw(env, jni_classes.out_of_memory, "out of native memory for %s", what);
}

void *jni_handle(JNIEnv *env, jlong h, const char *what) {
    if (h == 0) {
        jni_throw(env, jni_classes.illegal_state, "%s is closed", what);
        return NULL;
    }
    return (void *)(intptr_t)h;
}

int jni_bytes(JNIEnv *env, jbyteArray a, const char *what, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!a) {
        jni_throw(env, jni_classes.null_pointer, "%s is null", what);
        return -1;
    }
    jsize n = (*env)->GetArrayLength(env, a);
    uint8_t *p = malloc((size_t)n + 1);
    if (!p) {
        jni_throw_oom(env, what);
        return -1;
    }
    (*env)->GetByteArrayRegion(env, a, 0, n, (jbyte *)p);
    if ((*env)->ExceptionCheck(env)) {
        free(p);
        return -1;
    }
    p[n] = 0;
    *out = p;
    *len = (size_t)n;
    return 0;
}

int jni_text(JNIEnv *env, jbyteArray a, bool may_be_null, const char *what, char **out) {
    *out = NULL;
    if (!a && may_be_null) return 0;
    uint8_t *p;
    size_t n;
    if (jni_bytes(env, a, what, &p, &n) != 0) return -1;
    if (memchr(p, 0, n)) {
        free(p);
        jni_throw(env, jni_classes.illegal_argument, "%s contains a NUL character", what);
        return -1;
    }
    *out = (char *)p;
    return 0;
}

int jni_textv(JNIEnv *env, jobjectArray a, bool may_be_null, const char *what, char ***out,
              size_t *n) {
    *out = NULL;
    *n = 0;
    if (!a) {
        if (may_be_null) return 0;
        jni_throw(env, jni_classes.null_pointer, "%s is null", what);
        return -1;
    }
    jsize len = (*env)->GetArrayLength(env, a);
    char **v = calloc((size_t)len + 1, sizeof *v);
    if (!v) {
        jni_throw_oom(env, what);
        return -1;
    }
    for (jsize i = 0; i < len; i++) {
        jobject e = (*env)->GetObjectArrayElement(env, a, i);
        if ((*env)->ExceptionCheck(env)) goto fail;
        /* The array's static type is byte[][], but a raw Object[] could reach us. */
        if (e && !(*env)->IsInstanceOf(env, e, jni_classes.byte_array)) {
            (*env)->DeleteLocalRef(env, e);
            jni_throw(env, jni_classes.illegal_argument, "%s[%d] is not a byte array", what,
                      (int)i);
            goto fail;
        }
        int rc = jni_text(env, (jbyteArray)e, false, what, &v[i]);
        if (e) (*env)->DeleteLocalRef(env, e);
        if (rc != 0) goto fail;
    }
    *out = v;
    *n = (size_t)len;
    return 0;
fail:
    hvd_strv_free(v);
    return -1;
}

/* Frees *v and empties it, and returns -1: the failure path of the jni_textv variants. */
static int drop_textv(char ***v, size_t *n) {
    hvd_strv_free(*v);
    *v = NULL;
    *n = 0;
    return -1;
}

int jni_nics(JNIEnv *env, jobjectArray a, char ***out, size_t *n) {
    if (jni_textv(env, a, true, "the interfaces", out, n) != 0) return -1;
    if (*out && *n == 0) {
        jni_throw(env, jni_classes.illegal_argument, "the list of interfaces is empty");
        return drop_textv(out, n);
    }
    return 0;
}

int jni_env_entries(JNIEnv *env, jobjectArray a, const char *what, char ***out, size_t *n) {
    if (jni_textv(env, a, true, what, out, n) != 0) return -1;
    for (size_t i = 0; i < *n; i++) {
        const char *e = (*out)[i];
        if (!strchr(e, '=') || e[0] == '=') {
            jni_throw(env, jni_classes.illegal_argument, "%s entry %zu is not NAME=VALUE", what, i);
            return drop_textv(out, n);
        }
    }
    return 0;
}

jbyteArray jni_new_bytes(JNIEnv *env, const void *data, size_t len) {
    if (len > (size_t)INT32_MAX) {
        jni_throw(env, jni_classes.out_of_memory, "%zu bytes do not fit in a Java array", len);
        return NULL;
    }
    jbyteArray a = (*env)->NewByteArray(env, (jsize)len);
    if (!a) return NULL;
    if (len) (*env)->SetByteArrayRegion(env, a, 0, (jsize)len, (const jbyte *)data);
    return a;
}

jbyteArray jni_new_text(JNIEnv *env, const char *s) {
    return s ? jni_new_bytes(env, s, strlen(s)) : NULL;
}

jobjectArray jni_new_array(JNIEnv *env, jclass cls, size_t n, jni_make_fn *make,
                           const void *items) {
    if (n > (size_t)INT32_MAX) {
        jni_throw(env, jni_classes.out_of_memory, "%zu elements do not fit in a Java array", n);
        return NULL;
    }
    jobjectArray out = (*env)->NewObjectArray(env, (jsize)n, cls, NULL);
    for (size_t i = 0; out && i < n; i++) {
        if ((*env)->PushLocalFrame(env, 8) != 0) return NULL;
        jobject e = make(env, items, i);
        if (e) (*env)->SetObjectArrayElement(env, out, (jsize)i, e);
        (*env)->PopLocalFrame(env, NULL);
        if ((*env)->ExceptionCheck(env)) out = NULL;
    }
    return out;
}

static jobject text_at(JNIEnv *env, const void *items, size_t i) {
    return jni_new_text(env, ((const char *const *)items)[i]);
}

jobjectArray jni_new_text_array(JNIEnv *env, const char *const *v) {
    return jni_new_array(env, jni_classes.byte_array, hvd_strv_len(v), text_at, v);
}

jobject jni_new_rank_result(JNIEnv *env, const hvd_rank_result *r) {
    jbyteArray host = jni_new_text(env, r->host_hash), data = NULL, error = NULL;
    if (!(*env)->ExceptionCheck(env)) data = jni_new_bytes(env, r->data, r->len);
    if (data) error = jni_new_text(env, r->error);
    if (!data || (*env)->ExceptionCheck(env)) return NULL;
    return (*env)->NewObject(env, jni_classes.rank_result, jni_classes.rank_result_ctor,
                             (jint)r->rank, (jint)(r->index > INT32_MAX ? -1 : (int32_t)r->index),
                             host, (jboolean)r->present, (jint)r->status, data, error,
                             (jboolean)r->stopped);
}

void jni_log_stderr(const char *prefix, const char *line) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s: %s\n", prefix, line);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) {
        n = (int)sizeof buf - 1;
        buf[n - 1] = '\n';
    }
    (void)hvd_write_all(STDERR_FILENO, buf, (size_t)n);
}
