/* Helpers shared by the runtime tests: typed element access and an f16/bf16 codec written
 * independently of the runtime's (tests/runtime/test_runtime_units.c checks the two agree),
 * so results are judged by code that does not share the runtime's bugs. */
#ifndef HVD_RT_TESTLIB_H
#define HVD_RT_TESTLIB_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/runtime.h"
#include "testutil.h"

static const hvd_dtype all_dtypes[HVD_NUM_DTYPES] = {
    HVD_UINT8, HVD_INT8, HVD_INT32, HVD_INT64, HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64};

/* binary16 -> double by the definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals
 * 2^-14 * m/1024. */
static inline double tl_f16_decode(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m / 1024.0, -14);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

/* bfloat16 -> double: (-1)^s * 2^(e-127) * (1 + m/128). */
static inline double tl_bf16_decode(uint16_t b) {
    int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
    double v;
    if (e == 0)
        v = ldexp(m / 128.0, -126);
    else if (e == 255)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + m / 128.0, e - 127);
    return s ? -v : v;
}

/* Encoders for values that are exactly representable (the tests only use such inputs):
 * v = f * 2^x with f in [0.5, 1), so the stored mantissa is 2f - 1. */
static inline uint16_t tl_f16_encode(double v) {
    if (v == 0) return signbit(v) ? 0x8000 : 0;
    int s = v < 0, x;
    double f = frexp(fabs(v), &x); /* |v| = f * 2^x */
    int e = x - 1 + 15;
    if (e <= 0) return (uint16_t)((s << 15) | (int)lround(ldexp(fabs(v), 24)));
    int m = (int)lround((2 * f - 1) * 1024);
    return (uint16_t)((s << 15) | (e << 10) | m);
}

static inline uint16_t tl_bf16_encode(double v) {
    if (v == 0) return signbit(v) ? 0x8000 : 0;
    int s = v < 0, x;
    double f = frexp(fabs(v), &x);
    int e = x - 1 + 127;
    int m = (int)lround((2 * f - 1) * 128);
    return (uint16_t)((s << 15) | (e << 7) | m);
}

static inline void tl_set(void *buf, hvd_dtype t, int64_t i, double v) {
    switch (t) {
    case HVD_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case HVD_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case HVD_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case HVD_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case HVD_FLOAT16:
        ((uint16_t *)buf)[i] = tl_f16_encode(v);
        break;
    case HVD_BFLOAT16:
        ((uint16_t *)buf)[i] = tl_bf16_encode(v);
        break;
    case HVD_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case HVD_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    }
}

static inline double tl_get(const void *buf, hvd_dtype t, int64_t i) {
    switch (t) {
    case HVD_UINT8:
        return ((const uint8_t *)buf)[i];
    case HVD_INT8:
        return ((const int8_t *)buf)[i];
    case HVD_INT32:
        return ((const int32_t *)buf)[i];
    case HVD_INT64:
        return (double)((const int64_t *)buf)[i];
    case HVD_FLOAT16:
        return tl_f16_decode(((const uint16_t *)buf)[i]);
    case HVD_BFLOAT16:
        return tl_bf16_decode(((const uint16_t *)buf)[i]);
    case HVD_FLOAT32:
        return ((const float *)buf)[i];
    case HVD_FLOAT64:
        return ((const double *)buf)[i];
    }
    return NAN;
}

static inline size_t tl_esize(hvd_dtype t) {
    static const size_t s[] = {1, 1, 4, 8, 2, 2, 4, 8};
    return s[t];
}

static inline int tl_is_float(hvd_dtype t) {
    return t >= HVD_FLOAT16;
}

/* Allowed difference between a result and its reference for a type. */
static inline double tl_tol(hvd_dtype t, double ref) {
    double mag = fabs(ref) > 1 ? fabs(ref) : 1;
    switch (t) {
    case HVD_FLOAT16:
        return 1e-3 * mag;
    case HVD_BFLOAT16:
        return 8e-3 * mag;
    case HVD_FLOAT32:
        return 1e-6 * mag;
    case HVD_FLOAT64:
        return 1e-12 * mag;
    default:
        return 0;
    }
}

/* Compares n elements of got against want (doubles); reports the first mismatch. */
static inline int tl_check_array(const char *what, const void *got, hvd_dtype t, const double *want,
                                 int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = tl_get(got, t, i);
        if (!(fabs(g - want[i]) <= tl_tol(t, want[i]))) {
            fprintf(stderr, "%s: element %lld is %.9g, expected %.9g (%s)\n", what, (long long)i, g,
                    want[i], hvd_dtype_name(t));
            return 0;
        }
    }
    return 1;
}

/* Deterministic pseudo-random numbers for shuffles (xorshift64*). */
static inline uint64_t tl_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static inline void tl_shuffle(int *v, int n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(tl_rand(&s) % (uint64_t)(i + 1));
        int tmp = v[i];
        v[i] = v[j];
        v[j] = tmp;
    }
}

/* Starts the runtime or exits the test with a message. */
/* Checks that the runtime still works (after an error, a join): a Sum of rank + 1 named
 * `name` gives size * (size + 1) / 2 on this rank. */
static inline void tl_still_works(const char *name) {
    hvd_err err = {0};
    int size = hvd_size();
    int64_t x = hvd_rank() + 1, y = 0;
    int rc = hvd_allreduce(name, &x, &y, 1, HVD_INT64, HVD_OP_SUM, HVD_DEVICE_CPU, &err);
    CHECK_MSG(rc == 0 && y == (int64_t)size * (size + 1) / 2, "%s: rc %d y %lld: %s", name, rc,
              (long long)y, err.msg);
}

static inline void tl_init(void) {
    hvd_err err = {0};
    if (hvd_init(&err) != 0) {
        fprintf(stderr, "hvd_init failed: %s\n", err.msg);
        exit(1);
    }
}

#endif
