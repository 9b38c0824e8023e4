/* String-keyed hash map (strmap.h). */
#include "strmap.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct rt_strmap_slot {
    char *key; /* NULL = empty */
    uint64_t hash;
    void *value;
};

/* FNV-1a, 64 bit: names are short and this is fast enough for 10,000 per cycle. */
uint64_t rt_strmap_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

void rt_strmap_init(rt_strmap *m) {
    m->slots = NULL;
    m->capacity = 0;
    m->count = 0;
}

void rt_strmap_free(rt_strmap *m) {
    for (size_t i = 0; i < m->capacity; i++)
        free(m->slots[i].key);
    free(m->slots);
    rt_strmap_init(m);
}

static long find(const rt_strmap *m, const char *key, uint64_t h) {
    if (m->capacity == 0) return -1;
    size_t mask = m->capacity - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct rt_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->hash == h && strcmp(s->key, key) == 0) return (long)i;
    }
}

void *rt_strmap_get(const rt_strmap *m, const char *key) {
    long i = find(m, key, rt_strmap_hash(key));
    return i < 0 ? NULL : m->slots[i].value;
}

static void insert_slot(rt_strmap *m, char *key, uint64_t h, void *value) {
    size_t mask = m->capacity - 1;
    size_t i = h & mask;
    while (m->slots[i].key)
        i = (i + 1) & mask;
    m->slots[i].key = key;
    m->slots[i].hash = h;
    m->slots[i].value = value;
}

/* Rehashes into a table of new_cap slots. Returns 0, or -1 on out of memory (unchanged). */
static int rehash(rt_strmap *m, size_t new_cap) {
    struct rt_strmap_slot *slots = calloc(new_cap, sizeof *slots);
    if (!slots) return -1;
    size_t old_cap = m->capacity;
    struct rt_strmap_slot *old = m->slots;
    m->slots = slots;
    m->capacity = new_cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key) insert_slot(m, old[i].key, old[i].hash, old[i].value);
    free(old);
    return 0;
}

int rt_strmap_reserve(rt_strmap *m, size_t n) {
    size_t cap = m->capacity ? m->capacity : 16;
    while (n * 4 > cap * 3) /* keep the load under 3/4 */
        cap *= 2;
    return cap == m->capacity ? 0 : rehash(m, cap);
}

int rt_strmap_put_owned(rt_strmap *m, char *key, void *value) {
    uint64_t h = rt_strmap_hash(key);
    long i = find(m, key, h);
    if (i >= 0) {
        m->slots[i].value = value;
        free(key);
        return 0;
    }
    if (rt_strmap_reserve(m, m->count + 1) != 0) return -1;
    insert_slot(m, key, h, value);
    m->count++;
    return 0;
}

int rt_strmap_put(rt_strmap *m, const char *key, void *value) {
    uint64_t h = rt_strmap_hash(key);
    long i = find(m, key, h);
    if (i >= 0) {
        m->slots[i].value = value;
        return 0;
    }
    char *copy = strdup(key);
    if (!copy || rt_strmap_reserve(m, m->count + 1) != 0) {
        free(copy);
        return -1;
    }
    insert_slot(m, copy, h, value);
    m->count++;
    return 0;
}

void *rt_strmap_take(rt_strmap *m, const char *key, char **stored_key) {
    *stored_key = NULL;
    long found = find(m, key, rt_strmap_hash(key));
    if (found < 0) return NULL;
    size_t mask = m->capacity - 1;
    size_t i = (size_t)found;
    void *value = m->slots[i].value;
    *stored_key = m->slots[i].key; /* may be `key` itself: not read after this */
    m->slots[i].key = NULL;
    m->count--;
    /* Shift back later members of the probe run whose home slot is not between the hole and
     * their current position, so lookups never stop early at the hole. */
    for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash & mask;
        bool movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->slots[i] = m->slots[j];
            m->slots[j].key = NULL;
            i = j;
        }
    }
    return value;
}

void *rt_strmap_del(rt_strmap *m, const char *key) {
    char *stored;
    void *value = rt_strmap_take(m, key, &stored);
    free(stored);
    return value;
}

long rt_strmap_next(const rt_strmap *m, size_t *pos, const char **key, void **value) {
    for (size_t i = *pos; i < m->capacity; i++) {
        if (m->slots[i].key) {
            *pos = i + 1;
            if (key) *key = m->slots[i].key;
            if (value) *value = m->slots[i].value;
            return (long)i;
        }
    }
    *pos = m->capacity;
    return -1;
}
