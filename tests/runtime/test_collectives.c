/* Every collective x every type x sizes (0, 1, odd, large) under real mpirun, against
 * references each rank computes on its own from the formula that generated every rank's
 * input. Run with -np 1..4. Round 1 submits everything asynchronously at once (fusion, many
 * names in one negotiation); round 2 repeats the same names (response cache); round 3 runs a
 * subset one synchronous call at a time (unfused paths). */
#include <stdbool.h>

#include "rt_testlib.h"

static const int64_t sizes[] = {0, 1, 7, 33, 1025, 65537};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

static int g_rank, g_size;

/* Input value of element i of tensor t on rank r. Small integers (and halves for floats), so
 * sums over 4 ranks are exact in every type, f16 and bf16 included. */
static double val(int r, int t, int64_t i, hvd_dtype dt) {
    double v = (double)((r * 7 + i * 3 + t * 5) % 9) - 4;
    if (dt == HVD_UINT8) v += 4;
    if (tl_is_float(dt) && (i + r) % 2) v += 0.5;
    return v;
}

/* Inputs for PRODUCT: 1 or 2, with a sign flip on rank 0 now and then, so products stay
 * small and exact. */
static double pval(int r, int t, int64_t i, hvd_dtype dt) {
    double v = ((r + i + t) % 3 == 0) ? 2 : 1;
    if (dt != HVD_UINT8 && r == 0 && (i + t) % 5 == 0) v = -v;
    return v;
}

typedef enum kind { K_ALLREDUCE, K_SCALED, K_ALLGATHER, K_BCAST, K_ALLTOALL, K_RS } kind;

typedef struct tcase {
    kind k;
    hvd_dtype dt;
    hvd_reduce_op op;
    int64_t n; /* size parameter */
    int t;     /* tensor id (varies the data) */
    char name[96];
    void *in, *out;
    hvd_output res;
    hvd_handle h;
    int64_t *splits;
} tcase;

static double reduce_ref(hvd_reduce_op op, hvd_dtype dt, int t, int64_t i) {
    double acc = 0;
    for (int r = 0; r < g_size; r++) {
        double v = op == HVD_OP_PRODUCT ? pval(r, t, i, dt) : val(r, t, i, dt);
        if (r == 0) {
            acc = v;
            continue;
        }
        switch (op) {
        case HVD_OP_SUM:
        case HVD_OP_AVERAGE:
            acc += v;
            break;
        case HVD_OP_MIN:
            acc = v < acc ? v : acc;
            break;
        case HVD_OP_MAX:
            acc = v > acc ? v : acc;
            break;
        case HVD_OP_PRODUCT:
            acc *= v;
            break;
        }
    }
    if (op == HVD_OP_AVERAGE) {
        if (tl_is_float(dt))
            acc /= g_size;
        else
            acc = (double)((int64_t)acc / g_size); /* integer average truncates */
    }
    return acc;
}

static void fill(void *buf, hvd_dtype dt, int r, int t, int64_t n, bool product) {
    for (int64_t i = 0; i < n; i++)
        tl_set(buf, dt, i, product ? pval(r, t, i, dt) : val(r, t, i, dt));
}

/* Split of rank s's rows to rank d in the alltoall of tensor t with size parameter n. */
static int64_t a2a_split(int s, int d, int t, int64_t n) {
    return ((s + d + t) % 3) * n;
}

static int64_t ag_rows(int r, int t, int64_t n) {
    return ((r + t) % 3) * n;
}

#define ROW 2 /* row_elems for the row-shaped collectives */

