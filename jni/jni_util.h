/* Shared helpers of the JNI glue (private to jni/).
 *
 * Rules every native method follows:
 *   - every argument is checked (null, length, handle) before native memory is touched; a
 *     bad one throws a Java exception and the method returns at once;
 *   - text crosses the boundary as UTF-8 byte arrays without NUL (the Java side encodes and
 *     decodes), never as modified UTF-8;
 *   - threads of the libraries never call into the JVM: log callbacks write to stderr. */
#ifndef HVD_JNI_UTIL_H
#define HVD_JNI_UTIL_H

#include <jni.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/driver.h"
#include "hvd/error.h"

/* Version of the contract with org.hvdbridge.NativeLibrary.ABI. */
#define HVD_JNI_ABI 1

/* Classes and methods looked up once in JNI_OnLoad (global references). */
typedef struct jni_cache {
    jclass hvd_exception;         /* org.hvdbridge.HvdException */
    jmethodID hvd_exception_ctor; /* (byte[] message, int code) */
    jclass rank_result;           /* org.hvdbridge.RankResult */
    jmethodID rank_result_ctor;   /* (int, int, byte[], boolean, int, byte[], byte[]) */
    jclass illegal_state;         /* java.lang.IllegalStateException */
    jclass illegal_argument;      /* java.lang.IllegalArgumentException */
    jclass null_pointer;          /* java.lang.NullPointerException */
    jclass out_of_memory;         /* java.lang.OutOfMemoryError */
    jclass byte_array;            /* byte[] */
} jni_cache;

extern jni_cache jni_classes;

/* Throws HvdException with err's sentence and code. */
void jni_throw_err(JNIEnv *env, const hvd_err *err);
/* Throws HvdException with a formatted sentence. */
void jni_throw_hvd(JNIEnv *env, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Throws an exception of class cls (one of jni_classes) with a formatted message. */
void jni_throw(JNIEnv *env, jclass cls, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Throws OutOfMemoryError naming what could not be allocated. */
void jni_throw_oom(JNIEnv *env, const char *what);

/* Checks a handle passed from Java; throws IllegalStateException and returns NULL for 0. */
void *jni_handle(JNIEnv *env, jlong h, const char *what);

/* Copies a byte[] holding UTF-8 text into a malloc'd NUL-terminated string. A null array
 * gives *out = NULL and succeeds when may_be_null, else throws NullPointerException. Text
 * with a NUL byte throws IllegalArgumentException. Returns 0, or -1 with an exception
 * pending. */
int jni_text(JNIEnv *env, jbyteArray a, bool may_be_null, const char *what, char **out);

/* Copies a byte[] into malloc'd memory (*out never NULL on success, *len may be 0). A null
 * array throws NullPointerException. Returns 0, or -1 with an exception pending. */
int jni_bytes(JNIEnv *env, jbyteArray a, const char *what, uint8_t **out, size_t *len);

/* Copies a byte[][] of UTF-8 texts into a malloc'd NULL-terminated array of strings (*n
 * entries; free it with hvd_strv_free). A null array gives *out = NULL when may_be_null.
 * Returns 0, or -1 with an exception pending. */
int jni_textv(JNIEnv *env, jobjectArray a, bool may_be_null, const char *what, char ***out,
              size_t *n);

/* The interfaces argument of the driver and the task: as jni_textv with null allowed (*out =
 * NULL: the library's default), and an empty array throws IllegalArgumentException. */
int jni_nics(JNIEnv *env, jobjectArray a, char ***out, size_t *n);

/* Environment entries: as jni_textv with null allowed, and an entry that is not NAME=VALUE
 * (NAME not empty) throws IllegalArgumentException naming `what` and the entry's index. */
int jni_env_entries(JNIEnv *env, jobjectArray a, const char *what, char ***out, size_t *n);

/* A new byte[] with the given bytes (NULL data with len 0 is an empty array); NULL with an
 * exception pending. */
jbyteArray jni_new_bytes(JNIEnv *env, const void *data, size_t len);
/* A new byte[] with a C string's bytes, or NULL (no exception) for a NULL string. */
jbyteArray jni_new_text(JNIEnv *env, const char *s);

/* Makes element i of a Java array from items; NULL with an exception pending, or NULL without
 * one for a null element. */
typedef jobject jni_make_fn(JNIEnv *env, const void *items, size_t i);
/* A new array of class cls (one of jni_classes) with n elements made by make, each in a local
 * frame of its own; NULL with an exception pending. */
jobjectArray jni_new_array(JNIEnv *env, jclass cls, size_t n, jni_make_fn *make, const void *items);
/* A new byte[][] with the strings of v (NULL-terminated); NULL with an exception pending. */
jobjectArray jni_new_text_array(JNIEnv *env, const char *const *v);

/* A new org.hvdbridge.RankResult with r's fields (an index above INT32_MAX becomes -1); NULL
 * with an exception pending. */
jobject jni_new_rank_result(JNIEnv *env, const hvd_rank_result *r);

/* Writes "<prefix>: <line>\n" to stderr in one write(), retried only after EINTR or a short
 * write (lines of several threads never interleave). Never calls into the JVM. */
void jni_log_stderr(const char *prefix, const char *line);

#endif
