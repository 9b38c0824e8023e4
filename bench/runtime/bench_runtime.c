/* Benchmarks of the collective runtime against raw MPI on the same ranks (docs/performance.md,
 * "Collective runtime"). Run on 4 ranks with bench/runtime/run_bench.sh.
 *
 *  1. Large allreduce: 64 MiB of float32, hvd_allreduce vs an MPI_Allreduce loop.
 *  2. Many small tensors: 1000 x 4 KiB float32 per step, submitted asynchronously and fused
 *     by the runtime, vs one MPI_Allreduce per tensor.
 *  3. Negotiation cost per cycle with and without the response cache, for 100 and 1000
 *     tensors per cycle, two ways: (a) the negotiation machinery alone (runtime/controller.c
 *     driven in a lock-step loop on a private communicator: the cache path's one bit-vector
 *     allreduce vs the full path's bit vector + gather + broadcast with the coordinator
 *     matching every name), and (b) end to end, steps of one-element tensors through the
 *     runtime with HOROVOD_CACHE_CAPACITY=1024 (default) vs 0.
 *
 * The raw MPI loops run while the runtime is not started (its background thread would
 * otherwise share the cores), before and after the runtime phases; the table uses their mean.
 * Results are checked, so a fast wrong answer cannot pass. Times are the maximum over ranks.
 *
 * Options: --large-iters N (5), --small-steps N (10), --neg-steps N (50) */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/internal.h" /* (a) drives the controller directly */
#include "hvd/runtime.h"

static int rank_, size_;

static double now(void) {
    return MPI_Wtime();
}