static void submit(tcase *c, bool sync) {
    hvd_err err = {0};
    int rc = 0;
    size_t es = tl_esize(c->dt);
    switch (c->k) {
    case K_ALLREDUCE:
    case K_SCALED:
        c->in = malloc((size_t)c->n * es + 1);
        c->out = malloc((size_t)c->n * es + 1);
        fill(c->in, c->dt, g_rank, c->t, c->n, c->op == HVD_OP_PRODUCT);
        if (c->k == K_ALLREDUCE) {
            rc = sync ? hvd_allreduce(c->name, c->in, c->out, c->n, c->dt, c->op, HVD_DEVICE_CPU,
                                      &err)
                      : hvd_allreduce_async(c->name, c->in, c->out, c->n, c->dt, c->op,
                                            HVD_DEVICE_CPU, &c->h, &err);
        } else {
            /* ints: x2 then /2 stays exact; floats: arbitrary factors. */
            double pre = tl_is_float(c->dt) ? 0.5 : 2.0, post = tl_is_float(c->dt) ? 3.0 : 0.5;
            /* in place, to cover that path too */
            memcpy(c->out, c->in, (size_t)c->n * es);
            rc = hvd_allreduce_scaled_async(c->name, c->out, c->out, c->n, c->dt, c->op, pre, post,
                                            HVD_DEVICE_CPU, &c->h, &err);
            if (rc == 0 && sync) rc = hvd_wait(c->h, &err);
        }
        break;
    case K_ALLGATHER: {
        int64_t rows = ag_rows(g_rank, c->t, c->n);
        c->in = malloc((size_t)(rows * ROW) * es + 1);
        fill(c->in, c->dt, g_rank, c->t, rows * ROW, false);
        rc = sync ? hvd_allgather(c->name, c->in, rows, ROW, c->dt, HVD_DEVICE_CPU, &c->res, &err)
                  : hvd_allgather_async(c->name, c->in, rows, ROW, c->dt, HVD_DEVICE_CPU, &c->res,
                                        &c->h, &err);
        break;
    }
    case K_BCAST: {
        int root = c->t % g_size;
        c->out = malloc((size_t)c->n * es + 1);
        if (g_rank == root)
            fill(c->out, c->dt, g_rank, c->t, c->n, false);
        else
            memset(c->out, 0x5a, (size_t)c->n * es); /* garbage that must be overwritten */
        rc = sync ? hvd_broadcast(c->name, c->out, c->n, c->dt, root, HVD_DEVICE_CPU, &err)
                  : hvd_broadcast_async(c->name, c->out, c->n, c->dt, root, HVD_DEVICE_CPU, &c->h,
                                        &err);
        break;
    }
    case K_ALLTOALL: {
        c->splits = malloc((size_t)g_size * sizeof *c->splits);
        int64_t rows = 0;
        for (int d = 0; d < g_size; d++)
            rows += c->splits[d] = a2a_split(g_rank, d, c->t, c->n);
        /* Every other tensor has a row after the splits' sum: not sent (Horovod's splits may
         * sum to less than the first dimension). */
        int64_t first = rows + c->t % 2;
        c->in = malloc((size_t)(first * ROW) * es + 1);
        fill(c->in, c->dt, g_rank, c->t, first * ROW, false);
        rc = sync ? hvd_alltoall(c->name, c->in, first, ROW, c->splits, c->dt, HVD_DEVICE_CPU,
                                 &c->res, &err)
                  : hvd_alltoall_async(c->name, c->in, first, ROW, c->splits, c->dt, HVD_DEVICE_CPU,
                                       &c->res, &c->h, &err);
        break;
    }
    case K_RS: {
        int64_t first = g_size * c->n + c->t % g_size; /* uneven on purpose */
        int64_t mine = hvd_reducescatter_rows(first, g_rank, g_size);
        c->in = malloc((size_t)(first * ROW) * es + 1);
        c->out = malloc((size_t)(mine * ROW) * es + 1);
        fill(c->in, c->dt, g_rank, c->t, first * ROW, c->op == HVD_OP_PRODUCT);
        rc = sync ? hvd_reducescatter(c->name, c->in, c->out, first, ROW, c->dt, c->op,
                                      HVD_DEVICE_CPU, &err)
                  : hvd_reducescatter_async(c->name, c->in, c->out, first, ROW, c->dt, c->op,
                                            HVD_DEVICE_CPU, &c->h, &err);
        break;
    }
    }
    CHECK_MSG(rc == 0, "%s: %s", c->name, err.msg);
}

