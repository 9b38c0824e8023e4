/* Unit tests of the runtime's pieces that need no MPI job: f16/bf16 conversion, reduction
 * and scaling kernels, the string map, the response cache, the negotiation message codec and
 * the fusion planner. */
#include "../../runtime/controller.h"
#include "../../runtime/fusion.h"
#include "../../runtime/message.h"
#include "../../runtime/response_cache.h"
#include "../../runtime/strmap.h"
#include "../../runtime/types.h"
#include "rt_testlib.h"

static void test_half_conversions(void) {
    /* Every binary16 value decodes like the independent decoder, and encodes back. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = tl_f16_decode((uint16_t)h);
        float got = hvd_f16_to_float((uint16_t)h);
        if (isnan(want) ? !isnan(got) : (double)got != want) bad++;
        if (!isnan(want) && hvd_float_to_f16(got) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d binary16 round-trip failures", bad);
    bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        double want = tl_bf16_decode((uint16_t)b);
        float got = hvd_bf16_to_float((uint16_t)b);
        if (isnan(want) ? !isnan(got) : (double)got != want) bad++;
        if (!isnan(want) && hvd_float_to_bf16(got) != b) bad++;
    }
    CHECK_MSG(bad == 0, "%d bfloat16 round-trip failures", bad);
    /* Rounding: ties to even, overflow to infinity, underflow to zero. */
    CHECK(hvd_float_to_f16(1.0f + 1.0f / 2048) == 0x3c00);      /* tie -> even (down) */
    CHECK(hvd_float_to_f16(1.0f + 3.0f / 2048) == 0x3c02);      /* tie -> even (up) */
    CHECK(hvd_float_to_f16(65520.0f) == 0x7c00);                /* rounds to inf */
    CHECK(hvd_float_to_f16(65519.0f) == 0x7bff);                /* max finite */
    CHECK(hvd_float_to_f16(1e-9f) == 0);                        /* below half subnormal */
    CHECK(hvd_float_to_f16(-5.9604644775390625e-8f) == 0x8001); /* smallest subnormal */
    CHECK(hvd_float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);      /* tie -> even */
    CHECK(hvd_float_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
    CHECK(isnan(hvd_bf16_to_float(hvd_float_to_bf16(NAN))));
    CHECK(isnan(hvd_f16_to_float(hvd_float_to_f16(NAN))));
    CHECK(hvd_dtype_size(HVD_BFLOAT16) == 2 && hvd_dtype_size((hvd_dtype)99) == 0);
    CHECK(strcmp(hvd_dtype_name(HVD_FLOAT16), "float16") == 0);
    CHECK(strcmp(hvd_reduce_op_name(HVD_OP_PRODUCT), "product") == 0);
}

static void test_reduce_kernels(void) {
    for (int d = 0; d < HVD_NUM_DTYPES; d++) {
        hvd_dtype t = all_dtypes[d];
        for (int op = HVD_OP_SUM; op <= HVD_OP_PRODUCT; op++) {
            double a[6] = {1, -2, 3, 0, 4, -1}, b[6] = {2, 2, -3, 5, 0.5, -1};
            if (t == HVD_UINT8)
                for (int i = 0; i < 6; i++)
                    a[i] = fabs(a[i]), b[i] = fabs(b[i]);
            if (!tl_is_float(t)) b[4] = 1;
            unsigned char x[48], y[48];
            for (int i = 0; i < 6; i++)
                tl_set(x, t, i, a[i]), tl_set(y, t, i, b[i]);
            rt_reduce(x, y, 6, t, (hvd_reduce_op)op);
            double want[6];
            for (int i = 0; i < 6; i++) {
                double p = tl_get(y, t, i), q = a[i];
                switch (op) {
                case HVD_OP_MIN:
                    want[i] = p < q ? p : q;
                    break;
                case HVD_OP_MAX:
                    want[i] = p > q ? p : q;
                    break;
                case HVD_OP_PRODUCT:
                    want[i] = p * q;
                    break;
                default:
                    want[i] = p + q;
                }
            }
            CHECK(tl_check_array(hvd_reduce_op_name((hvd_reduce_op)op), x, t, want, 6));
        }
    }
    /* Integer sums wrap like MPI's instead of invoking undefined behaviour. */
    int8_t p = 127, q = 1;
    rt_reduce(&p, &q, 1, HVD_INT8, HVD_OP_SUM);
    CHECK(p == -128);
}

static void test_scaling(void) {
    int32_t v[4] = {7, -7, 2000000000, -3};
    rt_scale(v, 4, HVD_INT32, 1.5);
    CHECK(v[0] == 10 && v[1] == -10 && v[2] == 2147483647 && v[3] == -4); /* trunc, saturate */
    uint8_t u[2] = {200, 3};
    rt_scale(u, 2, HVD_UINT8, -1.0);
    CHECK(u[0] == 0 && u[1] == 0);
    int64_t w[3] = {7, -7, 8};
    rt_finish_reduction(w, 3, HVD_INT64, HVD_OP_AVERAGE, 2, 1.0);
    CHECK(w[0] == 3 && w[1] == -3 && w[2] == 4); /* average truncates toward zero */
    float f[2] = {3, 5};
    rt_finish_reduction(f, 2, HVD_FLOAT32, HVD_OP_AVERAGE, 4, 2.0);
    CHECK(f[0] == 1.5f && f[1] == 2.5f);
    uint16_t h[1] = {hvd_float_to_f16(3.0f)};
    rt_scale(h, 1, HVD_FLOAT16, 0.5);
    CHECK(hvd_f16_to_float(h[0]) == 1.5f);
}

/* float32 and float64 scaling, vectorised, give every element exactly what one scalar
 * multiplication gives (float32: the double product rounded to float): factors that are floats
 * (the float path), that are not, and a subnormal one; every length up to 40 and the last
 * vector's worth below N; values across the range (subnormals, overflow to infinity, NaN,
 * signed zero). */
static void test_scaling_bits(void) {
    enum { N = 1037 };
    static float a[N], ref[N], b[N];
    static double d[N], dref[N], e[N];
    const double factors[] = {0.5, 0.25, 1.0 / 3.0, 0.1, (double)0.1f, 1e30, 3.0, -0.125, 1e-40};
    uint32_t x = 12345;
    int bad = 0;
    for (size_t k = 0; k < sizeof factors / sizeof factors[0]; k++) {
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            uint32_t bits = x;
            memcpy(&a[i], &bits, 4); /* any bit pattern: subnormals, infinities, NaNs */
            x = x * 1664525u + 1013904223u;
            d[i] = ldexp((double)a[i], (int)(x >> 21) % 1800 - 900); /* exponents all over */
        }
        a[0] = 1e-45f;
        a[1] = -0.0f;
        d[0] = 4.9e-324;
        d[1] = 1.7e308;
        for (int i = 0; i < N; i++) {
            ref[i] = (float)((double)a[i] * factors[k]);
            dref[i] = d[i] * factors[k];
        }
        for (int n = 0; n <= N; n = n < 40 ? n + 1 : n < N - 8 ? N - 8 : n + 1) {
            memcpy(b, a, sizeof b);
            memcpy(e, d, sizeof e);
            rt_scale(b, n, HVD_FLOAT32, factors[k]);
            rt_scale(e, n, HVD_FLOAT64, factors[k]);
            for (int i = 0; i < N; i++) {
                float fw = i < n ? ref[i] : a[i];
                double dw = i < n ? dref[i] : d[i];
                bool same_f = memcmp(&b[i], &fw, 4) == 0 || (isnan(b[i]) && isnan(fw));
                bool same_d = memcmp(&e[i], &dw, 8) == 0 || (isnan(e[i]) && isnan(dw));
                if ((!same_f || !same_d) && bad++ < 3)
                    fprintf(stderr,
                            "factor %g, n %d, [%d]: float %a (want %a), double %a (want %a)\n",
                            factors[k], n, i, (double)b[i], (double)fw, e[i], dw);
            }
        }
    }
    CHECK_MSG(bad == 0, "%d elements differ", bad);
}