/* Slowest rank's elapsed time. */
static double max_time(double t) {
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static void die(const char *what, const hvd_err *err) {
    fprintf(stderr, "rank %d: %s: %s\n", rank_, what, err ? err->msg : "");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void check_sum(const float *v, size_t n, float each, const char *what) {
    float want = each * (float)size_;
    for (size_t i = 0; i < n; i += 997)
        if (v[i] != want) {
            fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", rank_, what, i,
                    (double)v[i], (double)want);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n samples (sorts them). Robust to the other jobs sharing this machine. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define LARGE_N (64u * 1024 * 1024 / sizeof(float))
#define SMALL_T 1000
#define SMALL_N (4096 / sizeof(float))

/* Seconds per 64 MiB allreduce (best of iters, after one warm-up). */
static double large_raw(float *in, float *out, int iters) {
    double best = 1e30;
    for (int i = -1; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Allreduce(in, out, (int)LARGE_N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = max_time(now() - t0);
        if (i >= 0 && t < best) best = t;
    }
    check_sum(out, LARGE_N, 1.0f, "raw large allreduce");
    return best;
}

static double large_hvd(float *in, float *out, int iters) {
    double best = 1e30;
    hvd_err err = {0};
    for (int i = -1; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        if (hvd_allreduce("bench.large", in, out, (int64_t)LARGE_N, HVD_FLOAT32, HVD_OP_SUM,
                          HVD_DEVICE_CPU, &err) != 0)
            die("hvd_allreduce", &err);
        double t = max_time(now() - t0);
        if (i >= 0 && t < best) best = t;
    }
    check_sum(out, LARGE_N, 1.0f, "hvd large allreduce");
    return best;
}

/* Seconds per step of SMALL_T allreduces (median over steps, after one warm-up step). */
static double small_raw(float *in, float *out, int steps) {
    double *t_s = malloc(sizeof(double) * (size_t)steps);
    for (int s = -1; s < steps; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int k = 0; k < SMALL_T; k++)
            MPI_Allreduce(in + k * SMALL_N, out + k * SMALL_N, (int)SMALL_N, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        double t = max_time(now() - t0);
        if (s >= 0) t_s[s] = t;
    }
    check_sum(out, (size_t)SMALL_T * SMALL_N, 2.0f, "raw small allreduces");
    double m = median(t_s, steps);
    free(t_s);
    return m;
}

static double small_hvd(float *in, float *out, int steps) {
    double *t_s = malloc(sizeof(double) * (size_t)steps);
    hvd_handle *h = malloc(sizeof *h * SMALL_T);
    hvd_err err = {0};
    for (int s = -1; s < steps; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int k = 0; k < SMALL_T; k++) {
            char name[32];
            snprintf(name, sizeof name, "bench.small.%d", k);
            if (hvd_allreduce_async(name, in + k * SMALL_N, out + k * SMALL_N, (int64_t)SMALL_N,
                                    HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU, &h[k], &err) != 0)
                die("hvd_allreduce_async", &err);
        }
        for (int k = 0; k < SMALL_T; k++)
            if (hvd_wait(h[k], &err) != 0) die("hvd_wait", &err);
        double t = max_time(now() - t0);
        if (s >= 0) t_s[s] = t;
    }
    free(h);
    check_sum(out, (size_t)SMALL_T * SMALL_N, 2.0f, "hvd small allreduces");
    double m = median(t_s, steps);
    free(t_s);
    return m;
}

typedef struct neg_result {
    double step_s;        /* median step time */
    double neg_per_cycle; /* mean time in negotiation of cycles that scheduled tensors,
                             waiting for the slowest rank included */
    double cached_frac;   /* fraction of tensors scheduled from the cache */
} neg_result;

/* Steps of t one-element tensors: the data costs nothing, so the step time is the cycle wait
 * plus negotiation plus one fused call. */
static neg_result negotiation(int t, int steps) {
    float *in = malloc(sizeof(float) * (size_t)t), *out = malloc(sizeof(float) * (size_t)t);
    hvd_handle *h = malloc(sizeof *h * (size_t)t);
    hvd_err err = {0};
    for (int k = 0; k < t; k++)
        in[k] = 1.0f;
    hvd_stats a = {0}, b = {0};
    double *t_s = malloc(sizeof(double) * (size_t)steps);
    for (int s = -2; s < steps; s++) {
        if (s == 0) hvd_get_stats(&a);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int k = 0; k < t; k++) {
            char name[32];
            snprintf(name, sizeof name, "bench.neg.%d.%d", t, k);
            if (hvd_allreduce_async(name, in + k, out + k, 1, HVD_FLOAT32, HVD_OP_SUM,
                                    HVD_DEVICE_CPU, &h[k], &err) != 0)
                die("hvd_allreduce_async", &err);
        }
        for (int k = 0; k < t; k++)
            if (hvd_wait(h[k], &err) != 0) die("hvd_wait", &err);
        double el = max_time(now() - t0);
        if (s >= 0) t_s[s] = el;
    }
    hvd_get_stats(&b);
    check_sum(out, (size_t)t, 1.0f, "negotiation step");
    double cycles = (double)(b.busy_cycles - a.busy_cycles);
    double ns = (double)(b.busy_negotiation_ns - a.busy_negotiation_ns);
    double mine = cycles > 0 ? ns / cycles / 1e9 : 0, worst;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    neg_result r = {median(t_s, steps), worst,
                    (double)(b.cached_responses - a.cached_responses) / ((double)t * steps)};
    free(t_s);
    free(in);
    free(out);
    free(h);
    return r;
}

/* (a): seconds per cycle of the negotiation machinery for t names, cache path and full path. */
static void controller_cost(int t, int iters, double *cached_s, double *full_s) {
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    rt_controller c;
    rt_controller_init(&c, comm, rank_, size_, NULL);
    size_t words = ((size_t)t + 63) / 64;
    uint64_t *hit = calloc(words, sizeof *hit), *bad = calloc(words, sizeof *bad);
    for (int i = 0; i < t; i++)
        hit[i / 64] |= 1ull << (i % 64);
    rt_request *reqs = malloc(sizeof *reqs * (size_t)t);
    char(*names)[32] = malloc(32 * (size_t)t);
    for (int i = 0; i < t; i++) {
        snprintf(names[i], 32, "bench.layer%d.weight.grad", i);
        reqs[i].name = names[i];
        memset(&reqs[i].p, 0, sizeof reqs[i].p);
        reqs[i].p.optype = RT_ALLREDUCE;
        reqs[i].p.dtype = HVD_FLOAT32;
        reqs[i].p.count = 1024 + i;
        reqs[i].p.row_elems = 1;
        reqs[i].p.prescale = reqs[i].p.postscale = 1;
    }
    hvd_err err = {0};
    rt_bits_result bits;
    rt_response_list resp = {0};
    for (int pass = 0; pass < 2; pass++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int i = 0; i < iters; i++) {
            if (rt_controller_sync_bits(&c, pass ? RT_FLAG_UNCACHED : 0, hit, bad, words, &bits,
                                        &err) != 0)
                die("sync_bits", &err);
            if (pass == 0) {
                if (bits.and_hit[0] != hit[0]) die("cache bits disagree", NULL);
                continue;
            }
            rt_responses_clear(&resp);
            if (rt_controller_negotiate(&c, 0, reqs, (size_t)t, &resp, &err) != 0)
                die("negotiate", &err);
            if (resp.n != (size_t)t || resp.v[0].error) die("negotiation result", NULL);
        }
        double el = max_time(now() - t0) / iters;
        *(pass ? full_s : cached_s) = el;
    }
    rt_responses_free(&resp);
    rt_controller_free(&c);
    MPI_Comm_free(&comm);
    free(hit);
    free(bad);
    free(reqs);
    free(names);
}

static void start_runtime(void) {
    hvd_err err = {0};
    if (hvd_init(&err) != 0) die("hvd_init", &err);
}

int main(int argc, char **argv) {
    int large_iters = 5, small_steps = 10, neg_steps = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--large-iters")) large_iters = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--small-steps")) small_steps = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--neg-steps")) neg_steps = atoi(argv[i + 1]);
    }
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_runtime needs MPI_THREAD_MULTIPLE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);

    float *big_in = malloc(LARGE_N * sizeof(float)), *big_out = malloc(LARGE_N * sizeof(float));
    float *sm_in = malloc(sizeof(float) * SMALL_T * SMALL_N);
    float *sm_out = malloc(sizeof(float) * SMALL_T * SMALL_N);
    for (size_t i = 0; i < LARGE_N; i++)
        big_in[i] = 1.0f;
    for (size_t i = 0; i < (size_t)SMALL_T * SMALL_N; i++)
        sm_in[i] = 2.0f;

    /* Negotiation machinery alone, runtime not started. */
    double cc100, cf100, cc1000, cf1000;
    controller_cost(100, 400, &cc100, &cf100);
    controller_cost(1000, 100, &cc1000, &cf1000);

    /* Raw MPI, runtime not started. */
    double raw_large1 = large_raw(big_in, big_out, large_iters);
    double raw_small1 = small_raw(sm_in, sm_out, small_steps);

    /* The runtime, default settings (cache on, 128 MiB fusion, 1 ms cycle). */
    unsetenv("HOROVOD_CACHE_CAPACITY");
    start_runtime();
    double hvd_large = large_hvd(big_in, big_out, large_iters);
    double hvd_small = small_hvd(sm_in, sm_out, small_steps);
    neg_result c100 = negotiation(100, neg_steps), c1000 = negotiation(1000, neg_steps / 5 + 1);
    hvd_shutdown();

    /* Without the response cache. */
    setenv("HOROVOD_CACHE_CAPACITY", "0", 1);
    start_runtime();
    neg_result n100 = negotiation(100, neg_steps), n1000 = negotiation(1000, neg_steps / 5 + 1);
    hvd_shutdown();

    double raw_large2 = large_raw(big_in, big_out, large_iters);
    double raw_small2 = small_raw(sm_in, sm_out, small_steps);
    double raw_large = (raw_large1 + raw_large2) / 2, raw_small = (raw_small1 + raw_small2) / 2;

    if (rank_ == 0) {
        double gib = 64.0 / 1024;
        printf("ranks: %d\n", size_);
        printf("large allreduce 64 MiB f32 (best of %d): MPI_Allreduce %.1f ms (%.2f GiB/s; runs "
               "%.1f/%.1f ms), hvd_allreduce %.1f ms (%.2f GiB/s): ratio %.3f\n",
               large_iters, raw_large * 1e3, gib / raw_large, raw_large1 * 1e3, raw_large2 * 1e3,
               hvd_large * 1e3, gib / hvd_large, raw_large / hvd_large);
        printf("1000 x 4 KiB per step (median of %d): MPI_Allreduce per tensor %.1f ms (runs "
               "%.1f/%.1f ms), runtime fused %.2f ms: speed-up %.1fx\n",
               small_steps, raw_small * 1e3, raw_small1 * 1e3, raw_small2 * 1e3, hvd_small * 1e3,
               raw_small / hvd_small);
        printf("negotiation machinery per cycle, 100 names:  cache path %.1f us, full path %.1f "
               "us (%.1fx)\n",
               cc100 * 1e6, cf100 * 1e6, cf100 / cc100);
        printf("negotiation machinery per cycle, 1000 names: cache path %.1f us, full path %.1f "
               "us (%.1fx)\n",
               cc1000 * 1e6, cf1000 * 1e6, cf1000 / cc1000);
        printf("end to end, 100 one-element tensors/step (median of %d steps): cache on %.3f ms "
               "(%.0f%% from the cache), cache off %.3f ms\n",
               neg_steps, c100.step_s * 1e3, c100.cached_frac * 100, n100.step_s * 1e3);
        printf("end to end, 1000 one-element tensors/step (median of %d steps): cache on %.3f ms "
               "(%.0f%% from the cache), cache off %.3f ms\n",
               neg_steps / 5 + 1, c1000.step_s * 1e3, c1000.cached_frac * 100, n1000.step_s * 1e3);
    }
    free(big_in);
    free(big_out);
    free(sm_in);
    free(sm_out);
    MPI_Finalize();
    return 0;
}
