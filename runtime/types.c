/* Element types: sizes, names, binary16/bfloat16 conversion, and the host kernels that
 * reduce and scale buffers (used by the MPI ops for f16/bf16 and by fused scaling). */
#include "types.h"

#include <float.h>
#include <math.h>
#include <string.h>

static const size_t dtype_sizes[HVD_NUM_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const dtype_names[HVD_NUM_DTYPES] = {
    "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
static const char *const op_names[HVD_NUM_REDUCE_OPS] = {"sum", "average", "min", "max", "product"};

bool rt_dtype_valid(int dtype) {
    return dtype >= 0 && dtype < HVD_NUM_DTYPES;
}

bool rt_dtype_is_float(hvd_dtype t) {
    return t == HVD_FLOAT16 || t == HVD_BFLOAT16 || t == HVD_FLOAT32 || t == HVD_FLOAT64;
}

size_t rt_dtype_size(hvd_dtype t) {
    return rt_dtype_valid((int)t) ? dtype_sizes[t] : 0;
}

size_t hvd_dtype_size(hvd_dtype dtype) {
    return rt_dtype_size(dtype);
}

const char *hvd_dtype_name(hvd_dtype dtype) {
    return rt_dtype_valid((int)dtype) ? dtype_names[dtype] : "?";
}

const char *hvd_reduce_op_name(hvd_reduce_op op) {
    return (int)op >= 0 && op < HVD_NUM_REDUCE_OPS ? op_names[op] : "?";
}

/* ---- binary16 / bfloat16 ------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t hvd_float_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;
    if (exp == 0xff) /* inf or NaN (keep a quiet NaN) */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (e <= 0) {
        /* Subnormal half (or zero): shift the mantissa with its implicit bit into place and
         * round to nearest even on the bits shifted out. */
        if (e < -10) return sign;
        uint32_t m = mant | 0x800000u;
        int shift = 14 - e;
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    /* Rounding may carry into the exponent, which correctly yields the next binade or inf. */
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

float hvd_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t hvd_float_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) /* NaN: keep it a quiet NaN */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

float hvd_bf16_to_float(uint16_t b) {
    return bits_f32((uint32_t)b << 16);
}

/* ---- reduction kernels --------------------------------------------------------------- */

/* One loop per (C type, op); AVERAGE reduces like SUM (the division comes afterwards). The
 * integer SUM/PRODUCT wrap modulo 2^bits like MPI's, computed in unsigned arithmetic so that
 * overflow is defined. */
#define REDUCE_INT(T, UT)                                                                          \
    do {                                                                                           \
        T *a = (T *)inout;                                                                         \
        const T *b = (const T *)in;                                                                \
        switch (op) {                                                                              \
        case HVD_OP_SUM:                                                                           \
        case HVD_OP_AVERAGE:                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] = (T)((UT)a[i] + (UT)b[i]);                                                   \
            break;                                                                                 \
        case HVD_OP_PRODUCT:                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] = (T)((UT)a[i] * (UT)b[i]);                                                   \
            break;                                                                                 \
        case HVD_OP_MIN:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                if (b[i] < a[i]) a[i] = b[i];                                                      \
            break;                                                                                 \
        case HVD_OP_MAX:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                if (b[i] > a[i]) a[i] = b[i];                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define REDUCE_FLOAT(T)                                                                            \
    do {                                                                                           \
        T *a = (T *)inout;                                                                         \
        const T *b = (const T *)in;                                                                \
        switch (op) {                                                                              \
        case HVD_OP_SUM:                                                                           \
        case HVD_OP_AVERAGE:                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] += b[i];                                                                      \
            break;                                                                                 \
        case HVD_OP_PRODUCT:                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] *= b[i];                                                                      \
            break;                                                                                 \
        case HVD_OP_MIN:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] = b[i] < a[i] ? b[i] : a[i];                                                  \
            break;                                                                                 \
        case HVD_OP_MAX:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                a[i] = b[i] > a[i] ? b[i] : a[i];                                                  \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* 16-bit floats reduce in binary32 and round once per pairwise step, like NCCL does. */
static void reduce_half(uint16_t *a, const uint16_t *b, int64_t n, hvd_reduce_op op,
                        float (*to)(uint16_t), uint16_t (*from)(float)) {
    for (int64_t i = 0; i < n; i++) {
        float x = to(a[i]), y = to(b[i]), r;
        switch (op) {
        case HVD_OP_PRODUCT:
            r = x * y;
            break;
        case HVD_OP_MIN:
            r = y < x ? y : x;
            break;
        case HVD_OP_MAX:
            r = y > x ? y : x;
            break;
        default:
            r = x + y;
            break;
        }
        a[i] = from(r);
    }
}

void rt_reduce(void *inout, const void *in, int64_t n, hvd_dtype t, hvd_reduce_op op) {
    switch (t) {
    case HVD_UINT8:
        REDUCE_INT(uint8_t, uint8_t);
        break;
    case HVD_INT8:
        REDUCE_INT(int8_t, uint8_t);
        break;
    case HVD_INT32:
        REDUCE_INT(int32_t, uint32_t);
        break;
    case HVD_INT64:
        REDUCE_INT(int64_t, uint64_t);
        break;
    case HVD_FLOAT16:
        reduce_half(inout, in, n, op, hvd_f16_to_float, hvd_float_to_f16);
        break;
    case HVD_BFLOAT16:
        reduce_half(inout, in, n, op, hvd_bf16_to_float, hvd_float_to_bf16);
        break;
    case HVD_FLOAT32:
        REDUCE_FLOAT(float);
        break;
    case HVD_FLOAT64:
        REDUCE_FLOAT(double);
        break;
    }
}

/* ---- scaling ------------------------------------------------------------------------- */

static double saturate(double v, double lo, double hi) {
    if (isnan(v)) return 0;
    return v < lo ? lo : v > hi ? hi : v;
}

#define SCALE_INT(T, LO, HI)                                                                       \
    do {                                                                                           \
        T *a = (T *)buf;                                                                           \
        for (int64_t i = 0; i < n; i++)                                                            \
            a[i] = (T)saturate(trunc((double)a[i] * factor), LO, HI);                              \
    } while (0)

/* The float kernels below run over every gradient of an averaged allreduce (23 MB per step
 * for the 5.8M-parameter MLP of bench/torch), so they are built for AVX2 as well where the
 * compiler can (picked at load time by the CPU), and vectorised (CMakeLists.txt). */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute) &&                       \
    !defined(RT_NO_CPU_CLONES) /* ifunc: glibc; off under the sanitizers (CMakeLists.txt) */
