/* Element types: sizes, and the host kernels that reduce and scale buffers (used by the MPI
 * backend for float16/bfloat16, by scaled and averaged reductions, and by the NCCL backend's
 * integer scaling). The public side (hvd_dtype_size, the f16/bf16 conversions) is in
 * include/hvd/runtime.h. */
#ifndef HVD_RUNTIME_TYPES_H
#define HVD_RUNTIME_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/runtime.h"

bool rt_dtype_valid(int dtype);
bool rt_dtype_is_float(hvd_dtype t);
/* Bytes per element; 0 for an invalid type. */
size_t rt_dtype_size(hvd_dtype t);
/* inout[i] = inout[i] op in[i] for SUM, MIN, MAX, PRODUCT (AVERAGE reduces as SUM). */
void rt_reduce(void *inout, const void *in, int64_t n, hvd_dtype t, hvd_reduce_op op);
/* buf[i] *= factor (integers: computed in double, truncated toward zero, saturated). */
void rt_scale(void *buf, int64_t n, hvd_dtype t, double factor);
/* buf[i] /= divisor for integer types (truncating), used by AVERAGE. */
void rt_int_divide(void *buf, int64_t n, hvd_dtype t, int64_t divisor);
/* Applies what follows an AVERAGE/SUM reduction with scaling on host data: division by size
 * (AVERAGE) and postscale. */
void rt_finish_reduction(void *buf, int64_t n, hvd_dtype t, hvd_reduce_op op, int size,
                         double postscale);

#endif
