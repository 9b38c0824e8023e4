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
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd/elastic.h"
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

/* The initial weights: rank 0 draws them and broadcasts them (the others start from garbage
 * on purpose). */
static int init_weights(double *w, hvd_err *e) {
    for (int k = 0; k < NW; k++)
        w[k] = hvd_rank() == 0 ? 0.1 * uniform(424242, (uint64_t)k) : 1e9;
    return hvd_broadcast("sgd.init", w, NW, HVD_FLOAT64, 0, HVD_DEVICE_CPU, e);
}

/* One step on batch s of an epoch: this rank's slice of the global batch (the first batch %
 * size ranks get one sample more), the gradient averaged over the ranks, the update. */
static int step(const sgd_config *cfg, double *w, int s, hvd_err *e) {
    int rank = hvd_rank(), size = hvd_size();
    int base = cfg->batch / size, extra = cfg->batch % size;
    int lo = s * cfg->batch + rank * base + (rank < extra ? rank : extra);
    int hi = lo + base + (rank < extra ? 1 : 0);
    double g[NW] = {0}, x[SGD_FEATURES], y;
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
    if (average_gradient(g, cfg->batch, e) != 0) return -1;
    for (int k = 0; k < NW; k++)
        w[k] -= cfg->lr * g[k];
    return 0;
}

static int check_config(const sgd_config *cfg, char *err, size_t err_len) {
    if (cfg->batch > 0 && cfg->samples >= cfg->batch) return 0;
    snprintf(err, err_len, "need 0 < batch (%d) <= samples (%d)", cfg->batch, cfg->samples);
    return -1;
}

/* Mean squared error over the whole data set, each rank scoring its contiguous shard. */
static int score(const sgd_config *cfg, const double *w, double *mse, char *err, size_t err_len);

int sgd_train(const sgd_config *cfg, double *w, double *mse, char *err, size_t err_len) {
    hvd_err e = {0};
    if (check_config(cfg, err, err_len) != 0) return -1;
    if (init_weights(w, &e) != 0) {
        snprintf(err, err_len, "broadcast of the initial weights failed: %s", e.msg);
        return -1;
    }
    int steps = cfg->samples / cfg->batch;
    for (int epoch = 0; epoch < cfg->epochs; epoch++) {
        for (int s = 0; s < steps; s++) {
            if (step(cfg, w, s, &e) != 0) {
                snprintf(err, err_len, "gradient allreduce (epoch %d, step %d) failed: %s", epoch,
                         s, e.msg);
                return -1;
            }
        }
    }
    return score(cfg, w, mse, err, err_len);
}

