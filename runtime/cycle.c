/* One cycle of the background loop (cycle.h). Every HOROVOD_CYCLE_TIME:
 *
 *   1. drain the queue; classify each new entry against the response cache
 *   2. agree on the bit vector (one allreduce): flags, cache hits, invalidations
 *   3. drop the slots some rank invalidated
 *   4. take the cache hits pending on every rank
 *   5. if any rank has new requests (or shuts down): full negotiation at the coordinator
 *   6. sort the coordinator's responses into what runs and what failed
 *   7. fuse the agreed entries into groups and execute them in the agreed order
 *   8. update the response cache (same order on every rank) and complete the handles
 *
 * Running out of memory. A rank must never leave the others waiting in a collective it does
 * not enter, and the library must not end the process, so every allocation is placed where
 * its failure can be agreed on:
 *
 *   - Before the bit vector (step 2) nothing is agreed yet. The cycle reserves there, sized by
 *     what is pending on this rank, everything it may need until the end of the cycle: the
 *     entry lists, the request list, the fusion plan's storage, and the host and device fusion
 *     buffers (no fused group can be larger than the pending allreduces it is made of, nor
 *     than the threshold). A rank whose fusion buffer cannot grow sets RT_FLAG_NO_FUSION and
 *     every rank runs this cycle's allreduces unfused: slower, but correct, and with no buffer.
 *     A rank that cannot record its submissions sets RT_FLAG_BROKEN: every rank then fails
 *     every pending handle with HVD_E_INTERNAL naming that rank and what it ran out of memory
 *     for, and stops, as after hvd_shutdown.
 *   - In the full negotiation (step 5), a rank that cannot build its message tells the
 *     coordinator, and a coordinator that cannot decide broadcasts why: every rank fails every
 *     handle with the same sentence and stops (controller.c).
 *   - The outputs of allgather and alltoall, whose size is known only inside the collective,
 *     are allocated before their data moves, and the outcome is agreed in the same collective
 *     step (ops_mpi.c, ops_nccl.c): that tensor fails on every rank, the runtime goes on.
 *   - After the bit vector, caching a negotiated name adopts a string this rank already has
 *     (the cache reserved its index at start-up), so the slot numbers cannot diverge.
 *
 * What remains are two buffers of the negotiation whose size only the collective itself
 * reveals: the coordinator's buffer for the gathered requests, and another rank's buffer for
 * the broadcast responses (kilobytes per thousand names). Making them agreed would cost one
 * more collective in every full negotiation. If one of them cannot be had, this rank alone
 * cannot follow the cycle its peers are in ("alone"): it fails its handles with the reason,
 * stops, and leaves MPI unfinalized at hvd_shutdown (engine.c), so that when its process
 * exits the launcher (mpirun) ends the job, instead of every rank waiting forever. */
#include "cycle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "fault.h"
#include "log.h"
#include "ops_mpi.h"
#include "state.h"
#include "types.h"
#ifdef HVD_HAVE_NCCL
#include "ops_nccl.h"
#endif

/* ---- set-up and tear-down ---------------------------------------------------------------- */

