/* The response cache (HOROVOD_CACHE_CAPACITY): slot-numbered agreed parameters of names
 * negotiated before. Every change is driven by the globally agreed response order, so slot
 * numbers (and so the cycle's bit vector) match on all ranks. LRU eviction. */
#ifndef HVD_RUNTIME_RESPONSE_CACHE_H
#define HVD_RUNTIME_RESPONSE_CACHE_H

#include "params.h"
#include "strmap.h"

/* Evicted names remembered, in multiples of the capacity (rt_cache_returned). */
#define RT_CACHE_GONE_WINDOW 8

typedef struct rt_cache {
    int capacity;
    struct rt_cache_slot *slots;
    rt_strmap by_name; /* name -> slot index + 1 (as intptr_t); owns the names */
    int lru_head;      /* most recently used, -1 if empty */
    int lru_tail;      /* least recently used */
    int free_head;     /* free slot list */
    /* Names evicted lately, by hash (0: empty), in two generations: gone[cur] fills up to
     * gone_max names, then becomes the older one and the other starts empty. And how many
     * names came back after their eviction: rt_cache_returned. */
    uint64_t *gone[2];
    size_t gone_cap, gone_max, gone_n; /* table size, its fill limit, names in gone[cur] */
    int gone_cur;
    int64_t returned;
} rt_cache;

/* Allocates every slot and the whole name index up front, so that no later call can fail:
 * a rank that could not cache a name its peers cached would number slots differently.
 * Returns 0, or -1 on out of memory (c is then empty, and rt_cache_free is still safe). */
int rt_cache_init(rt_cache *c, int capacity);
void rt_cache_free(rt_cache *c);
/* Slot of name, or -1. */
int rt_cache_lookup(const rt_cache *c, const char *name);
const rt_params *rt_cache_params(const rt_cache *c, int slot);
const char *rt_cache_name(const rt_cache *c, int slot);
/* Marks slot as most recently used. */
void rt_cache_touch(rt_cache *c, int slot);
/* Inserts (or refreshes) name, a malloc'd string the cache takes over (and frees when it
 * already has the name or is disabled); returns its slot. If the least recently used slot had
 * to be evicted to make room, *evicted_user is that slot's user pointer (else NULL).
 * Capacity 0: returns -1 and does nothing else. Never fails otherwise. */
int rt_cache_put(rt_cache *c, char *name, const rt_params *p, void **evicted_user);
void rt_cache_erase(rt_cache *c, int slot);
/* How many names put so far had been evicted lately (within the last RT_CACHE_GONE_WINDOW x
 * capacity evictions at least, but never more than 2^19 evictions back). A cache too small for the
 * names a step uses evicts each of them before it comes back, so every step is negotiated in full;
 * names that are new every time (never submitted again) are not counted. */
int64_t rt_cache_returned(const rt_cache *c);
/* Opaque per-slot pointer for the engine (its pending entry waiting on that slot). */
void rt_cache_set_user(rt_cache *c, int slot, void *user);
void *rt_cache_user(const rt_cache *c, int slot);

#endif
