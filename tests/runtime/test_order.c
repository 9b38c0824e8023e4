/* Ranks submit the same 200 tensors in different random orders (a different order on every
 * rank and every step, with pauses so submissions straddle cycles). The runtime must agree
 * on one order and complete all of them correctly, without deadlock. Steps 2 and 3 repeat
 * the names, so they also run through the response cache with the orders still shuffled. */
#include <time.h>

#include "rt_testlib.h"

#define NT    200
#define STEPS 3

static int rank_, size_;

/* Tensor k: a mix of collectives and types, sizes 1..300. */
static int64_t tsize(int k) {
    return 1 + (k * 37) % 300;
}

static double v(int r, int k, int64_t i, int step) {
    return (double)((r * 3 + k + i * 7 + step) % 11) - 5;
}

static void one_step(int step) {
    int order[NT];
    for (int k = 0; k < NT; k++)
        order[k] = k;
    tl_shuffle(order, NT, (uint64_t)(rank_ * 1000 + step + 1));
    float *in[NT], *out[NT];
    hvd_output res[NT];
    hvd_handle h[NT];
    uint64_t seed = (uint64_t)rank_ * 77 + (uint64_t)step;
    for (int j = 0; j < NT; j++) {
        int k = order[j];
        char name[32];
        snprintf(name, sizeof name, "order.%d", k);
        int64_t n = tsize(k);
        in[k] = malloc((size_t)n * sizeof(float));
        out[k] = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            in[k][i] = (float)v(rank_, k, i, step);
        hvd_err err = {0};
        int rc;
        if (k % 10 == 3) {
            rc = hvd_allgather_async(name, in[k], n, 1, HVD_FLOAT32, HVD_DEVICE_CPU, &res[k], &h[k],
                                     &err);
        } else if (k % 10 == 7) {
            if (rank_ != k % size_)
                memset(out[k], 0, (size_t)n * sizeof(float));
            else
                memcpy(out[k], in[k], (size_t)n * sizeof(float));
            rc = hvd_broadcast_async(name, out[k], n, HVD_FLOAT32, k % size_, HVD_DEVICE_CPU, &h[k],
                                     &err);
        } else {
            rc = hvd_allreduce_async(name, in[k], out[k], n, HVD_FLOAT32,
                                     k % 2 ? HVD_OP_SUM : HVD_OP_MAX, HVD_DEVICE_CPU, &h[k], &err);
        }
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (tl_rand(&seed) % 16 == 0) { /* pause now and then: spread over several cycles */
            struct timespec ts = {0, (long)(tl_rand(&seed) % 3000000)};
            nanosleep(&ts, NULL);
        }
    }
    /* Wait in yet another order. */
    tl_shuffle(order, NT, (uint64_t)(rank_ * 31 + step + 99));
    int bad = 0;
    for (int j = 0; j < NT; j++) {
        int k = order[j];
        hvd_err err = {0};
        if (hvd_wait(h[k], &err) != 0) {
            fprintf(stderr, "order.%d: %s\n", k, err.msg);
            bad++;
            continue;
        }
        int64_t n = tsize(k);
        for (int64_t i = 0; i < n && !bad; i++) {
            double want;
            if (k % 10 == 3) {
                for (int r = 0; r < size_; r++)
                    if ((double)((float *)res[k].data)[r * n + i] != v(r, k, i, step)) bad++;
                continue;
            } else if (k % 10 == 7) {
                want = v(k % size_, k, i, step);
            } else {
                want = k % 2 ? 0 : -1e9;
                for (int r = 0; r < size_; r++)
                    want = k % 2 ? want + v(r, k, i, step)
                                 : (v(r, k, i, step) > want ? v(r, k, i, step) : want);
            }
            if ((double)out[k][i] != want) {
                fprintf(stderr, "order.%d[%lld] = %g, expected %g\n", k, (long long)i,
                        (double)out[k][i], want);
                bad++;
            }
        }
        if (k % 10 == 3) {
            CHECK(res[k].first_dim == n * size_);
            hvd_output_free(&res[k]);
        }
        free(in[k]);
        free(out[k]);
    }
    CHECK_MSG(bad == 0, "step %d: %d wrong tensors", step, bad);
}

static void test_random_orders(void) {
    hvd_stats s0, s1;
    one_step(0);
    hvd_get_stats(&s0);
    for (int step = 1; step < STEPS; step++)
        one_step(step);
    hvd_get_stats(&s1);
    /* The repeated steps were scheduled (at least partly) through the response cache. */
    if (!getenv("HOROVOD_CACHE_CAPACITY"))
        CHECK_MSG(s1.cached_responses > s0.cached_responses, "no cache hits in steps 2..%d", STEPS);
}

int main(void) {
    tl_init();
    rank_ = hvd_rank();
    size_ = hvd_size();
    RUN(test_random_orders);
    hvd_shutdown();
    return test_finish();
}