int rt_cycle_init(rt_cycle *b, const rt_config *cfg, MPI_Comm comm, int rank, int size,
                  hvd_err *err) {
    memset(b, 0, sizeof *b);
    b->cfg = *cfg;
    b->rank = rank;
    b->size = size;
    b->device = -1;
    b->join_device = HVD_DEVICE_CPU;
    rt_strmap_init(&b->pending);
    if (rank == 0 && cfg->timeline_path[0]) {
        b->tl = rt_timeline_open(cfg->timeline_path, err);
        if (!b->tl) return -1;
    }
    if (rt_exec_init(&b->exec, comm, rank, size, err) != 0) return -1;
    b->exec.tl = b->tl;
    b->exec.mpi = rt_mpi_types_create(err);
    if (!b->exec.mpi) return -1;
#ifdef HVD_HAVE_NCCL
    b->exec.nccl = rt_nccl_create();
    if (!b->exec.nccl) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory for the NCCL state");
#endif
    b->words = ((size_t)cfg->cache_capacity + 63) / 64;
    b->hit = calloc(b->words ? b->words : 1, sizeof *b->hit);
    b->bad = calloc(b->words ? b->words : 1, sizeof *b->bad);
    if (!b->hit || !b->bad)
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory for the cache bit vector");
    if (rt_cache_init(&b->cache, (int)cfg->cache_capacity) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "out of memory for a response cache of %lld slots "
                           "(HOROVOD_CACHE_CAPACITY)",
                           (long long)cfg->cache_capacity);
    if (rt_controller_init(&b->ctl, comm, rank, size, b->words, b->tl, err) != 0) return -1;
    b->ctl.stall.warn_ns = cfg->stall_warn_ns;
    b->ctl.stall.shutdown_ns = cfg->stall_shutdown_ns;
    b->ctl.stall.last_check_ns = hvd_now_ns();
    /* A cached name pending on only some ranks is invisible to the stall inspector (it only
     * sees the coordinator's table): after half the stall time, move it there. Not sooner: a
     * slow rank would otherwise keep knocking names out of the cache. */
    int64_t limit = cfg->stall_warn_ns > 0 ? cfg->stall_warn_ns : cfg->stall_shutdown_ns;
    if (cfg->stall_shutdown_ns > 0 && cfg->stall_shutdown_ns < limit)
        limit = cfg->stall_shutdown_ns;
    b->evict_ns = limit / 2;
    return 0;
}

void rt_cycle_free(rt_cycle *b) {
#ifdef HVD_HAVE_NCCL
    if (b->exec.nccl) rt_nccl_free(b->exec.nccl);
#endif
    if (b->exec.mpi) rt_mpi_types_free(b->exec.mpi);
    rt_exec_free(&b->exec);
    rt_controller_free(&b->ctl);
    rt_cache_free(&b->cache);
    rt_timeline_close(b->tl);
    rt_strmap_free(&b->pending);
    free(b->unsent.v);
    free(b->run.v);
    free(b->failed.v);
    free(b->reqs);
    rt_group_list_free(&b->groups);
    free(b->hit);
    free(b->bad);
    for (size_t i = 0; i < b->standins.n; i++)
        rt_entry_free(b->standins.v[i]);
    free(b->standins.v);
    free(b->zeros);
    free(b->sink);
}

/* ---- bookkeeping ----------------------------------------------------------------------- */

/* Records this rank's first bookkeeping failure; every rank learns of it at the next bit
 * vector. */
static void mark_broken(rt_cycle *b, const char *what) {
    if (b->broken.code) return;
    hvd_err_set(&b->broken, HVD_E_INTERNAL, "rank %d ran out of memory %s", b->rank, what);
    rt_log("%s; the collective runtime stops on every rank", b->broken.msg);
}

static int vec_reserve(rt_entry_vec *v, size_t n) {
    if (n <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < n)
        cap *= 2;
    rt_entry **p = realloc(v->v, cap * sizeof *p);
    if (!p) return -1;
    v->v = p;
    v->cap = cap;
    return 0;
}

/* Appends e. The lists are reserved for every pending entry before the bit vector, so this
 * only grows them if that reservation failed, and then the rank is already broken. */
static void vec_push(rt_cycle *b, rt_entry_vec *v, rt_entry *e) {
    if (v->n == v->cap && vec_reserve(v, v->n + 1) != 0) {
        mark_broken(b, "listing tensors");
        return;
    }
    v->v[v->n++] = e;
}

/* Room for n pending entries in everything the cycle fills after the bit vector. */
static int reserve_lists(rt_cycle *b, size_t n) {
    if (n > b->reqs_cap) {
        rt_request *r = realloc(b->reqs, n * sizeof *r);
        if (!r) return -1;
        b->reqs = r;
        b->reqs_cap = n;
    }
    return vec_reserve(&b->unsent, n) | vec_reserve(&b->run, n) | vec_reserve(&b->failed, n) |
           rt_fusion_reserve(&b->groups, n);
}

/* Adds e's bytes to (sign 1) or removes them from (sign -1) what fusion could pack. An empty
 * allreduce counts as a member too: fusion packs it with the others, and a group of it and
 * one other tensor still needs the buffer (before, such a first fused group found none). */