static void verify(tcase *c) {
    double *want = NULL;
    switch (c->k) {
    case K_ALLREDUCE: {
        want = malloc((size_t)c->n * sizeof *want + 1);
        for (int64_t i = 0; i < c->n; i++)
            want[i] = reduce_ref(c->op, c->dt, c->t, i);
        CHECK(tl_check_array(c->name, c->out, c->dt, want, c->n));
        break;
    }
    case K_SCALED: {
        want = malloc((size_t)c->n * sizeof *want + 1);
        for (int64_t i = 0; i < c->n; i++) {
            double s = 0;
            for (int r = 0; r < g_size; r++)
                s += val(r, c->t, i, c->dt);
            if (tl_is_float(c->dt)) {
                want[i] = s * 0.5 * 3.0 / (c->op == HVD_OP_AVERAGE ? g_size : 1);
            } else {
                int64_t sum2 = (int64_t)(2 * s);
                if (c->op == HVD_OP_AVERAGE) sum2 /= g_size;
                want[i] = trunc((double)sum2 * 0.5);
            }
        }
        CHECK(tl_check_array(c->name, c->out, c->dt, want, c->n));
        break;
    }
    case K_ALLGATHER: {
        int64_t total = 0;
        for (int r = 0; r < g_size; r++)
            total += ag_rows(r, c->t, c->n);
        CHECK_MSG(c->res.first_dim == total, "%s: first_dim %lld, expected %lld", c->name,
                  (long long)c->res.first_dim, (long long)total);
        CHECK(c->res.rank_rows != NULL);
        want = malloc((size_t)(total * ROW) * sizeof *want + 1);
        int64_t k = 0;
        for (int r = 0; r < g_size; r++) {
            if (c->res.rank_rows) CHECK(c->res.rank_rows[r] == ag_rows(r, c->t, c->n));
            for (int64_t i = 0; i < ag_rows(r, c->t, c->n) * ROW; i++)
                want[k++] = val(r, c->t, i, c->dt);
        }
        CHECK(c->res.bytes == (size_t)(total * ROW) * tl_esize(c->dt));
        if (c->res.first_dim == total)
            CHECK(tl_check_array(c->name, c->res.data, c->dt, want, total * ROW));
        hvd_output_free(&c->res);
        break;
    }
    case K_BCAST: {
        int root = c->t % g_size;
        want = malloc((size_t)c->n * sizeof *want + 1);
        for (int64_t i = 0; i < c->n; i++)
            want[i] = val(root, c->t, i, c->dt);
        CHECK(tl_check_array(c->name, c->out, c->dt, want, c->n));
        break;
    }
    case K_ALLTOALL: {
        int64_t total = 0;
        for (int s = 0; s < g_size; s++)
            total += a2a_split(s, g_rank, c->t, c->n);
        CHECK_MSG(c->res.first_dim == total, "%s: first_dim %lld, expected %lld", c->name,
                  (long long)c->res.first_dim, (long long)total);
        want = malloc((size_t)(total * ROW) * sizeof *want + 1);
        int64_t k = 0;
        for (int s = 0; s < g_size; s++) {
            int64_t off = 0; /* rows of s that go to ranks before me */
            for (int d = 0; d < g_rank; d++)
                off += a2a_split(s, d, c->t, c->n);
            int64_t rows = a2a_split(s, g_rank, c->t, c->n);
            if (c->res.rank_rows) CHECK(c->res.rank_rows[s] == rows);
            for (int64_t i = off * ROW; i < (off + rows) * ROW; i++)
                want[k++] = val(s, c->t, i, c->dt);
        }
        if (c->res.first_dim == total)
            CHECK(tl_check_array(c->name, c->res.data, c->dt, want, total * ROW));
        hvd_output_free(&c->res);
        break;
    }
    case K_RS: {
        int64_t first = g_size * c->n + c->t % g_size;
        int64_t off = 0;
        for (int r = 0; r < g_rank; r++)
            off += hvd_reducescatter_rows(first, r, g_size);
        int64_t mine = hvd_reducescatter_rows(first, g_rank, g_size);
        want = malloc((size_t)(mine * ROW) * sizeof *want + 1);
        for (int64_t i = 0; i < mine * ROW; i++)
            want[i] = reduce_ref(c->op, c->dt, c->t, off * ROW + i);
        CHECK(tl_check_array(c->name, c->out, c->dt, want, mine * ROW));
        break;
    }
    }
    free(want);
    free(c->in);
    free(c->out);
    free(c->splits);
    c->in = c->out = NULL;
    c->splits = NULL;
}

static tcase *build_cases(int *count) {
    int cap = 2048, n = 0;
    tcase *v = calloc((size_t)cap, sizeof *v);
    int t = 0;
    for (int d = 0; d < HVD_NUM_DTYPES; d++) {
        hvd_dtype dt = all_dtypes[d];
        for (int s = 0; s < NSIZES; s++) {
            int64_t sz = sizes[s];
            /* Row-shaped collectives scale their size parameter down: it multiplies rows. */
            int64_t rows = sz > 1000 ? sz / 64 : sz;
            for (int op = 0; op < HVD_NUM_REDUCE_OPS; op++) {
                v[n++] = (tcase){.k = K_ALLREDUCE, .dt = dt, .op = op, .n = sz, .t = t++};
                v[n++] = (tcase){.k = K_RS, .dt = dt, .op = op, .n = rows, .t = t++};
            }
            v[n++] = (tcase){.k = K_SCALED, .dt = dt, .op = HVD_OP_SUM, .n = sz, .t = t++};
            v[n++] = (tcase){.k = K_SCALED, .dt = dt, .op = HVD_OP_AVERAGE, .n = sz, .t = t++};
            v[n++] = (tcase){.k = K_ALLGATHER, .dt = dt, .n = rows, .t = t++};
            v[n++] = (tcase){.k = K_BCAST, .dt = dt, .n = sz, .t = t++};
            v[n++] = (tcase){.k = K_BCAST, .dt = dt, .n = sz, .t = t++};
            v[n++] = (tcase){.k = K_ALLTOALL, .dt = dt, .n = rows, .t = t++};
        }
    }
    static const char *kn[] = {"allreduce", "scaled", "allgather", "bcast", "alltoall", "rs"};
    for (int i = 0; i < n; i++)
        snprintf(v[i].name, sizeof v[i].name, "%s.%s.%s.%lld.t%d", kn[v[i].k],
                 hvd_dtype_name(v[i].dt), hvd_reduce_op_name(v[i].op), (long long)v[i].n, v[i].t);
    *count = n;
    return v;
}