static int score(const sgd_config *cfg, const double *w, double *mse, char *err, size_t err_len) {
    int rank = hvd_rank(), size = hvd_size();
    hvd_err e = {0};
    double x[SGD_FEATURES], y;
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

/* ---- Elastic training (include/hvd/elastic.h, docs/elastic.md) ------------------------------ */

/* What a rank commits: the weights and how many steps were taken. The same on every rank. */
typedef struct sgd_state {
    double w[NW];
    int64_t steps;
} sgd_state;

/* Rank 0 appends one line to the log file, if any (for tests and benchmarks: where the job is),
 * starting with the wall-clock time. */
static void log_line(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const char *path, const char *fmt, ...) {
    if (!path || hvd_rank() != 0) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "%lld.%03ld ", (long long)now.tv_sec, now.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

/* The state to start from: the newest commit that survives, or fresh weights. */
static int start_state(sgd_state *st, hvd_err *e) {
    void *buf = NULL;
    size_t len = 0;
    int r = hvd_elastic_restore(&buf, &len, e);
    if (r == 1 && len >= sizeof *st) memcpy(st, buf, sizeof *st); /* state_bytes: zeros after */
    free(buf);
    if (r < 0) return -1;
    if (r == 1 && len >= sizeof *st) return 0;
    st->steps = 0;
    return init_weights(st->w, e);
}

int sgd_train_elastic(const sgd_elastic_config *ec, double *w, double *mse, char *err,
                      size_t err_len) {
    const sgd_config *cfg = &ec->base;
    hvd_err e = {0};
    sgd_state st;
    if (check_config(cfg, err, err_len) != 0) return -1;
    if (start_state(&st, &e) != 0) {
        snprintf(err, err_len, "cannot restore the state: %s", e.msg);
        /* A task service or a rank went away: reset; else the next launch would fail alike. */
        return hvd_elastic_resettable(e.code) ? HVD_ELASTIC_EXIT_RESET : -1;
    }
    log_line(ec->log_path, "start size=%d commit=%llu steps=%lld\n", hvd_size(),
             (unsigned long long)hvd_elastic_commit_id(), (long long)st.steps);
    const char *host = getenv("HOROVOD_HOSTNAME");
    if ((ec->fail_host && host && !strcmp(host, ec->fail_host)) || hvd_rank() == ec->fail_rank) {
        snprintf(err, err_len, "rank %d on host %s fails on purpose", hvd_rank(),
                 host ? host : "?");
        return 3;
    }
    int per_epoch = cfg->samples / cfg->batch;
    int64_t total = (int64_t)cfg->epochs * per_epoch;
    size_t blob_len = ec->state_bytes > sizeof st ? ec->state_bytes : sizeof st;
    unsigned char *blob = blob_len > sizeof st ? calloc(1, blob_len) : NULL;
    if (blob_len > sizeof st && !blob) {
        snprintf(err, err_len, "out of memory for a state of %zu bytes", blob_len);
        return -1;
    }
    int rc = 0;
    while (rc == 0 && st.steps < total) {
        if (step(cfg, st.w, (int)(st.steps % per_epoch), &e) != 0) {
            /* In an elastic job a rank went away: the driver resets the job. */
            snprintf(err, err_len, "gradient allreduce (step %lld) failed: %s", (long long)st.steps,
                     e.msg);
            rc = hvd_elastic_enabled() ? HVD_ELASTIC_EXIT_RESET : -1;
            break;
        }
        st.steps++;
        if (ec->sleep_ms > 0) {
            struct timespec ts = {ec->sleep_ms / 1000, (long)(ec->sleep_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (st.steps % ec->commit_every != 0 && st.steps != total) continue;
        if (blob) memcpy(blob, &st, sizeof st);
        int r = hvd_elastic_commit(blob ? (void *)blob : &st, blob_len, &e);
        log_line(ec->log_path, "commit id=%llu steps=%lld size=%d\n",
                 (unsigned long long)hvd_elastic_commit_id(), (long long)st.steps, hvd_size());
        if (r == HVD_ELASTIC_RESET) { /* hosts changed: every rank is here, end together */
            hvd_shutdown();
            rc = HVD_ELASTIC_EXIT_RESET;
        } else if (r < 0) {
            snprintf(err, err_len, "commit %llu failed: %s",
                     (unsigned long long)hvd_elastic_commit_id() + 1, e.msg);
            /* A task service or a rank went away: reset. Else (a state over the limit, ...)
             * the next launch would fail alike: fail. */
            rc = hvd_elastic_resettable(e.code) ? HVD_ELASTIC_EXIT_RESET : -1;
        }
    }
    free(blob);
    if (rc != 0) return rc;
    memcpy(w, st.w, sizeof st.w);
    return score(cfg, w, mse, err, err_len);
}

/* "key=value,..." of the elastic entry point's argument into ec. */
static void parse_elastic_arg(const hvd_entry_ctx *ctx, sgd_elastic_config *ec, char *buf,
                              size_t cap) {
    size_t n = ctx->arg_len < cap - 1 ? ctx->arg_len : cap - 1;
    memcpy(buf, ctx->arg, n);
    buf[n] = '\0';
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *v = strchr(kv, '=');
        if (!v) continue;
        *v++ = '\0';
        if (!strcmp(kv, "epochs")) ec->base.epochs = atoi(v);
        if (!strcmp(kv, "commit")) ec->commit_every = atoi(v) > 0 ? atoi(v) : 1;
        if (!strcmp(kv, "sleep")) ec->sleep_ms = atoi(v);
        if (!strcmp(kv, "log")) ec->log_path = v;
        if (!strcmp(kv, "fail_host")) ec->fail_host = v;
        if (!strcmp(kv, "fail_rank")) ec->fail_rank = atoi(v);
        if (!strcmp(kv, "state_bytes")) ec->state_bytes = (size_t)strtoull(v, NULL, 10);
    }
}

__attribute__((visibility("default"))) int hvd_example_train_sgd_elastic(const hvd_entry_ctx *ctx,
                                                                         hvd_entry_result *out) {
    sgd_elastic_config ec = {.base = {.samples = 4096, .batch = 256, .epochs = 20, .lr = 0.2},
                             .commit_every = 4,
                             .fail_rank = -1};
    char arg[1024];
    parse_elastic_arg(ctx, &ec, arg, sizeof arg);
    hvd_err e = {0};
    if (hvd_init(&e) != 0) {
        snprintf(out->error, sizeof out->error, "hvd_init failed: %s", e.msg);
        return 1;
    }
    double w[NW], mse = 0;
    int rc = sgd_train_elastic(&ec, w, &mse, out->error, sizeof out->error);
    hvd_elastic_close();
    /* A rank that ends early (a reset, a failure) leaves the others in their collectives:
     * mpirun ends them; waiting for them in hvd_shutdown would hang. */
    if (rc == 0) hvd_shutdown();
    if (rc != 0) return rc < 0 ? 1 : rc;
    out->data = (uint8_t *)format_weights(w, mse, &out->len);
    return 0;
}