static void count_fusable(rt_cycle *b, const rt_entry *e, int sign) {
    if (!rt_entry_fusable(e, b->cfg.fusion_threshold)) return;
    int64_t bytes = rt_entry_fusable_bytes(e, b->cfg.fusion_threshold);
    if (e->p.on_device) {
        b->fusable_device += bytes * sign;
        b->nfusable_device += sign;
    } else {
        b->fusable_host += bytes * sign;
        b->nfusable_host += sign;
    }
}

/* Completes entries that are out of `pending`: publishes them with the counters. */
static void publish_completed(rt_cycle *b, rt_entry **v, size_t n) {
    b->stats.tensors_done += n;
    b->stats.stall_warnings = b->ctl.stall.warnings;
    rt_state_complete(v, n, &b->stats);
}

/* Completes entries of `pending`: publishes their outcome to their handles and frees them. */
static void complete(rt_cycle *b, rt_entry **v, size_t n) {
    if (n == 0) return;
    for (size_t i = 0; i < n; i++)
        if (rt_strmap_del(&b->pending, v[i]->name)) count_fusable(b, v[i], -1);
    publish_completed(b, v, n);
}

/* Fails e with "tensor 'x' did not complete: reason" and completes it on its own. */
static void fail_one(rt_cycle *b, rt_entry *e, int code, const char *reason, bool in_pending) {
    char msg[HVD_ERR_MAX];
    snprintf(msg, sizeof msg, "tensor '%s' did not complete: %s", e->name, reason);
    rt_entry_fail(e, code, msg);
    if (in_pending)
        complete(b, &e, 1);
    else
        publish_completed(b, &e, 1);
}

static void free_stand_ins(rt_cycle *b);

/* Fails everything this rank still holds (queue, unrecorded entries and pending) and marks
 * the runtime ended. Called once, when the loop stops. Allocates nothing: the pending
 * entries are chained through their queue links, which they no longer use. */
static bool end(rt_cycle *b, int code, const char *reason) {
    free_stand_ins(b);
    rt_entry *q = rt_state_end(reason);
    for (rt_entry *e = q, *next; e; e = next) {
        next = e->next;
        fail_one(b, e, code, reason, false);
    }
    for (rt_entry *e = b->orphans, *next; e; e = next) {
        next = e->next;
        fail_one(b, e, code, reason, false);
    }
    b->orphans = NULL;
    rt_entry *all = NULL;
    size_t pos = 0;
    void *v;
    while (rt_strmap_next(&b->pending, &pos, NULL, &v) >= 0) {
        rt_entry *e = v;
        e->next = all;
        all = e;
    }
    for (rt_entry *e = all, *next; e; e = next) {
        next = e->next;
        fail_one(b, e, code, reason, true);
    }
    return true;
}

/* ---- join: stand-ins ---------------------------------------------------------------------- */

/* From its join until every rank has joined, a rank takes part in the allreduces the others
 * still run, with zeros: a stand-in entry per such allreduce, made from the agreed parameters
 * (a cache slot's or a response's), with no handle. Stand-ins are made after the bit vector,
 * so, like the negotiation's own buffers (see the top of this file), a stand-in this rank
 * cannot allocate leaves it alone: it stops, and the job ends when its process exits. */

/* Adds a stand-in for name to this cycle's run. Returns false on out of memory. */
static bool push_stand_in(rt_cycle *b, const char *name, const rt_params *p) {
    if (vec_reserve(&b->standins, b->standins.n + 1) != 0 || vec_reserve(&b->run, b->run.n + 1))
        return false;
    rt_entry *z = rt_entry_new(RT_ALLREDUCE, (hvd_dtype)p->dtype,
                               p->on_device ? b->join_device : HVD_DEVICE_CPU);
    char *copy = z ? strdup(name) : NULL;
    if (!copy) {
        rt_entry_free(z);
        return false;
    }
    z->name = copy;
    z->p = *p;
    z->stand_in = true;
    b->standins.v[b->standins.n++] = z;
    b->run.v[b->run.n++] = z;
    return true;
}

/* Gives this cycle's stand-ins their buffers: one of zeros to send (never written) and one to
 * receive into, shared by all. Returns false when they cannot be had. */
