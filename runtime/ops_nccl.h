/* Collectives on CUDA device buffers with NCCL (built when CMake finds CUDA and NCCL; the
 * libraries themselves are loaded with dlopen at first use). */
#ifndef HVD_RUNTIME_OPS_NCCL_H
#define HVD_RUNTIME_OPS_NCCL_H

#include <stddef.h>

#include "hvd/error.h"
#include "ops.h"

typedef struct rt_nccl rt_nccl;

/* The NCCL state of this rank (no communicator yet). Returns NULL on out of memory. */
rt_nccl *rt_nccl_create(void);
void rt_nccl_free(rt_nccl *n);
/* Makes the device fusion buffer on CUDA device `device` hold at least bytes. Called by the
 * cycle before the ranks agree on the cycle's work, so that a rank without device memory can
 * say so instead of failing inside a collective. Returns 0, or -1 (the old buffer may be
 * gone). */
int rt_nccl_reserve_fusion(rt_nccl *n, int device, size_t bytes);
/* A joined rank's stand-in buffers on `device`, of at least bytes each: *zeros holds zeros
 * (the collectives only read it), *sink receives. Kept and grown across calls. Returns 0, or
 * -1 if the device memory cannot be had. */
int rt_nccl_stand_in_buffers(rt_nccl *n, int device, size_t bytes, void **zeros, void **sink);
/* Runs one group on device buffers (communicator created on first use, its id broadcast
 * over x->comm). Returns 0, or -1 with err. */
int rt_nccl_execute(rt_exec *x, rt_group *g, hvd_err *err);
/* NULL if the CUDA runtime and NCCL could be loaded, else why not. */
const char *rt_cuda_unavailable(void);
/* Number of CUDA devices, or 0 if CUDA is unusable. */
int rt_cuda_device_count(void);
/* cudaFree. */
void rt_cuda_free(void *p);

#endif
