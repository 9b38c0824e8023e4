/* Open-addressing hash map from NUL-terminated strings to pointers, with linear probing and
 * backward-shift deletion (no tombstones, so a map that sees millions of insert/delete pairs
 * over a training run never degrades). */
#ifndef HVD_RUNTIME_STRMAP_H
#define HVD_RUNTIME_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct rt_strmap {
    struct rt_strmap_slot *slots; /* capacity entries; key NULL = empty */
    size_t capacity;              /* power of two, or 0 before the first insert */
    size_t count;                 /* live entries */
} rt_strmap;

/* The hash the map uses for a key (FNV-1a, 64 bit). */
uint64_t rt_strmap_hash(const char *s);

void rt_strmap_init(rt_strmap *m);
/* Frees the keys and the table (not the values). */
void rt_strmap_free(rt_strmap *m);
/* The value stored under key, or NULL. */
void *rt_strmap_get(const rt_strmap *m, const char *key);
/* Inserts (copying key) or replaces the value. Returns 0, or -1 on out of memory (the map is
 * unchanged). */
int rt_strmap_put(rt_strmap *m, const char *key, void *value);
/* Like rt_strmap_put, but key is malloc'd and the map takes it over on success (on a replace,
 * key is freed and the stored one kept). */
int rt_strmap_put_owned(rt_strmap *m, char *key, void *value);
/* Makes room for n live entries, so that inserts up to that count cannot fail. Returns 0, or
 * -1 on out of memory. */
int rt_strmap_reserve(rt_strmap *m, size_t n);
/* Removes key; returns its value or NULL if absent. key may be the stored key itself. */
void *rt_strmap_del(rt_strmap *m, const char *key);
/* Removes key and returns its value (NULL if absent); *stored_key receives the map's copy of
 * the key, which is now the caller's to free (NULL if absent). */
void *rt_strmap_take(rt_strmap *m, const char *key, char **stored_key);
/* Iteration: returns the next live slot index >= *pos and advances *pos, or -1 at the end. */
long rt_strmap_next(const rt_strmap *m, size_t *pos, const char **key, void **value);

#endif