static bool arm_stand_ins(rt_cycle *b) {
    if (b->standins.n == 0) return true;
    /* The fusion plan's room was reserved for this rank's entries alone. */
    if (rt_fusion_reserve(&b->groups, b->run.n) != 0) return false;
    size_t host = 0, dev = 0;
    for (size_t i = 0; i < b->standins.n; i++) {
        const rt_params *p = &b->standins.v[i]->p;
        size_t bytes = (size_t)p->count * rt_dtype_size((hvd_dtype)p->dtype);
        size_t *most = p->on_device ? &dev : &host;
        if (bytes > *most) *most = bytes;
    }
    if (host > b->standin_cap) {
        free(b->zeros);
        free(b->sink);
        b->zeros = calloc(1, host);
        b->sink = malloc(host);
        b->standin_cap = b->zeros && b->sink ? host : 0;
        if (!b->standin_cap) return false;
    }
    void *dzeros = NULL, *dsink = NULL;
    if (dev > 0) {
#ifdef HVD_HAVE_NCCL
        if (rt_nccl_stand_in_buffers(b->exec.nccl, b->join_device, dev, &dzeros, &dsink) != 0)
            return false;
#else
        return false;
#endif
    }
    for (size_t i = 0; i < b->standins.n; i++) {
        rt_entry *z = b->standins.v[i];
        z->in = z->p.on_device ? dzeros : b->zeros;
        z->out = z->p.on_device ? dsink : b->sink;
    }
    return true;
}

/* Takes the stand-ins out of run (keeping the order of the rest) and frees them. */
static void free_stand_ins(rt_cycle *b) {
    if (b->standins.n == 0) return;
    size_t k = 0;
    for (size_t i = 0; i < b->run.n; i++)
        if (!b->run.v[i]->stand_in) b->run.v[k++] = b->run.v[i];
    b->run.n = k;
    for (size_t i = 0; i < b->standins.n; i++)
        rt_entry_free(b->standins.v[i]);
    b->standins.n = 0;
}

/* ---- 1. drain ---------------------------------------------------------------------------- */

static void to_unsent(rt_cycle *b, rt_entry *e) {
    e->state = RT_E_UNSENT;
    e->cache_slot = -1;
    vec_push(b, &b->unsent, e);
}

/* Records a drained entry as pending and looks it up in the response cache. */
static void classify(rt_cycle *b, rt_entry *e) {
    if (rt_strmap_put(&b->pending, e->name, e) != 0) {
        mark_broken(b, "recording a submitted tensor");
        e->next = b->orphans;
        b->orphans = e;
        return;
    }
    count_fusable(b, e, 1);
    if (e->p.on_device && b->device < 0) b->device = e->device;
    if (b->rank == 0) rt_timeline_negotiate_start(b->tl, e->name, e->p.optype);
    int slot = rt_cache_lookup(&b->cache, e->name);
    if (slot >= 0 && rt_params_equal(rt_cache_params(&b->cache, slot), &e->p)) {
        e->state = RT_E_CACHED;
        e->cache_slot = slot;
        e->partial_since_ns = 0;
        rt_cache_set_user(&b->cache, slot, e);
        return;
    }
    /* Same name, different parameters: every rank must drop the slot, so that everyone
     * negotiates this name in full and the coordinator can report the mismatch. */
    if (slot >= 0) b->bad[slot / 64] |= 1ull << (slot % 64);
    to_unsent(b, e);
}

/* Step 1. Returns whether hvd_shutdown was called on this rank. */
static bool drain(rt_cycle *b) {
    bool shut;
    rt_entry *q = rt_state_drain(&shut);
    memset(b->hit, 0, b->words * sizeof *b->hit);
    memset(b->bad, 0, b->words * sizeof *b->bad);
    size_t n = 0;
    for (rt_entry *e = q; e; e = e->next)
        n++;
    /* Room, before anything is agreed, for everything this cycle can hold. */
    size_t room = b->pending.count + n;
    if (n > 0 && !b->broken.code &&
        (rt_fault_hit(RT_FAULT_CYCLE) || rt_strmap_reserve(&b->pending, room) != 0 ||
         reserve_lists(b, room) != 0))
        mark_broken(b, "recording the submitted tensors");
    for (rt_entry *e = q, *next; e; e = next) {
        next = e->next;
        if (b->broken.code) {
            e->next = b->orphans;
            b->orphans = e;
        } else {
            classify(b, e);
        }
    }
    return shut;
}

/* ---- 2. the bit vector --------------------------------------------------------------------- */