static void test_strmap(void) {
    rt_strmap m;
    rt_strmap_init(&m);
    char key[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK(rt_strmap_put(&m, key, (void *)(intptr_t)(i + 1)) == 0);
    }
    CHECK(m.count == 5000);
    /* Delete every third key; the rest must stay reachable (backward-shift deletion). */
    for (int i = 0; i < 5000; i += 3) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK(rt_strmap_del(&m, key) == (void *)(intptr_t)(i + 1));
    }
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        void *v = rt_strmap_get(&m, key);
        if (i % 3 == 0 ? v != NULL : v != (void *)(intptr_t)(i + 1)) bad++;
    }
    CHECK(bad == 0);
    size_t pos = 0, n = 0;
    while (rt_strmap_next(&m, &pos, NULL, NULL) >= 0)
        n++;
    CHECK(n == m.count);
    CHECK(rt_strmap_del(&m, "absent") == NULL);
    /* take hands the stored key over; put_owned adopts one (and frees it on a replace). */
    char *stored = NULL;
    CHECK(rt_strmap_take(&m, "k1", &stored) == (void *)(intptr_t)2 && stored &&
          strcmp(stored, "k1") == 0);
    CHECK(rt_strmap_get(&m, "k1") == NULL);
    CHECK(rt_strmap_put_owned(&m, stored, (void *)(intptr_t)7) == 0);
    CHECK(rt_strmap_get(&m, "k1") == (void *)(intptr_t)7);
    CHECK(rt_strmap_put_owned(&m, strdup("k1"), (void *)(intptr_t)8) == 0);
    CHECK(rt_strmap_get(&m, "k1") == (void *)(intptr_t)8);
    /* A reserved map takes that many entries without growing. */
    rt_strmap r;
    rt_strmap_init(&r);
    CHECK(rt_strmap_reserve(&r, 100) == 0);
    size_t cap = r.capacity;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "r%d", i);
        CHECK(rt_strmap_put(&r, key, NULL) == 0);
    }
    CHECK(r.capacity == cap && r.count == 100);
    rt_strmap_free(&r);
    rt_strmap_free(&m);
}

