/* Benchmarks of the collective runtime against raw MPI on the same ranks (docs/performance.md,
 * "Collective runtime"). Run on 4 ranks with bench/runtime/run_bench.sh.
 *
 *  1. Large allreduce: 64 MiB of float32, hvd_allreduce vs an MPI_Allreduce loop.
 *  2. Many small tensors: T x 4 KiB float32 per step (T = 10, 100, 1000, 4000), submitted
 *     asynchronously and fused by the runtime, vs one MPI_Allreduce per tensor. The runtime
 *     runs with its default settings: 4000 names exceed the default 1024 cache slots, so
 *     those steps are negotiated in full (what a model with more gradients than slots gets).
 *  3. Mid-size allreduce: 64 KiB, 256 KiB, 1 MiB and 4 MiB of float32, one at a time,
 *     hvd_allreduce vs MPI_Allreduce (median of --mid-iters calls, each timed on the slowest
 *     rank between barriers).
 *  4. Negotiation cost per cycle with and without the response cache, for 100 and 1000
 *     tensors per step, two ways, both through the public API only (include/hvd/runtime.h):
 *     (a) the time the runtime's own counters (hvd_get_stats: busy_negotiation_ns over
 *     busy_cycles) give per cycle that scheduled tensors, with HOROVOD_CYCLE_TIME=0 so that
 *     cycles run back to back and the ranks negotiate in lock-step instead of waiting for each
 *     other's next cycle: the cache path's one bit-vector allreduce (HOROVOD_CACHE_CAPACITY =
 *     the number of names) vs the full path's bit vector + gather + broadcast with the
 *     coordinator matching every name (capacity 0); and (b) end to end, steps of one-element
 *     tensors through the runtime with HOROVOD_CACHE_CAPACITY=1024 (default) vs 0.
 *
 * The raw MPI loops run while the runtime is not started (its background thread would
 * otherwise share the cores), before and after the runtime phases; the table uses their mean.
 * Results are checked: each phase's last call or step writes into a buffer filled with NaNs
 * just before it (outside the timed part), so a fast wrong answer (or none) cannot pass. Times are
 * the maximum over ranks, except (a): the rank that reaches each negotiation last waits least for
 * the others, so the minimum over ranks is the closest to the negotiation's own cost (the maximum
 * is printed too, in brackets).
 *
 * Options (each from 1 to 1000000): --large-iters N (5), --small-steps N (10), --neg-steps N (50),
 * --mid-iters N (50), --cache-slots N (HOROVOD_CACHE_CAPACITY of phases 1-3; default: the
 * runtime's, 1024); --json FILE (rank 0 writes every result there as one JSON object, for
 * bench/runtime/runs.py). */
#include <math.h>
#include <stdbool.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Fills an output buffer with NaNs (all bits set), so a check after a phase fails unless the
 * phase itself wrote the results. */