/* Whether this rank may stand in during this cycle: it joined, or sends its join now (and
 * the coordinator may then count it as joined in this very negotiation); with the device its
 * join gave in *device. */
static bool may_stand_in(rt_cycle *b, int *device) {
    *device = b->join_device;
    if (b->joined) return true;
    for (size_t i = 0; i < b->unsent.n; i++)
        if (b->unsent.v[i]->p.optype == RT_JOIN) {
            *device = b->unsent.v[i]->device;
            return true;
        }
    return false;
}

/* Grows the fusion buffers for the largest group this cycle can form. Returns false if some
 * buffer cannot be had (this cycle then runs unfused on every rank). */
static bool reserve_fusion(rt_cycle *b) {
    /* A fused group has two members or more, all pending here, and fits the threshold. */
    int64_t t = b->cfg.fusion_threshold;
    int64_t host = b->nfusable_host < 2 ? 0 : b->fusable_host < t ? b->fusable_host : t;
    /* A joined rank's stand-ins may fill any group the others form. */
    int join_device;
    bool stand_in = may_stand_in(b, &join_device);
    if (stand_in) host = t;
    bool ok = host <= 0 || rt_fusion_buffer_reserve(&b->exec.fusion, (size_t)host) == 0;
#ifdef HVD_HAVE_NCCL
    int64_t dev = b->nfusable_device < 2 ? 0 : b->fusable_device < t ? b->fusable_device : t;
    if (stand_in && join_device >= 0) {
        dev = t;
        b->device = join_device; /* the rank's one device (hvd_join_async checked) */
    }
    if (ok && dev > 0 && b->device >= 0)
        ok = rt_nccl_reserve_fusion(b->exec.nccl, b->device, (size_t)dev) == 0;
#endif
    if (!ok && !b->fusion_short)
        rt_log("out of memory growing the fusion buffer (%lld bytes of allreduces pending on "
               "this rank): allreduces run unfused until it can grow",
               (long long)(host > 0 ? host : b->fusable_device));
    b->fusion_short = !ok;
    return ok;
}

/* This rank's flags and bits for the agreement: cache hits pending here, invalidations. */
static uint32_t prepare_bits(rt_cycle *b, bool shut, int64_t now) {
    for (int s = 0; s < b->cache.capacity; s++) {
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (!e && b->joined && rt_cache_name(&b->cache, s)) {
            /* A joined rank is ready for every cached allreduce it can stand in for. (The
             * last rank to join is not joined yet in the cycle whose negotiation completes
             * the join, so at least one rank sets only the bits of its own tensors.) Any other
             * cached name leaves the cache, so that the coordinator fails it if the others
             * submit it while this rank is joined. */
            const rt_params *p = rt_cache_params(&b->cache, s);
            bool can = p->optype == RT_ALLREDUCE && (!p->on_device || b->join_device >= 0);
            (can ? b->hit : b->bad)[s / 64] |= 1ull << (s % 64);
        }
        if (!e) continue;
        b->hit[s / 64] |= 1ull << (s % 64);
        if (b->evict_ns > 0 && e->partial_since_ns && now - e->partial_since_ns > b->evict_ns)
            b->bad[s / 64] |= 1ull << (s % 64);
    }
    uint32_t flags = 0;
    if (shut) flags |= RT_FLAG_SHUTDOWN;
    if (b->unsent.n) flags |= RT_FLAG_UNCACHED;
    rt_controller_tick(&b->ctl, now);
    if (rt_controller_has_backlog(&b->ctl)) flags |= RT_FLAG_COORD_WORK;
    if (!b->broken.code && !reserve_fusion(b)) flags |= RT_FLAG_NO_FUSION;
    if (b->broken.code) flags |= RT_FLAG_BROKEN;
    return flags;
}

/* Ends the runtime on every rank after a rank reported RT_FLAG_BROKEN. */
static bool end_broken(rt_cycle *b) {
    hvd_err why = {0};
    rt_controller_share_failure(&b->ctl, &b->broken, &why);
    return end(b, HVD_E_INTERNAL, why.msg);
}

static bool bit(const uint64_t *v, int i) {
    return (v[i / 64] >> (i % 64)) & 1u;
}

/* ---- 3. and 4. the cache --------------------------------------------------------------------- */

