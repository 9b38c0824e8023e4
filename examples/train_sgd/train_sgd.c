/* Data-parallel training the Horovod way, in C.
 *
 * The data set (x, y = w_true . x + b_true + noise) is a pure function of the sample index,
 * so every rank can generate its own shard without reading files. Each step takes the next
 * global batch of `batch` samples; rank r computes the gradient sum over its slice of that
 * batch, and one allreduce (SUM, postscale 1/batch) gives every rank the batch-mean gradient.
 * Since each step's batch is the same whatever the number of ranks, the weights after
 * training on 4 ranks equal those on 1 rank up to floating-point summation order.
 *
 * Rank 0 initializes the weights and broadcasts them, as a real job would. */
#include "train_sgd.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/runtime.h"

#define NW (SGD_FEATURES + 1) /* weights + bias */

/* A hash of (sample, feature) mapped to [-1, 1): the data needs no storage. */
static double uniform(uint64_t a, uint64_t b) {
    uint64_t z = a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

static double true_weight(int k) {
    return k == SGD_FEATURES ? 0.5 : ((k % 2) ? -1.0 : 1.0) * (k + 1) / SGD_FEATURES;
}

static void sample(int j, double *x, double *y) {
    double t = true_weight(SGD_FEATURES);
    for (int k = 0; k < SGD_FEATURES; k++) {
        x[k] = uniform((uint64_t)j, (uint64_t)k);
        t += true_weight(k) * x[k];
    }
    *y = t + 0.01 * uniform((uint64_t)j, 1000);
}

/* Sums g over ranks and divides by the global batch: the batch-mean gradient. */
static int average_gradient(double *g, int batch, hvd_err *e) {
    hvd_handle h;
    if (hvd_allreduce_scaled_async("sgd.grad", g, g, NW, HVD_FLOAT64, HVD_OP_SUM, 1.0, 1.0 / batch,
                                   HVD_DEVICE_CPU, &h, e) != 0)
        return -1;
    return hvd_wait(h, e);
}

int sgd_train(const sgd_config *cfg, double *w, double *mse, char *err, size_t err_len) {
    int rank = hvd_rank(), size = hvd_size();
    hvd_err e = {0};
    if (cfg->batch <= 0 || cfg->samples < cfg->batch) {
        snprintf(err, err_len, "need 0 < batch (%d) <= samples (%d)", cfg->batch, cfg->samples);
        return -1;
    }
    /* Rank 0 draws the initial weights; the others start from garbage on purpose. */
    for (int k = 0; k < NW; k++)
        w[k] = rank == 0 ? 0.1 * uniform(424242, (uint64_t)k) : 1e9;
    if (hvd_broadcast("sgd.init", w, NW, HVD_FLOAT64, 0, HVD_DEVICE_CPU, &e) != 0) {
        snprintf(err, err_len, "broadcast of the initial weights failed: %s", e.msg);
        return -1;
    }
    int steps = cfg->samples / cfg->batch;
    double x[SGD_FEATURES], y;
    for (int epoch = 0; epoch < cfg->epochs; epoch++) {
        for (int s = 0; s < steps; s++) {
            /* This rank's slice of the global batch (the first batch % size ranks get one
             * sample more). */
            int base = cfg->batch / size, extra = cfg->batch % size;
            int lo = s * cfg->batch + rank * base + (rank < extra ? rank : extra);
            int hi = lo + base + (rank < extra ? 1 : 0);
            double g[NW] = {0};
            for (int j = lo; j < hi; j++) {
                sample(j, x, &y);
                double pred = w[SGD_FEATURES];
                for (int k = 0; k < SGD_FEATURES; k++)
                    pred += w[k] * x[k];
                double r = pred - y; /* d(r^2 / 2)/dw = r x */
                for (int k = 0; k < SGD_FEATURES; k++)
                    g[k] += r * x[k];
                g[SGD_FEATURES] += r;
            }
            if (average_gradient(g, cfg->batch, &e) != 0) {
                snprintf(err, err_len, "gradient allreduce (epoch %d, step %d) failed: %s", epoch,
                         s, e.msg);
                return -1;
            }
            for (int k = 0; k < NW; k++)
                w[k] -= cfg->lr * g[k];
        }
    }
    /* Mean squared error over the whole data set, each rank scoring its contiguous shard. */
    int base = cfg->samples / size, extra = cfg->samples % size;
    int lo = rank * base + (rank < extra ? rank : extra);
    int hi = lo + base + (rank < extra ? 1 : 0);
    double se = 0;
    for (int j = lo; j < hi; j++) {
        sample(j, x, &y);
        double pred = w[SGD_FEATURES];
        for (int k = 0; k < SGD_FEATURES; k++)
            pred += w[k] * x[k];
        se += (pred - y) * (pred - y);
    }
    if (hvd_allreduce("sgd.mse", &se, mse, 1, HVD_FLOAT64, HVD_OP_SUM, HVD_DEVICE_CPU, &e) != 0) {
        snprintf(err, err_len, "loss allreduce failed: %s", e.msg);
        return -1;
    }
    *mse /= cfg->samples;
    return 0;
}

/* Formats "w0 w1 ... b mse" with full precision. Returns the malloc'd text or NULL. */
static char *format_weights(const double *w, double mse, size_t *len) {
    size_t cap = (NW + 1) * 32 + 2, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int k = 0; k < NW; k++)
        n += (size_t)snprintf(s + n, cap - n, "%.17g ", w[k]);
    n += (size_t)snprintf(s + n, cap - n, "mse=%.17g\n", mse);
    *len = n;
    return s;
}

__attribute__((visibility("default"))) int hvd_example_train_sgd(const hvd_entry_ctx *ctx,
                                                                 hvd_entry_result *out) {
    sgd_config cfg = {.samples = 4096, .batch = 256, .epochs = 20, .lr = 0.2};
    if (ctx && ctx->arg_len > 7 && ctx->arg_len < 32 && memcmp(ctx->arg, "epochs=", 7) == 0) {
        char num[32];
        memcpy(num, ctx->arg + 7, ctx->arg_len - 7);
        num[ctx->arg_len - 7] = 0;
        cfg.epochs = atoi(num);
    }
    hvd_err e = {0};
    if (hvd_init(&e) != 0) {
        snprintf(out->error, sizeof out->error, "hvd_init failed: %s", e.msg);
        return 1;
    }
    double w[NW], mse = 0;
    int rc = sgd_train(&cfg, w, &mse, out->error, sizeof out->error);
    hvd_shutdown();
    if (rc != 0) return 1;
    out->data = (uint8_t *)format_weights(w, mse, &out->len);
    return 0;
}
