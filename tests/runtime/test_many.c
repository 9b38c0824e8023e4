/* 10,000 small tensors submitted in one step: negotiation, fusion and completion must cope
 * with a large response list (and a response cache smaller than the step), and every tensor
 * must come back right. $HVD_TEST_TENSORS sets another count; with $HVD_TEST_FRESH_NAMES=1
 * every step uses new names (the response cache's warning about its size must not come). */
#include <stdbool.h>

#include "rt_testlib.h"

#define N 4 /* float32 elements per tensor */

static int rank_, size_;
static int NT = 10000;
static bool fresh_names;

static void step(int s) {
    float *in = malloc(sizeof(float) * NT * N), *out = malloc(sizeof(float) * NT * N);
    hvd_handle *h = malloc(sizeof *h * NT);
    for (int k = 0; k < NT; k++)
        for (int i = 0; i < N; i++)
            in[k * N + i] = (float)(rank_ + k % 100 + i + s);
    int failed = 0;
    for (int k = 0; k < NT; k++) {
        char name[32];
        snprintf(name, sizeof name, "many.%d.%d", fresh_names ? s : 0, k);
        hvd_err err = {0};
        if (hvd_allreduce_async(name, in + k * N, out + k * N, N, HVD_FLOAT32, HVD_OP_SUM,
                                HVD_DEVICE_CPU, &h[k], &err) != 0) {
            fprintf(stderr, "%s: %s\n", name, err.msg);
            failed++;
        }
    }
    CHECK(failed == 0);
    int bad = 0;
    for (int k = 0; k < NT; k++) {
        hvd_err err = {0};
        if (hvd_wait(h[k], &err) != 0) {
            if (bad++ < 3) fprintf(stderr, "many.%d: %s\n", k, err.msg);
            continue;
        }
        for (int i = 0; i < N; i++) {
            /* sum over r of (r + k%100 + i + s) */
            double want = size_ * (double)(k % 100 + i + s) + size_ * (size_ - 1) / 2.0;
            if ((double)out[k * N + i] != want && bad++ < 3)
                fprintf(stderr, "many.%d[%d] = %g, expected %g\n", k, i, (double)out[k * N + i],
                        want);
        }
    }
    CHECK_MSG(bad == 0, "step %d: %d wrong", s, bad);
    free(in);
    free(out);
    free(h);
}

static void test_ten_thousand(void) {
    hvd_stats a, b;
    hvd_get_stats(&a);
    step(0);
    hvd_get_stats(&b);
    /* Fused: far fewer collective calls than tensors. */
    CHECK_MSG(b.collective_calls - a.collective_calls < (uint64_t)NT / 10,
              "%llu calls for %d tensors",
              (unsigned long long)(b.collective_calls - a.collective_calls), NT);
    CHECK(b.tensors_done - a.tensors_done == (uint64_t)NT);
    step(1); /* again, with the cache (capacity 1024 unless set) churning */
}

int main(void) {
    tl_init();
    const char *nt = getenv("HVD_TEST_TENSORS"), *fresh = getenv("HVD_TEST_FRESH_NAMES");
    if (nt && atoi(nt) > 0) NT = atoi(nt);
    fresh_names = fresh && strcmp(fresh, "1") == 0;
    rank_ = hvd_rank();
    size_ = hvd_size();
    RUN(test_ten_thousand);
    hvd_shutdown();
    return test_finish();
}