/* Step 3: slots some rank invalidated are dropped everywhere; entries waiting on them go to
 * the coordinator. Returns whether there were any. */
static bool apply_invalidations(rt_cycle *b, const rt_bits_result *bits) {
    bool any_bad = false;
    for (int s = 0; s < b->cache.capacity; s++) {
        if (!bit(bits->or_bad, s)) continue;
        any_bad = true;
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (e) to_unsent(b, e);
        rt_cache_erase(&b->cache, s);
    }
    return any_bad;
}

/* Step 4: slots pending on every rank are ready, in slot order (the same everywhere). */
static void take_cache_hits(rt_cycle *b, const rt_bits_result *bits, int64_t now) {
    for (int s = 0; s < b->cache.capacity; s++) {
        rt_entry *e = rt_cache_user(&b->cache, s);
        if (!e && b->joined && bit(bits->and_hit, s) && rt_cache_name(&b->cache, s)) {
            if (!push_stand_in(b, rt_cache_name(&b->cache, s), rt_cache_params(&b->cache, s)))
                b->standin_short = true;
            rt_cache_touch(&b->cache, s);
        }
        if (!e) continue;
        if (bit(bits->and_hit, s)) {
            rt_cache_set_user(&b->cache, s, NULL);
            rt_cache_touch(&b->cache, s);
            vec_push(b, &b->run, e);
        } else if (!e->partial_since_ns) {
            e->partial_since_ns = now;
        }
    }
    b->stats.cached_responses += b->run.n;
}

/* ---- 5. and 6. negotiation ------------------------------------------------------------------- */

/* Step 5: a full negotiation when anyone has something the coordinator must see. Fills resp.
 * Returns false when it failed and the runtime has ended. */
static bool negotiate(rt_cycle *b, const rt_bits_result *bits, bool any_bad, bool shut,
                      rt_response_list *resp) {
    bool any_shut = bits->flags_or & RT_FLAG_SHUTDOWN;
    if (!any_bad && !(bits->flags_or & (RT_FLAG_UNCACHED | RT_FLAG_SHUTDOWN | RT_FLAG_COORD_WORK)))
        return true;
    /* reqs has room for every pending entry, and these are distinct pending entries. */
    size_t nreq = 0;
    for (size_t i = 0; i < b->unsent.n; i++) {
        rt_entry *e = b->unsent.v[i];
        b->reqs[nreq++] = (rt_request){e->name, e->p};
        e->state = RT_E_SENT;
        if (e->p.optype == RT_JOIN) {
            b->joined = true;
            b->join_device = e->device;
            if (e->device >= 0) b->device = e->device;
        }
    }
    b->unsent.n = 0;
    if (any_shut) {
        /* Also name what waits on the cache, so the coordinator can report it. */
        for (int s = 0; s < b->cache.capacity; s++) {
            rt_entry *e = rt_cache_user(&b->cache, s);
            if (e) b->reqs[nreq++] = (rt_request){e->name, e->p};
        }
    }
    hvd_err err = {0};
    int rc =
        rt_controller_negotiate(&b->ctl, shut ? RT_FLAG_SHUTDOWN : 0, b->reqs, nreq, resp, &err);
    b->stats.full_negotiations++;
    if (rc == RT_NEG_OK) return true;
    if (rc == RT_NEG_ALONE) {
        b->alone = true;
        rt_log("%s; this rank cannot follow the other ranks any more and stops; the job ends "
               "when this process exits",
               err.msg);
    }
    end(b, err.code, err.msg);
    return false;
}

/* Step 6: responses name entries of ours: errors (and a completed join) complete at once, the
 * rest go to b->run, with this rank's stand-ins if it joined. */