static void poison(float *v, size_t n) {
    memset(v, 0xff, n * sizeof *v);
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
#define SMALL_N (4096 / sizeof(float))
/* Tensor counts of the fusion sweep (phase 2); the largest sizes the buffers. */
static const int small_counts[] = {10, 100, 1000, 4000};
#define N_COUNTS  (int)(sizeof small_counts / sizeof small_counts[0])
#define SMALL_MAX 4000
/* Mid sizes (phase 3), bytes. */
static const size_t mid_bytes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
#define N_MID (int)(sizeof mid_bytes / sizeof mid_bytes[0])

/* Seconds per 64 MiB allreduce (best of iters, after one warm-up). */
static double large_raw(float *in, float *out, int iters) {
    double best = 1e30;
    for (int i = -1; i < iters; i++) {
        if (i == iters - 1) poison(out, LARGE_N); /* the last call's result is checked */
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
        if (i == iters - 1) poison(out, LARGE_N); /* the last call's result is checked */
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

/* Seconds per step of t allreduces of 4 KiB (median over steps, after one warm-up step). */
static double small_raw(int t, float *in, float *out, int steps) {
    double *t_s = malloc(sizeof(double) * (size_t)steps);
    for (int s = -1; s < steps; s++) {
        if (s == steps - 1) poison(out, (size_t)t * SMALL_N); /* the last step is checked */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int k = 0; k < t; k++)
            MPI_Allreduce(in + k * SMALL_N, out + k * SMALL_N, (int)SMALL_N, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        double el = max_time(now() - t0);
        if (s >= 0) t_s[s] = el;
    }
    check_sum(out, (size_t)t * SMALL_N, 2.0f, "raw small allreduces");
    double m = median(t_s, steps);
    free(t_s);
    return m;
}

static double small_hvd(int t, float *in, float *out, int steps) {
    double *t_s = malloc(sizeof(double) * (size_t)steps);
    hvd_handle *h = malloc(sizeof *h * (size_t)t);
    hvd_err err = {0};
    for (int s = -1; s < steps; s++) {
        if (s == steps - 1) poison(out, (size_t)t * SMALL_N); /* the last step is checked */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int k = 0; k < t; k++) {
            char name[48];
            snprintf(name, sizeof name, "bench.small.%d.%d", t, k);
            if (hvd_allreduce_async(name, in + k * SMALL_N, out + k * SMALL_N, (int64_t)SMALL_N,
                                    HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU, &h[k], &err) != 0)
                die("hvd_allreduce_async", &err);
        }
        for (int k = 0; k < t; k++)
            if (hvd_wait(h[k], &err) != 0) die("hvd_wait", &err);
        double el = max_time(now() - t0);
        if (s >= 0) t_s[s] = el;
    }
    free(h);
    check_sum(out, (size_t)t * SMALL_N, 2.0f, "hvd small allreduces");
    double m = median(t_s, steps);
    free(t_s);
    return m;
}

/* Seconds per allreduce of n floats through MPI (hvd = 0) or the runtime (hvd = 1): median
 * over iters calls, each timed on the slowest rank between barriers, after two warm-ups. */
static double mid_allreduce(int hvd, float *in, float *out, size_t n, int iters) {
    double *t_s = malloc(sizeof(double) * (size_t)iters);
    hvd_err err = {0};
    char name[32];
    snprintf(name, sizeof name, "bench.mid.%zu", n);
    for (int i = -2; i < iters; i++) {
        if (i == iters - 1) poison(out, n); /* the last call's result is the one checked */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        if (!hvd)
            MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (hvd_allreduce(name, in, out, (int64_t)n, HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU,
                               &err) != 0)
            die("hvd_allreduce", &err);
        double el = max_time(now() - t0);
        if (i >= 0) t_s[i] = el;
    }
    check_sum(out, n, 1.0f, hvd ? "hvd mid-size allreduce" : "raw mid-size allreduce");
    double m = median(t_s, iters);
    free(t_s);
    return m;
}

typedef struct neg_result {
    double step_s;           /* median step time */
    double cached_frac;      /* fraction of tensors scheduled from the cache */
    double neg_min, neg_max; /* mean time in negotiation of the cycles that scheduled tensors,
                                over ranks: least and most */
    double names_per_cycle;  /* tensors scheduled per such cycle */
    double idle_cycle;       /* negotiation per cycle while nothing is submitted (least over
                                ranks); set by negotiation_cost only */
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
        if (s == steps - 1) poison(out, (size_t)t); /* the last step is checked */
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
    double scheduled = (double)(b.cached_responses - a.cached_responses + b.negotiated_responses -
                                a.negotiated_responses);
    double mine = cycles > 0 ? ns / cycles / 1e9 : 0, least, most;
    MPI_Allreduce(&mine, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    neg_result r = {
        .step_s = median(t_s, steps),
        .cached_frac = (double)(b.cached_responses - a.cached_responses) / ((double)t * steps),
        .neg_min = least,
        .neg_max = most,
        .names_per_cycle = cycles > 0 ? scheduled / cycles : 0,
    };
    free(t_s);
    free(in);
    free(out);
    free(h);
    return r;
}

static void start_runtime(void) {
    hvd_err err = {0};
    if (hvd_init(&err) != 0) die("hvd_init", &err);
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Negotiation time per cycle while no rank submits anything: the bit-vector allreduce alone,
 * in lock-step. Mean per cycle over a 10 ms window, best of 10 windows (other jobs on the
 * machine preempt a background thread now and then), least over ranks. */
static double idle_cycle_cost(void) {
    double best = 1e30;
    for (int w = 0; w < 10; w++) {
        hvd_stats a, b;
        MPI_Barrier(MPI_COMM_WORLD);
        hvd_get_stats(&a);
        nap_ms(10); /* sleeping, not in MPI: the background threads get the cores */
        hvd_get_stats(&b);
        double cycles = (double)(b.cycles - a.cycles);
        double mean = (double)(b.negotiation_ns - a.negotiation_ns) / cycles / 1e9;
        if (cycles > 0 && mean < best) best = mean;
    }
    double least;
    MPI_Allreduce(&best, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    return least;
}

/* (a): negotiation per cycle for steps of t names, cycles back to back (HOROVOD_CYCLE_TIME=0,
 * so ranks negotiate in lock-step instead of waiting for each other's next cycle); cache on
 * (t slots, the bit vector the cache path sends) or off (every step negotiated in full). */
static neg_result negotiation_cost(int t, int steps, int cache) {
    char slots[16];
    snprintf(slots, sizeof slots, "%d", cache ? t : 0);
    setenv("HOROVOD_CYCLE_TIME", "0", 1);
    setenv("HOROVOD_CACHE_CAPACITY", slots, 1);
    start_runtime();
    double idle = idle_cycle_cost();
    neg_result r = negotiation(t, steps);
    r.idle_cycle = idle;
    hvd_shutdown();
    unsetenv("HOROVOD_CYCLE_TIME");
    unsetenv("HOROVOD_CACHE_CAPACITY");
    return r;
}

typedef struct options {
    int large_iters, small_steps, neg_steps, mid_iters;
    int cache_slots; /* HOROVOD_CACHE_CAPACITY of the runtime phases 1-3; 0: the default */
    const char *json;
} options;

typedef struct results {
    /* raw MPI before and after the runtime phases */
    double raw_large[2], raw_small[N_COUNTS][2], raw_mid[N_MID][2];
    double hvd_large, hvd_small[N_COUNTS], hvd_mid[N_MID];
    neg_result c100, c1000, n100, n1000; /* end to end, cache on / off */
    neg_result cost[2][2];               /* [100, 1000 names][cache path, full path] */
} results;

/* The raw MPI phases: large, the fusion sweep, mid sizes; round 0 before the runtime phases,
 * round 1 after. */
static void raw_phases(const options *o, results *r, int round, float *big_in, float *big_out,
                       float *sm_in, float *sm_out) {
    r->raw_large[round] = large_raw(big_in, big_out, o->large_iters);
    for (int c = 0; c < N_COUNTS; c++)
        r->raw_small[c][round] = small_raw(small_counts[c], sm_in, sm_out, o->small_steps);
    for (int m = 0; m < N_MID; m++)
        r->raw_mid[m][round] =
            mid_allreduce(0, big_in, big_out, mid_bytes[m] / sizeof(float), o->mid_iters);
}

/* Runs every phase in order: raw MPI, the runtime with and without the cache, the negotiation
 * cost, raw MPI again. */
static void run_all(const options *o, results *r) {
    float *big_in = malloc(LARGE_N * sizeof(float)), *big_out = malloc(LARGE_N * sizeof(float));
    float *sm_in = malloc(sizeof(float) * SMALL_MAX * SMALL_N);
    float *sm_out = malloc(sizeof(float) * SMALL_MAX * SMALL_N);
    for (size_t i = 0; i < LARGE_N; i++)
        big_in[i] = 1.0f;
    for (size_t i = 0; i < (size_t)SMALL_MAX * SMALL_N; i++)
        sm_in[i] = 2.0f;

    /* Raw MPI, runtime not started. */
    raw_phases(o, r, 0, big_in, big_out, sm_in, sm_out);

    /* The runtime, default settings (cache on, 128 MiB fusion, 1 ms cycle), or the slots
     * --cache-slots gives. */
    char slots[16];
    snprintf(slots, sizeof slots, "%d", o->cache_slots);
    if (o->cache_slots > 0)
        setenv("HOROVOD_CACHE_CAPACITY", slots, 1);
    else
        unsetenv("HOROVOD_CACHE_CAPACITY");
    start_runtime();
    r->hvd_large = large_hvd(big_in, big_out, o->large_iters);
    for (int c = 0; c < N_COUNTS; c++)
        r->hvd_small[c] = small_hvd(small_counts[c], sm_in, sm_out, o->small_steps);
    for (int m = 0; m < N_MID; m++)
        r->hvd_mid[m] =
            mid_allreduce(1, big_in, big_out, mid_bytes[m] / sizeof(float), o->mid_iters);
    r->c100 = negotiation(100, o->neg_steps);
    r->c1000 = negotiation(1000, o->neg_steps / 5 + 1);
    hvd_shutdown();

    /* Without the response cache. */
    setenv("HOROVOD_CACHE_CAPACITY", "0", 1);
    start_runtime();
    r->n100 = negotiation(100, o->neg_steps);
    r->n1000 = negotiation(1000, o->neg_steps / 5 + 1);
    hvd_shutdown();

    /* Negotiation per cycle, cycles back to back, cache on and off. */
    r->cost[0][0] = negotiation_cost(100, 4 * o->neg_steps, 1);
    r->cost[0][1] = negotiation_cost(100, 4 * o->neg_steps, 0);
    r->cost[1][0] = negotiation_cost(1000, o->neg_steps, 1);
    r->cost[1][1] = negotiation_cost(1000, o->neg_steps, 0);

    raw_phases(o, r, 1, big_in, big_out, sm_in, sm_out);
    free(big_in);
    free(big_out);
    free(sm_in);
    free(sm_out);
}

static void print_results(const options *o, const results *r) {
    double raw_large = (r->raw_large[0] + r->raw_large[1]) / 2;
    double gib = 64.0 / 1024;
    printf("ranks: %d\n", size_);
    printf("large allreduce 64 MiB f32 (best of %d): MPI_Allreduce %.1f ms (%.2f GiB/s; runs "
           "%.1f/%.1f ms), hvd_allreduce %.1f ms (%.2f GiB/s): ratio %.3f\n",
           o->large_iters, raw_large * 1e3, gib / raw_large, r->raw_large[0] * 1e3,
           r->raw_large[1] * 1e3, r->hvd_large * 1e3, gib / r->hvd_large, raw_large / r->hvd_large);
    for (int c = 0; c < N_COUNTS; c++) {
        double raw = (r->raw_small[c][0] + r->raw_small[c][1]) / 2;
        printf("%d x 4 KiB per step (median of %d): MPI_Allreduce per tensor %.2f ms (runs "
               "%.2f/%.2f ms), runtime fused %.2f ms: speed-up %.1fx\n",
               small_counts[c], o->small_steps, raw * 1e3, r->raw_small[c][0] * 1e3,
               r->raw_small[c][1] * 1e3, r->hvd_small[c] * 1e3, raw / r->hvd_small[c]);
    }
    for (int m = 0; m < N_MID; m++) {
        double raw = (r->raw_mid[m][0] + r->raw_mid[m][1]) / 2;
        printf("%zu KiB allreduce (median of %d): MPI_Allreduce %.1f us (runs %.1f/%.1f us), "
               "hvd_allreduce %.1f us: hvd / raw time %.2f\n",
               mid_bytes[m] >> 10, o->mid_iters, raw * 1e6, r->raw_mid[m][0] * 1e6,
               r->raw_mid[m][1] * 1e6, r->hvd_mid[m] * 1e6, r->hvd_mid[m] / raw);
    }
    for (int i = 0; i < 2; i++) {
        const neg_result *c = &r->cost[i][0], *f = &r->cost[i][1];
        printf("negotiation per cycle, %d names (hvd_get_stats, cycles back to back): cache path "
               "%.1f us (the bit vector: idle cycles), full path %.1f us (%.1fx; %.0f names per "
               "cycle); cycles that scheduled the names, least/most over ranks: cache %.1f/%.1f "
               "us, full %.1f/%.1f us\n",
               i ? 1000 : 100, c->idle_cycle * 1e6, f->neg_min * 1e6, f->neg_min / c->idle_cycle,
               f->names_per_cycle, c->neg_min * 1e6, c->neg_max * 1e6, f->neg_min * 1e6,
               f->neg_max * 1e6);
    }
    printf("end to end, 100 one-element tensors/step (median of %d steps): cache on %.3f ms "
           "(%.0f%% from the cache), cache off %.3f ms\n",
           o->neg_steps, r->c100.step_s * 1e3, r->c100.cached_frac * 100, r->n100.step_s * 1e3);
    printf("end to end, 1000 one-element tensors/step (median of %d steps): cache on %.3f ms "
           "(%.0f%% from the cache), cache off %.3f ms\n",
           o->neg_steps / 5 + 1, r->c1000.step_s * 1e3, r->c1000.cached_frac * 100,
           r->n1000.step_s * 1e3);
}

/* Every result as one JSON object, for bench/runtime/runs.py: times in seconds, except the
 * two per-cycle negotiation costs (*_us, microseconds). */
static int write_json(const char *path, const options *o, const results *r) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"ranks\": %d, \"large_iters\": %d, \"small_steps\": %d, \"mid_iters\": %d,\n",
            size_, o->large_iters, o->small_steps, o->mid_iters);
    fprintf(f, " \"large\": {\"raw\": [%.9g, %.9g], \"hvd\": %.9g},\n", r->raw_large[0],
            r->raw_large[1], r->hvd_large);
    fprintf(f, " \"fusion\": [");
    for (int c = 0; c < N_COUNTS; c++)
        fprintf(f, "%s{\"tensors\": %d, \"raw\": [%.9g, %.9g], \"hvd\": %.9g}", c ? ", " : "",
                small_counts[c], r->raw_small[c][0], r->raw_small[c][1], r->hvd_small[c]);
    fprintf(f, "],\n \"mid\": [");
    for (int m = 0; m < N_MID; m++)
        fprintf(f, "%s{\"bytes\": %zu, \"raw\": [%.9g, %.9g], \"hvd\": %.9g}", m ? ", " : "",
                mid_bytes[m], r->raw_mid[m][0], r->raw_mid[m][1], r->hvd_mid[m]);
    fprintf(f, "],\n \"cache_path_us\": [%.9g, %.9g], \"full_path_us\": [%.9g, %.9g],\n",
            r->cost[0][0].idle_cycle * 1e6, r->cost[1][0].idle_cycle * 1e6,
            r->cost[0][1].neg_min * 1e6, r->cost[1][1].neg_min * 1e6);
    fprintf(f, " \"step_100\": [%.9g, %.9g], \"step_1000\": [%.9g, %.9g]}\n", r->c100.step_s,
            r->n100.step_s, r->c1000.step_s, r->n1000.step_s);
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    options o = {.large_iters = 5, .small_steps = 10, .neg_steps = 50, .mid_iters = 50};
    for (int i = 1; i < argc; i += 2) {
        int *count = !strcmp(argv[i], "--large-iters")   ? &o.large_iters
                     : !strcmp(argv[i], "--small-steps") ? &o.small_steps
                     : !strcmp(argv[i], "--neg-steps")   ? &o.neg_steps
                     : !strcmp(argv[i], "--mid-iters")   ? &o.mid_iters
                     : !strcmp(argv[i], "--cache-slots") ? &o.cache_slots
                                                         : NULL;
        bool json = !strcmp(argv[i], "--json");
        char *end = NULL;
        long v = count && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if ((!count && !json) || i + 1 >= argc ||
            (count && (end == argv[i + 1] || *end || v < 1 || v > 1000000))) {
            fprintf(stderr,
                    "bench_runtime: bad option '%s': use --large-iters N, --small-steps N, "
                    "--neg-steps N, --mid-iters N, --cache-slots N (each 1 to 1000000), "
                    "--json FILE\n",
                    argv[i]);
            return 2;
        }
        if (count) *count = (int)v;
        if (json) o.json = argv[i + 1];
    }
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_runtime needs MPI_THREAD_MULTIPLE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    results r;
    run_all(&o, &r);
    if (rank_ == 0) {
        print_results(&o, &r);
        if (o.json && write_json(o.json, &o, &r) != 0) {
            fprintf(stderr, "bench_runtime: cannot write %s\n", o.json);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Finalize();
    return 0;
}