static rt_params mkp(int64_t count) {
    rt_params p = {0};
    p.optype = RT_ALLREDUCE;
    p.dtype = HVD_FLOAT32;
    p.count = count;
    p.row_elems = 1;
    p.prescale = p.postscale = 1;
    return p;
}

/* Names that come back after their eviction are counted (a cache too small for a step), for
 * RT_CACHE_GONE_WINDOW x capacity evictions at least; names never seen again are not. */
static void cache_see(rt_cache *c, const char *name) {
    void *ev;
    int s = rt_cache_lookup(c, name);
    if (s >= 0)
        rt_cache_touch(c, s);
    else
        rt_cache_put(c, strdup(name), &(rt_params){0}, &ev);
}

static void test_cache_returned(void) {
    rt_cache c;
    char name[32];
    CHECK(rt_cache_init(&c, 4) == 0);
    /* Three steps of 6 names through 4 slots: from the second step on, LRU has evicted each
     * name before it comes back. */
    for (int step = 0; step < 3; step++)
        for (int k = 0; k < 6; k++) {
            snprintf(name, sizeof name, "t.%d", k);
            cache_see(&c, name);
        }
    CHECK_MSG(rt_cache_returned(&c) == 12, "%lld returned", (long long)rt_cache_returned(&c));
    rt_cache_free(&c);

    CHECK(rt_cache_init(&c, 4) == 0);
    for (int k = 0; k < 10000; k++) { /* new names every time: none comes back */
        snprintf(name, sizeof name, "fresh.%d", k);
        cache_see(&c, name);
    }
    CHECK_MSG(rt_cache_returned(&c) == 0, "%lld returned", (long long)rt_cache_returned(&c));
    cache_see(&c, "fresh.0"); /* evicted 9996 evictions ago: forgotten */
    CHECK(rt_cache_returned(&c) == 0);
    /* 9997 evictions so far; the one of eviction 9997 - RT_CACHE_GONE_WINDOW x capacity + 1
     * (the window's oldest) is still remembered. */
    snprintf(name, sizeof name, "fresh.%d", 9997 - RT_CACHE_GONE_WINDOW * 4);
    cache_see(&c, name);
    CHECK_MSG(rt_cache_returned(&c) == 1, "%lld returned", (long long)rt_cache_returned(&c));
    rt_cache_free(&c);
}