static void sort_responses(rt_cycle *b, const rt_response_list *resp) {
    b->failed.n = 0;
    /* Stand-ins take room in run that was reserved for this rank's entries: make room for
     * every response (after the bit vector: if it cannot be had, this rank is alone). */
    if (b->joined && resp->n > 0 && vec_reserve(&b->run, b->run.n + resp->n) != 0)
        b->standin_short = true;
    for (size_t i = 0; i < resp->n; i++) {
        const rt_response *r = &resp->v[i];
        rt_entry *e = rt_strmap_get(&b->pending, r->name);
        /* Ready without this rank: it joined, and stands in. */
        if (!r->error && b->joined && r->p.optype == RT_ALLREDUCE && !e) {
            if (!push_stand_in(b, r->name, &r->p)) b->standin_short = true;
            continue;
        }
        if (!e) {
            /* A stall error for a name this rank never submitted: nothing to fail here. */
            if (!r->error)
                rt_log("internal error: the coordinator scheduled '%s', which this rank does "
                       "not have pending",
                       r->name);
            continue;
        }
        /* An entry not yet sent cannot be what the coordinator decided about (it can only be
         * a stall error for earlier submissions of the name on other ranks). */
        if (e->state == RT_E_UNSENT) continue;
        if (e->state == RT_E_CACHED) {
            rt_cache_set_user(&b->cache, e->cache_slot, NULL);
            e->cache_slot = -1;
        }
        if (r->error) {
            if (b->rank == 0) rt_timeline_negotiate_end(b->tl, e->name);
            rt_entry_fail(e, r->code, r->error);
            vec_push(b, &b->failed, e);
        } else if (e->p.optype == RT_JOIN) {
            /* Every rank joined; nothing to run. It completes with the failures. */
            if (b->rank == 0) rt_timeline_negotiate_end(b->tl, e->name);
            *(int32_t *)e->out = r->p.root;
            b->joined = false;
            b->join_device = HVD_DEVICE_CPU;
            vec_push(b, &b->failed, e);
        } else {
            vec_push(b, &b->run, e);
            b->stats.negotiated_responses++;
        }
    }
    complete(b, b->failed.v, b->failed.n);
    b->failed.n = 0;
}

/* ---- 7. and 8. execution ------------------------------------------------------------------- */

static void timeline_queued(rt_cycle *b) {
    if (!b->tl) return;
    for (size_t i = 0; i < b->run.n; i++) {
        rt_timeline_negotiate_end(b->tl, b->run.v[i]->name);
        rt_timeline_start(b->tl, b->run.v[i]->name, rt_optype_upper_name(b->run.v[i]->p.optype));
        rt_timeline_start(b->tl, b->run.v[i]->name, "QUEUE");
    }
}

/* Runs one group on its backend; its entries fail with the backend's error. */
static void execute_group(rt_cycle *b, rt_group *grp) {
    for (size_t k = 0; k < grp->n; k++)
        rt_timeline_end(b->tl, grp->entries[k]->name);
    hvd_err err = {0};
    int rc;
    if (grp->p.on_device) {
#ifdef HVD_HAVE_NCCL
        rc = rt_nccl_execute(&b->exec, grp, &err);
#else
        rc = hvd_err_set(&err, HVD_E_STATE, "built without NCCL: device buffers are unsupported");
#endif
    } else {
        rc = rt_mpi_execute(&b->exec, grp, &err);
    }
    if (rc != 0)
        for (size_t k = 0; k < grp->n; k++)
            rt_entry_fail(grp->entries[k], err.code, err.msg);
    for (size_t k = 0; k < grp->n; k++)
        rt_timeline_end(b->tl, grp->entries[k]->name);
    b->stats.collective_calls++;
    if (grp->n > 1) b->stats.fused_calls++;
}

/* Step 7: fuses the agreed entries and executes the groups in order. Returns false if the
 * plan could not be made (cannot happen: its room was reserved before the bit vector), in
 * which case this rank cannot follow the others. */
static bool execute(rt_cycle *b, bool no_fusion) {
    if (b->run.n == 0) return true;
    timeline_queued(b);
    int64_t threshold = no_fusion ? 0 : b->cfg.fusion_threshold;
    if (rt_fusion_plan(b->run.v, b->run.n, threshold, &b->groups) != 0) return false;
    for (size_t i = 0; i < b->groups.n; i++)
        execute_group(b, &b->groups.v[i]);
    return true;
}

/* Says once, on rank 0, when the cache churns more than it serves: in a window that ends once
 * a whole cache's worth of names came back after the cache had evicted them, fewer names were
 * taken from the cache than came back. A step then submits more names than there are slots,
 * and each of them is negotiated in full every time (docs/runtime.md, "Knobs"). Names that
 * come back now and then (an evaluation every few hundred steps) leave the cache serving far
 * more than that. */
