/* NULL-terminated string vectors (char **): the argv and environment shape. Every function that
 * allocates returns NULL on out of memory and never leaves a half-built vector behind. */
#ifndef HVD_COMMON_STRV_H
#define HVD_COMMON_STRV_H

#include <stdbool.h>
#include <stddef.h>

/* Number of strings before the NULL. NULL counts as empty. */
size_t hvd_strv_len(const char *const *v);

/* Deep copy. NULL gives an empty vector. */
char **hvd_strv_copy(const char *const *v);

/* Splits s at every sep into a vector; empty pieces are dropped ("a,,b" -> {"a","b"}), so an
 * empty s gives an empty vector. */
char **hvd_strv_split(const char *s, char sep);

/* Splits s into words as a POSIX shell does, without expanding anything: blanks separate
 * words, '...' keeps everything literally, "..." keeps all but \\ \" \$ \` (the backslash goes),
 * and outside quotes a backslash keeps the next character. NULL with *why set ("an unclosed
 * quote") when s cannot be split, NULL with *why NULL on out of memory. */
char **hvd_strv_split_shell(const char *s, const char **why);

/* Joins v with sep between the strings into a malloc'd string. */
char *hvd_strv_join(const char *const *v, const char *sep);

/* Frees every string and the vector. NULL is ignored. */
void hvd_strv_free(char **v);

/* True if v holds s. */
bool hvd_strv_has(const char *const *v, const char *s);

/* A vector being built, e.g. a command line. Adding never fails visibly: after an out-of-memory
 * the builder is marked failed, further adds do nothing, and hvd_strb_finish returns NULL, so
 * callers check once at the end. */
typedef struct hvd_strb {
    char **v;    /* NULL-terminated while not failed */
    size_t n;    /* strings in v */
    size_t cap;  /* room in v, the NULL included */
    bool failed; /* an allocation failed */
} hvd_strb;

void hvd_strb_add(hvd_strb *b, const char *s);
/* printf-style add. */
void hvd_strb_addf(hvd_strb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Takes the vector out of the builder (the builder is empty afterwards); NULL if any add
 * failed (everything is then freed). An empty builder gives an empty vector. */
char **hvd_strb_finish(hvd_strb *b);
/* Frees what the builder holds. */
void hvd_strb_free(hvd_strb *b);

#endif