static void run_async_round(tcase *v, int n) {
    for (int i = 0; i < n; i++)
        submit(&v[i], false);
    for (int i = 0; i < n; i++) {
        hvd_err err = {0};
        int rc = hvd_wait(v[i].h, &err);
        CHECK_MSG(rc == 0, "%s: %s", v[i].name, err.msg);
    }
    for (int i = 0; i < n; i++)
        verify(&v[i]);
}

static void test_async_all(void) {
    int n;
    tcase *v = build_cases(&n);
    hvd_stats before, after;
    hvd_get_stats(&before);
    run_async_round(v, n);
    hvd_get_stats(&after);
    /* Hundreds of same-type allreduces went in together: some calls must have been fused. */
    if (getenv("HOROVOD_FUSION_THRESHOLD") == NULL) CHECK(after.fused_calls > before.fused_calls);
    CHECK(after.tensors_done - before.tensors_done == (uint64_t)n);
    free(v);
}

static void test_async_repeat_cached(void) {
    int n;
    tcase *v = build_cases(&n);
    hvd_stats before, after;
    hvd_get_stats(&before);
    run_async_round(v, n);
    hvd_get_stats(&after);
    /* Same names, same parameters: with a cache big enough they come from the cache. */
    const char *cap = getenv("HOROVOD_CACHE_CAPACITY");
    if (!cap || atoi(cap) >= n)
        CHECK_MSG(after.cached_responses - before.cached_responses == (uint64_t)n,
                  "cached %llu of %d",
                  (unsigned long long)(after.cached_responses - before.cached_responses), n);
    free(v);
}

static void test_sync_subset(void) {
    int n;
    tcase *v = build_cases(&n);
    for (int i = 0; i < n; i += 7) {
        submit(&v[i], true);
        verify(&v[i]);
    }
    free(v);
}

static void test_barrier_and_ids(void) {
    hvd_err err = {0};
    CHECK(hvd_rank() == g_rank && hvd_size() == g_size);
    CHECK(hvd_local_rank() >= 0 && hvd_local_rank() < hvd_local_size());
    CHECK(hvd_cross_rank() >= 0 && hvd_cross_rank() < hvd_cross_size());
    /* One host here: local = world, one cross group per local rank. */
    CHECK(hvd_local_size() == g_size && hvd_local_rank() == g_rank && hvd_cross_size() == 1);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(hvd_barrier(&err) == 0, "%s", err.msg);
    /* Unnamed allreduces match by call order. */
    int32_t x = g_rank + 1, y = 0;
    CHECK(hvd_allreduce(NULL, &x, &y, 1, HVD_INT32, HVD_OP_SUM, HVD_DEVICE_CPU, &err) == 0);
    CHECK(y == g_size * (g_size + 1) / 2);
}

/* The process's first fused group: an empty allreduce and a one-element one, submitted back to
 * back (one cycle fuses them). The runtime used to reserve the fusion buffer only for cycles
 * with two non-empty fusable allreduces, so this group found no buffer and failed with
 * "internal error: the fusion buffer was not reserved" (seen as a rare failure of
 * test_async_all at one rank, whose first cycle can hold just such a pair). Runs first: later
 * the buffer exists. */
static void test_first_fused_empty(void) {
    float none = 0, one_in = 1.0f + (float)g_rank, one_out = -1;
    hvd_handle h[2];
    hvd_err err = {0};
    CHECK_MSG(hvd_allreduce_async("first.empty", &none, &none, 0, HVD_FLOAT32, HVD_OP_SUM,
                                  HVD_DEVICE_CPU, &h[0], &err) == 0,
              "%s", err.msg);
    CHECK_MSG(hvd_allreduce_async("first.one", &one_in, &one_out, 1, HVD_FLOAT32, HVD_OP_SUM,
                                  HVD_DEVICE_CPU, &h[1], &err) == 0,
              "%s", err.msg);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(hvd_wait(h[i], &err) == 0, "%s", err.msg);
    CHECK(one_out == (float)(g_size * (g_size + 1) / 2));
}

int main(void) {
    tl_init();
    g_rank = hvd_rank();
    g_size = hvd_size();
    RUN(test_first_fused_empty);
    RUN(test_barrier_and_ids);
    RUN(test_async_all);
    RUN(test_async_repeat_cached);
    RUN(test_sync_subset);
    hvd_shutdown();
    return test_finish();
}