static void test_cache(void) {
    /* Two caches fed the same sequence agree on every slot (what the bit vector relies on),
     * and eviction is least-recently-used. */
    rt_cache a, b;
    CHECK(rt_cache_init(&a, 3) == 0);
    CHECK(rt_cache_init(&b, 3) == 0);
    const char *seq[] = {"x", "y", "z", "x", "w", "y", "v"};
    void *ev;
    int entry = 42;
    for (size_t i = 0; i < 7; i++) {
        int sa = rt_cache_lookup(&a, seq[i]);
        if (sa >= 0)
            rt_cache_touch(&a, sa);
        else
            sa = rt_cache_put(&a, strdup(seq[i]), &(rt_params){0}, &ev);
        int sb = rt_cache_lookup(&b, seq[i]);
        if (sb >= 0)
            rt_cache_touch(&b, sb);
        else
            sb = rt_cache_put(&b, strdup(seq[i]), &(rt_params){0}, &ev);
        CHECK(sa == sb && sa >= 0 && sa < 3);
    }
    /* x,y,z -> touch x -> w evicts y (LRU: y) -> y evicts z -> v evicts x */
    CHECK(rt_cache_lookup(&a, "w") >= 0 && rt_cache_lookup(&a, "y") >= 0 &&
          rt_cache_lookup(&a, "v") >= 0);
    CHECK(rt_cache_lookup(&a, "x") < 0 && rt_cache_lookup(&a, "z") < 0);
    /* The user pointer of an evicted slot comes back to the caller. */
    int s = rt_cache_lookup(&a, "w");
    rt_cache_set_user(&a, s, &entry);
    rt_cache_touch(&a, rt_cache_lookup(&a, "y"));
    rt_cache_touch(&a, rt_cache_lookup(&a, "v"));
    rt_params p = mkp(10);
    int s2 = rt_cache_put(&a, strdup("new"), &p, &ev);
    CHECK(ev == &entry && s2 == s);
    CHECK(rt_params_equal(rt_cache_params(&a, s2), &p));
    CHECK(strcmp(rt_cache_name(&a, s2), "new") == 0);
    rt_cache_erase(&a, s2);
    CHECK(rt_cache_lookup(&a, "new") < 0);
    rt_cache_free(&a);
    rt_cache_free(&b);
    /* Capacity 0 disables the cache. */
    rt_cache z;
    CHECK(rt_cache_init(&z, 0) == 0);
    CHECK(rt_cache_put(&z, strdup("a"), &p, &ev) == -1 && rt_cache_lookup(&z, "a") == -1);
    rt_cache_free(&z);
}

static void test_codec(void) {
    rt_request reqs[3] = {{"grad/w", mkp(7)}, {"grad/b", mkp(0)}, {"x", mkp(1)}};
    reqs[1].p.optype = RT_BROADCAST;
    reqs[1].p.root = 3;
    reqs[2].p.prescale = 0.25;
    hvd_buf b = {0};
    CHECK(rt_encode_requests(&b, RT_FLAG_SHUTDOWN, reqs, 3) == 0);
    uint32_t flags;
    rt_request *got;
    size_t n;
    hvd_err err = {0};
    CHECK(rt_decode_requests(b.data, b.len, &flags, &got, &n, &err) == 0);
    CHECK(flags == RT_FLAG_SHUTDOWN && n == 3);
    for (size_t i = 0; i < n && i < 3; i++) {
        CHECK(strcmp(got[i].name, reqs[i].name) == 0);
        CHECK(rt_params_equal(&got[i].p, &reqs[i].p));
    }
    free(got);
    /* Every truncation is rejected, as is a byte flipped into an invalid type. */
    int accepted = 0;
    for (size_t cut = 0; cut < b.len; cut++)
        if (rt_decode_requests(b.data, cut, &flags, &got, &n, &err) == 0) accepted++, free(got);
    CHECK(accepted == 0);
    /* header 9 bytes, name length 2, "grad/w" and its NUL 7, optype 1, then dtype */
    b.data[9 + 2 + 7 + 1] = 200;
    CHECK(rt_decode_requests(b.data, b.len, &flags, &got, &n, &err) == -1);
    /* A count claiming more requests than the bytes can hold is refused before allocating. */
    uint8_t huge[9] = {1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f};
    CHECK(rt_decode_requests(huge, sizeof huge, &flags, &got, &n, &err) == -1);

    rt_response_list l = {0}, back = {0};
    rt_params p = mkp(5);
    CHECK(rt_responses_push(&l, "a", &p, NULL, 0) == 0);
    CHECK(rt_responses_push(&l, "b", NULL, "tensor 'b' mismatched", HVD_E_INVALID) == 0);
    CHECK(rt_encode_responses(&b, &l) == 0);
    CHECK(rt_decode_responses(b.data, b.len, &back, &err) == 0);
    CHECK(back.n == 2);
    if (back.n == 2) {
        CHECK(strcmp(back.v[0].name, "a") == 0 && !back.v[0].error &&
              rt_params_equal(&back.v[0].p, &p));
        CHECK(strcmp(back.v[1].error, "tensor 'b' mismatched") == 0 &&
              back.v[1].code == HVD_E_INVALID);
    }
    rt_responses_free(&back);
    CHECK(rt_decode_responses(b.data, b.len - 1, &back, &err) == -1);
    rt_responses_free(&back);
    rt_responses_free(&l);
    hvd_buf_free(&b);
}

