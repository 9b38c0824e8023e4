/* The response cache (response_cache.h).
 *
 * Once a name has been negotiated, its agreed parameters are kept in a numbered slot. When a
 * rank later submits the same name with the same parameters, it only sets that slot's bit in
 * the cycle's bit vector; a slot set on every rank is ready without a trip to the coordinator.
 * This only works if slot numbers are identical on every rank, so the cache is changed only
 * by the engine in response to the globally agreed response order: puts and touches happen in
 * that order, and eviction is LRU over that order. */
#include "response_cache.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct rt_cache_slot {
    const char *name; /* the key in by_name; NULL when free */
    rt_params p;
    int prev, next; /* LRU links (or free list via next) */
    void *user;     /* the engine's pending entry waiting on this slot */
};

/* Bound on each generation of the evicted-name set (8 MiB of hashes), whatever the capacity. */
#define GONE_CAP_MAX ((size_t)1 << 20)

/* A table for RT_CACHE_GONE_WINDOW x capacity evicted names at half load (fewer when that
 * would pass GONE_CAP_MAX). */
static size_t gone_cap_for(int capacity) {
    size_t want = 2 * (size_t)RT_CACHE_GONE_WINDOW * (size_t)capacity, cap = 64;
    while (cap < want && cap < GONE_CAP_MAX)
        cap *= 2;
    return cap;
}

int rt_cache_init(rt_cache *c, int capacity) {
    memset(c, 0, sizeof *c);
    rt_strmap_init(&c->by_name);
    c->lru_head = c->lru_tail = c->free_head = -1;
    if (capacity <= 0) return 0;
    c->slots = calloc((size_t)capacity, sizeof *c->slots);
    c->gone_cap = gone_cap_for(capacity);
    c->gone_max = c->gone_cap / 2;
    c->gone[0] = calloc(c->gone_cap, sizeof(uint64_t));
    c->gone[1] = calloc(c->gone_cap, sizeof(uint64_t));
    if (!c->slots || !c->gone[0] || !c->gone[1] ||
        rt_strmap_reserve(&c->by_name, (size_t)capacity) != 0) {
        rt_cache_free(c);
        return -1;
    }
    c->capacity = capacity;
    c->free_head = 0;
    for (int i = 0; i < c->capacity; i++) {
        c->slots[i].next = i + 1 < c->capacity ? i + 1 : -1;
        c->slots[i].prev = -1;
    }
    return 0;
}

void rt_cache_free(rt_cache *c) {
    free(c->slots);
    free(c->gone[0]);
    free(c->gone[1]);
    rt_strmap_free(&c->by_name); /* the names */
    memset(c, 0, sizeof *c);
    c->lru_head = c->lru_tail = c->free_head = -1;
}

int rt_cache_lookup(const rt_cache *c, const char *name) {
    intptr_t v = (intptr_t)rt_strmap_get(&c->by_name, name);
    return v ? (int)(v - 1) : -1;
}

const rt_params *rt_cache_params(const rt_cache *c, int slot) {
    return &c->slots[slot].p;
}

const char *rt_cache_name(const rt_cache *c, int slot) {
    return c->slots[slot].name;
}

static void lru_unlink(rt_cache *c, int s) {
    struct rt_cache_slot *x = &c->slots[s];
    if (x->prev >= 0)
        c->slots[x->prev].next = x->next;
    else
        c->lru_head = x->next;
    if (x->next >= 0)
        c->slots[x->next].prev = x->prev;
    else
        c->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_front(rt_cache *c, int s) {
    struct rt_cache_slot *x = &c->slots[s];
    x->prev = -1;
    x->next = c->lru_head;
    if (c->lru_head >= 0) c->slots[c->lru_head].prev = s;
    c->lru_head = s;
    if (c->lru_tail < 0) c->lru_tail = s;
}

void rt_cache_touch(rt_cache *c, int slot) {
    if (c->lru_head == slot) return;
    lru_unlink(c, slot);
    lru_push_front(c, slot);
}

/* ---- Names that come back after their eviction (rt_cache_returned) ---------------------- */

/* Where hash h is in table t, or the empty place it would take. */
static size_t gone_find(const rt_cache *c, const uint64_t *t, uint64_t h) {
    size_t mask = c->gone_cap - 1, i = (size_t)h & mask;
    while (t[i] && t[i] != h)
        i = (i + 1) & mask;
    return i;
}

static uint64_t gone_hash(const char *name) {
    return rt_strmap_hash(name) | 1; /* 0 marks an empty place */
}

/* Remembers an evicted name. A full generation becomes the older one, and the older one is
 * forgotten: every name evicted within the last gone_max evictions is remembered. */
static void gone_add(rt_cache *c, const char *name) {
    if (c->gone_n >= c->gone_max) {
        c->gone_cur ^= 1;
        memset(c->gone[c->gone_cur], 0, c->gone_cap * sizeof(uint64_t));
        c->gone_n = 0;
    }
    uint64_t *t = c->gone[c->gone_cur], h = gone_hash(name);
    size_t i = gone_find(c, t, h);
    if (!t[i]) {
        t[i] = h;
        c->gone_n++;
    }
}

static bool gone_has(const rt_cache *c, const char *name) {
    uint64_t h = gone_hash(name);
    for (int g = 0; g < 2; g++)
        if (c->gone[g][gone_find(c, c->gone[g], h)] == h) return true;
    return false;
}

int64_t rt_cache_returned(const rt_cache *c) {
    return c->returned;
}

void rt_cache_erase(rt_cache *c, int slot) {
    struct rt_cache_slot *x = &c->slots[slot];
    if (!x->name) return;
    rt_strmap_del(&c->by_name, x->name); /* frees the name */
    x->name = NULL;
    x->user = NULL;
    lru_unlink(c, slot);
    x->next = c->free_head;
    c->free_head = slot;
}

int rt_cache_put(rt_cache *c, char *name, const rt_params *p, void **evicted_user) {
    *evicted_user = NULL;
    if (c->capacity == 0) {
        free(name);
        return -1;
    }
    int s = rt_cache_lookup(c, name);
    if (s >= 0) {
        free(name);
        c->slots[s].p = *p;
        rt_cache_touch(c, s);
        return s;
    }
    if (gone_has(c, name)) c->returned++;
    if (c->free_head < 0) {
        *evicted_user = c->slots[c->lru_tail].user;
        gone_add(c, c->slots[c->lru_tail].name);
        rt_cache_erase(c, c->lru_tail);
    }
    s = c->free_head;
    c->free_head = c->slots[s].next;
    /* Cannot fail: the index was reserved for `capacity` names at init, and this name is
     * new, so the map adopts it without growing. */
    rt_strmap_put_owned(&c->by_name, name, (void *)(intptr_t)(s + 1));
    c->slots[s].name = name;
    c->slots[s].p = *p;
    c->slots[s].user = NULL;
    lru_push_front(c, s);
    return s;
}

void rt_cache_set_user(rt_cache *c, int slot, void *user) {
    c->slots[slot].user = user;
}

void *rt_cache_user(const rt_cache *c, int slot) {
    return c->slots[slot].user;
}