static void warn_cache_small(rt_cycle *b) {
    if (b->cache_small || b->rank != 0 || b->cache.capacity <= 0) return;
    int64_t back = rt_cache_returned(&b->cache) - b->cache_window_back;
    if (back < b->cache.capacity) return;
    uint64_t hits = b->stats.cached_responses - b->cache_window_hits;
    b->cache_window_back = rt_cache_returned(&b->cache);
    b->cache_window_hits = b->stats.cached_responses;
    if (hits >= (uint64_t)back) return;
    b->cache_small = true;
    rt_log("the response cache is too small for this job: %lld tensor names were submitted "
           "again after it had evicted them, while it served %llu (HOROVOD_CACHE_CAPACITY=%d "
           "slots), so they are negotiated in full every time; set HOROVOD_CACHE_CAPACITY above "
           "the number of tensors submitted per step",
           (long long)back, (unsigned long long)hits, b->cache.capacity);
}

/* Step 8: remember the negotiated names (from first_negotiated on, in the agreed order, so
 * slots match on all ranks). The cache takes over the name the pending map held, so this
 * allocates nothing. */
static void remember(rt_cycle *b, size_t first_negotiated) {
    for (size_t i = first_negotiated; i < b->run.n; i++) {
        rt_entry *e = b->run.v[i];
        if (e->status != 0) continue;
        char *key;
        if (e->stand_in) { /* cached like the others' entries, so slots match on every rank */
            key = e->name;
            e->name = NULL;
        } else {
            if (!rt_strmap_take(&b->pending, e->name, &key)) continue;
            count_fusable(b, e, -1);
        }
        void *evicted = NULL;
        rt_cache_put(&b->cache, key, &e->p, &evicted);
        if (evicted) to_unsent(b, evicted);
    }
    warn_cache_small(b);
}

/* ---- one cycle --------------------------------------------------------------------------- */

bool rt_cycle_run(rt_cycle *b) {
    bool shut = drain(b);
    int64_t now = hvd_now_ns();
    uint32_t flags = prepare_bits(b, shut, now);

    int64_t t_neg = hvd_now_ns();
    rt_bits_result bits;
    hvd_err err = {0};
    if (rt_controller_sync_bits(&b->ctl, flags, b->hit, b->bad, &bits, &err) != 0)
        return end(b, err.code, err.msg);
    if (bits.flags_or & RT_FLAG_BROKEN) return end_broken(b);

    b->run.n = 0;
    bool any_bad = apply_invalidations(b, &bits);
    take_cache_hits(b, &bits, now);
    size_t ncached = b->run.n;
    rt_response_list resp = {0};
    if (!negotiate(b, &bits, any_bad, shut, &resp)) {
        rt_responses_free(&resp);
        return true;
    }
    uint64_t neg_ns = (uint64_t)(hvd_now_ns() - t_neg);
    b->stats.negotiation_ns += neg_ns;
    if (b->run.n > 0 || resp.n > 0) {
        b->stats.busy_cycles++;
        b->stats.busy_negotiation_ns += neg_ns;
    }
    sort_responses(b, &resp);
    rt_responses_free(&resp);
    if (b->standin_short || !arm_stand_ins(b)) {
        b->alone = true;
        return end(b, HVD_E_INTERNAL,
                   "this rank joined and ran out of memory for the zeros it stands in with for "
                   "the other ranks' allreduces; it cannot follow them any more");
    }

    if (!execute(b, bits.flags_or & RT_FLAG_NO_FUSION)) {
        b->alone = true;
        return end(b, HVD_E_INTERNAL, "internal error: the fusion plan had no room reserved");
    }
    remember(b, ncached);
    free_stand_ins(b);
    complete(b, b->run.v, b->run.n);
    b->run.n = 0;
    if (b->tl) rt_timeline_flush(b->tl);

    b->stats.cycles++;
    b->stats.stall_warnings = b->ctl.stall.warnings;
    rt_state_publish(&b->stats);

    if (bits.flags_or & RT_FLAG_SHUTDOWN) {
        /* Everything the coordinator knew has been failed with a precise message; entries
         * that arrived after this cycle's drain get the general one. */
        return end(b, HVD_E_SHUTDOWN,
                   shut ? "hvd_shutdown was called on this rank"
                        : "another rank called hvd_shutdown");
    }
    return false;
}
