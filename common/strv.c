/* NULL-terminated string vectors (common/strv.h). */
#include "common/strv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t hvd_strv_len(const char *const *v) {
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

void hvd_strv_free(char **v) {
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

bool hvd_strv_has(const char *const *v, const char *s) {
    for (size_t i = 0; v && v[i]; i++)
        if (strcmp(v[i], s) == 0) return true;
    return false;
}

/* Grows b so that one more string and the NULL fit. */
static bool strb_grow(hvd_strb *b) {
    if (b->failed) return false;
    if (b->n + 2 <= b->cap) return true;
    size_t cap = b->cap ? b->cap * 2 : 16;
    char **v = realloc(b->v, cap * sizeof *v);
    if (!v) {
        b->failed = true;
        return false;
    }
    b->v = v;
    b->cap = cap;
    return true;
}

static void strb_take(hvd_strb *b, char *s) {
    if (!s) {
        b->failed = true;
        return;
    }
    if (!strb_grow(b)) {
        free(s);
        return;
    }
    b->v[b->n++] = s;
    b->v[b->n] = NULL;
}

void hvd_strb_add(hvd_strb *b, const char *s) {
    if (!b->failed) strb_take(b, strdup(s));
}

void hvd_strb_addf(hvd_strb *b, const char *fmt, ...) {
    if (b->failed) return;
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&s, fmt, ap);
    va_end(ap);
    strb_take(b, r < 0 ? NULL : s);
}

char **hvd_strb_finish(hvd_strb *b) {
    if (!b->failed && !b->v) strb_grow(b);
    if (b->failed) {
        hvd_strb_free(b);
        return NULL;
    }
    b->v[b->n] = NULL;
    char **v = b->v;
    memset(b, 0, sizeof *b);
    return v;
}

void hvd_strb_free(hvd_strb *b) {
    for (size_t i = 0; i < b->n; i++)
        free(b->v[i]);
    free(b->v);
    memset(b, 0, sizeof *b);
}

char **hvd_strv_copy(const char *const *v) {
    hvd_strb b = {0};
    for (size_t i = 0; v && v[i]; i++)
        hvd_strb_add(&b, v[i]);
    return hvd_strb_finish(&b);
}

char **hvd_strv_split(const char *s, char sep) {
    hvd_strb b = {0};
    while (s && *s) {
        const char *end = strchr(s, sep);
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if (n > 0) strb_take(&b, strndup(s, n));
        s = end ? end + 1 : s + n;
    }
    return hvd_strb_finish(&b);
}

/* One shell word of s from *pos into out (room for strlen(s) + 1): 0, or -1 with *why. */
static int shell_word(const char *s, size_t *pos, char *out, const char **why) {
    size_t i = *pos, n = 0;
    char quote = 0;
    for (; s[i] && (quote || (s[i] != ' ' && s[i] != '\t' && s[i] != '\n')); i++) {
        char c = s[i];
        if (quote == '\'') {
            if (c == '\'')
                quote = 0;
            else
                out[n++] = c;
        } else if (c == '\\' && s[i + 1] &&
                   (!quote || strchr("\\\"$`", s[i + 1]))) { /* in "...": only those */
            out[n++] = s[++i];
        } else if (c == '"' && quote) {
            quote = 0;
        } else if ((c == '"' || c == '\'') && !quote) {
            quote = c;
        } else {
            out[n++] = c;
        }
    }
    out[n] = '\0';
    *pos = i;
    if (quote) *why = quote == '"' ? "an unclosed \" quote" : "an unclosed ' quote";
    return quote ? -1 : 0;
}

char **hvd_strv_split_shell(const char *s, const char **why) {
    *why = NULL;
    hvd_strb b = {0};
    char *word = malloc(strlen(s) + 1);
    if (!word) return NULL;
    for (size_t i = 0;;) {
        while (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')
            i++;
        if (!s[i]) break;
        if (shell_word(s, &i, word, why) != 0) {
            free(word);
            hvd_strb_free(&b);
            return NULL;
        }
        hvd_strb_add(&b, word);
    }
    free(word);
    return hvd_strb_finish(&b);
}

char *hvd_strv_join(const char *const *v, const char *sep) {
    size_t len = 1, seplen = strlen(sep);
    for (size_t i = 0; v && v[i]; i++)
        len += strlen(v[i]) + (i ? seplen : 0);
    char *out = malloc(len), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; v && v[i]; i++) {
        if (i) {
            memcpy(p, sep, seplen);
            p += seplen;
        }
        size_t n = strlen(v[i]);
        memcpy(p, v[i], n);
        p += n;
    }
    *p = '\0';
    return out;
}