static void test_fusion_plan(void) {
    /* 10 float32 allreduces of 100 elements (400 B), a broadcast in the middle, two int32
     * allreduces and one too big to fuse; threshold 1000 B fits 2 float tensors per group. */
    rt_entry e[14];
    rt_entry *v[14];
    memset(e, 0, sizeof e);
    for (int i = 0; i < 14; i++) {
        e[i].p = mkp(100);
        v[i] = &e[i];
    }
    e[5].p.optype = RT_BROADCAST;
    e[11].p.dtype = e[12].p.dtype = HVD_INT32;
    e[13].p.count = 1000;
    rt_group_list gl = {0};
    CHECK(rt_fusion_plan(v, 14, 1000, &gl) == 0);
    size_t members = 0;
    int fused = 0;
    for (size_t i = 0; i < gl.n; i++) {
        members += gl.v[i].n;
        if (gl.v[i].n > 1) fused++;
        int64_t bytes = 0;
        for (size_t k = 0; k < gl.v[i].n; k++) {
            bytes += gl.v[i].entries[k]->p.count * 4;
            CHECK(gl.v[i].entries[k]->p.dtype == gl.v[i].p.dtype);
        }
        CHECK(gl.v[i].n == 1 || bytes <= 1000);
    }
    CHECK(members == 14);
    /* float32 x100: e[0..4] and e[6..10], ten of them, two per group */
    CHECK(gl.n == 5 /* float pairs */ + 1 /* bcast */ + 1 /* int32 pair */ + 1 /* big */);
    CHECK(fused == 6);
    /* Members keep the agreed order inside each group, and groups are in order of their first
     * member: e[0], e[1] fuse; e[2], e[3]; e[4] is followed by the broadcast, then e[6]... */
    CHECK(gl.v[0].n == 2 && gl.v[0].entries[0] == &e[0] && gl.v[0].entries[1] == &e[1]);
    CHECK(gl.v[2].n == 2 && gl.v[2].entries[0] == &e[4] && gl.v[2].entries[1] == &e[6]);
    CHECK(gl.v[3].n == 1 && gl.v[3].entries[0] == &e[5]);
    rt_group_list_free(&gl);
    /* Threshold 0 disables fusion; a reserved list plans that many entries. */
    CHECK(rt_fusion_reserve(&gl, 14) == 0);
    CHECK(rt_fusion_plan(v, 14, 0, &gl) == 0);
    CHECK(gl.n == 14);
    rt_group_list_free(&gl);
    /* Host allreduces of RT_FUSION_HOST_ALONE_BYTES or more run alone however high the
     * threshold; device ones of that size still fuse, and so do smaller host ones. */
    int64_t big = RT_FUSION_HOST_ALONE_BYTES / 4; /* float32 elements */
    e[0].p = mkp(big);
    e[1].p = mkp(big);
    e[2].p = mkp(big - 1);
    e[3].p = mkp(big - 1);
    e[4].p = mkp(big);
    e[5].p = mkp(big);
    e[4].p.on_device = e[5].p.on_device = true;
    CHECK(rt_fusion_plan(v, 6, (int64_t)1 << 30, &gl) == 0);
    CHECK(gl.n == 4);
    CHECK(gl.v[0].n == 1 && gl.v[0].entries[0] == &e[0]);
    CHECK(gl.v[1].n == 1 && gl.v[1].entries[0] == &e[1]);
    CHECK(gl.v[2].n == 2 && gl.v[2].entries[0] == &e[2] && gl.v[2].entries[1] == &e[3]);
    CHECK(gl.v[3].n == 2 && gl.v[3].entries[0] == &e[4] && gl.v[3].entries[1] == &e[5]);
    CHECK(rt_entry_fusable_bytes(&e[0], (int64_t)1 << 30) == 0);
    CHECK(rt_entry_fusable_bytes(&e[2], (int64_t)1 << 30) == (big - 1) * 4);
    rt_group_list_free(&gl);
}

int main(void) {
    RUN(test_half_conversions);
    RUN(test_reduce_kernels);
    RUN(test_scaling);
    RUN(test_scaling_bits);
    RUN(test_strmap);
    RUN(test_cache);
    RUN(test_cache_returned);
    RUN(test_codec);
    RUN(test_fusion_plan);
    return test_finish();
}