#if __has_attribute(target_clones)
#define RT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef RT_VECTOR_CLONES
#define RT_VECTOR_CLONES
#endif

/* float32 by a factor: in float when the factor is a normal float (then a * factor in float
 * rounds the exact product once, as the double product rounded to float does: the same bits,
 * and twice the elements per instruction), else through double. A subnormal factor goes
 * through double: with denormals-are-zero set (torch.set_flush_denormal) float would read it
 * as 0. */
RT_VECTOR_CLONES static void scale_f32(float *a, int64_t n, double factor) {
    float f = (float)factor;
    if ((double)f == factor && fabs(factor) >= FLT_MIN) {
        for (int64_t i = 0; i < n; i++)
            a[i] *= f;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        a[i] = (float)((double)a[i] * factor);
}

RT_VECTOR_CLONES static void scale_f64(double *a, int64_t n, double factor) {
    for (int64_t i = 0; i < n; i++)
        a[i] *= factor;
}

void rt_scale(void *buf, int64_t n, hvd_dtype t, double factor) {
    if (factor == 1.0) return;
    switch (t) {
    case HVD_UINT8:
        SCALE_INT(uint8_t, 0, 255);
        break;
    case HVD_INT8:
        SCALE_INT(int8_t, -128, 127);
        break;
    case HVD_INT32:
        SCALE_INT(int32_t, -2147483648.0, 2147483647.0);
        break;
    case HVD_INT64:
        /* 2^63 is not representable in int64; the largest double below it is. */
        SCALE_INT(int64_t, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case HVD_FLOAT16: {
        uint16_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = hvd_float_to_f16((float)((double)hvd_f16_to_float(a[i]) * factor));
        break;
    }
    case HVD_BFLOAT16: {
        uint16_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = hvd_float_to_bf16((float)((double)hvd_bf16_to_float(a[i]) * factor));
        break;
    }
    case HVD_FLOAT32:
        scale_f32(buf, n, factor);
        break;
    case HVD_FLOAT64:
        scale_f64(buf, n, factor);
        break;
    }
}

void rt_int_divide(void *buf, int64_t n, hvd_dtype t, int64_t divisor) {
    if (divisor == 1) return;
    switch (t) {
    case HVD_UINT8: {
        uint8_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = (uint8_t)(a[i] / divisor);
        break;
    }
    case HVD_INT8: {
        int8_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = (int8_t)(a[i] / divisor);
        break;
    }
    case HVD_INT32: {
        int32_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = (int32_t)(a[i] / divisor);
        break;
    }
    case HVD_INT64: {
        int64_t *a = buf;
        for (int64_t i = 0; i < n; i++)
            a[i] = a[i] / divisor;
        break;
    }
    default:
        break;
    }
}

void rt_finish_reduction(void *buf, int64_t n, hvd_dtype t, hvd_reduce_op op, int size,
                         double postscale) {
    if (op == HVD_OP_AVERAGE) {
        if (rt_dtype_is_float(t)) {
            /* One multiplication, so average and postscale round once. */
            rt_scale(buf, n, t, postscale / size);
            return;
        }
        rt_int_divide(buf, n, t, size);
    }
    rt_scale(buf, n, t, postscale);
}
