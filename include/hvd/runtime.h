/* The collective runtime: Horovod's core, in C (docs/runtime.md).
 *
 * A training process calls hvd_init() once, submits *named* collectives from any thread, and
 * waits for their handles. A background thread negotiates every HOROVOD_CYCLE_TIME which names
 * are ready on every rank, agrees on one global order (so ranks may submit in different orders
 * without deadlock), fuses small allreduces into one call, and runs them on MPI (host buffers)
 * or NCCL (CUDA device buffers).
 *
 * Conventions:
 *  - Functions that can fail take an `hvd_err *` (may be NULL) and return 0 on success, -1 on
 *    failure with one sentence in err->msg and an hvd_status in err->code.
 *  - A name identifies one collective across ranks: every rank must submit the same name with
 *    the same type, element count (or row size), reduce op, root and device kind, otherwise
 *    every rank's handle for that name fails with a message naming the ranks that disagree.
 *    A name may be reused once its previous use has completed (steps of a training loop).
 *    Passing name NULL gives "<op>.noname.<n>", which only works when every rank makes its
 *    unnamed calls of that op in the same order.
 *  - Buffers are host memory when device is HVD_DEVICE_CPU, else CUDA device memory on that
 *    device ordinal. They must stay valid and untouched until the handle completes. Device
 *    data must be ready when submitted (synchronize the stream that produced it).
 *  - Element counts are int64_t; "rows" are first-dimension slices of row_elems elements.
 */
#ifndef HVD_RUNTIME_H
#define HVD_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. The numbers travel between ranks: never renumber. */
typedef enum hvd_dtype {
    HVD_UINT8 = 0,
    HVD_INT8 = 1,
    HVD_INT32 = 2,
    HVD_INT64 = 3,
    HVD_FLOAT16 = 4,  /* IEEE 754 binary16, stored as uint16_t */
    HVD_BFLOAT16 = 5, /* bfloat16 (upper half of a binary32), stored as uint16_t */
    HVD_FLOAT32 = 6,
    HVD_FLOAT64 = 7,
} hvd_dtype;
#define HVD_NUM_DTYPES 8

/* Reductions. AVERAGE is SUM divided by the number of ranks; for integer types the division
 * truncates toward zero. */
typedef enum hvd_reduce_op {
    HVD_OP_SUM = 0,
    HVD_OP_AVERAGE = 1,
    HVD_OP_MIN = 2,
    HVD_OP_MAX = 3,
    HVD_OP_PRODUCT = 4,
} hvd_reduce_op;
#define HVD_NUM_REDUCE_OPS 5

/* The device argument for host memory; 0, 1, ... name CUDA devices. */
#define HVD_DEVICE_CPU (-1)

/* A submitted collective. Valid handles are > 0. */
typedef int64_t hvd_handle;

/* Output of collectives whose result size is only known after negotiation (allgather,
 * alltoall). The caller owns the struct and keeps it alive until the handle completes; the
 * runtime fills it then. Release the memory with hvd_output_free(). */
typedef struct hvd_output {
    void *data;         /* first_dim * row_elems elements: malloc'd (host) or cudaMalloc'd
                           (device); NULL when the result is empty */
    int64_t first_dim;  /* rows in data */
    int64_t *rank_rows; /* hvd_size() entries, malloc'd: rows that each rank contributed
                           (allgather) or that this rank received from each rank (alltoall) */
    size_t bytes;       /* size of data in bytes */
    int device;         /* where data lives: HVD_DEVICE_CPU or a CUDA device ordinal */
} hvd_output;

/* Counters of the background engine, for benchmarks and tests. */
typedef struct hvd_stats {
    uint64_t cycles;               /* background cycles run */
    uint64_t full_negotiations;    /* cycles that gathered requests at the coordinator */
    uint64_t cached_responses;     /* tensors scheduled through the response cache bit vector */
    uint64_t negotiated_responses; /* tensors scheduled through the coordinator */
    uint64_t tensors_done;         /* tensors completed (successfully or not) */
    uint64_t collective_calls;     /* collective calls issued to MPI/NCCL for tensors */
    uint64_t fused_calls;          /* of those, calls that carried more than one tensor */
    uint64_t negotiation_ns;       /* time spent in negotiation (bit vector + gather/broadcast) */
    uint64_t busy_cycles;          /* cycles that scheduled at least one tensor */
    uint64_t busy_negotiation_ns;  /* negotiation time of those cycles */
    uint64_t stall_warnings;       /* stall inspector reports printed (coordinator only) */
} hvd_stats;

/* ---- Lifecycle ----------------------------------------------------------------------- */

/* Starts the runtime: initializes MPI if the process has not (MPI_THREAD_FUNNELED, on the
 * background thread, which then makes every MPI call), or uses the application's MPI, which
 * must then be initialized with MPI_THREAD_MULTIPLE. Reads the HOROVOD_* knobs
 * (docs/runtime.md); rank 0's values win. Calling it again while running does nothing.
 * Returns 0 on success, -1 on failure (bad knob, MPI or thread failure, MPI finalized by an
 * earlier hvd_shutdown, or ranks started by another MPI's launcher than the one the runtime
 * was built against: Open MPI 4's orted, Open MPI 5's prted, MPICH's Hydra, told apart by the
 * variables each sets; the message names both). */
int hvd_init(hvd_err *err);

/* Stops the runtime on every rank: the background threads agree on the stop in their next
 * cycle, run what is ready on all ranks, and fail every other pending handle (on every rank)
 * with HVD_E_SHUTDOWN and a message naming the tensor and the ranks involved. Joins the
 * thread and finalizes MPI if hvd_init initialized it. Handles that were not waited for stay
 * valid for hvd_wait/hvd_poll. Returns 0 (also when the runtime was not running). */
int hvd_shutdown(void);

/* 1 while the runtime is running on this rank (after hvd_init and until the background thread
 * stops, which any rank's hvd_shutdown causes), else 0. */
int hvd_is_running(void);

/* Ranks and sizes. Each returns -1 before a successful hvd_init and after hvd_shutdown (they
 * stay valid while the runtime is stopped by another rank's shutdown). local = this host
 * (MPI_COMM_TYPE_SHARED); cross = ranks with the same local rank, one per host. */
int hvd_rank(void);
int hvd_size(void);
int hvd_local_rank(void);
int hvd_local_size(void);
int hvd_cross_rank(void);
int hvd_cross_size(void);

/* 1 if this build has the NCCL backend (device buffers), else 0. */
int hvd_nccl_built(void);

/* The MPI this build was compiled against, from its mpi.h: "Open MPI 4.1.4", "Open MPI 5.0.11",
 * "MPICH 5.0.2". Any time, without hvd_init. */
const char *hvd_mpi_built_for(void);

/* ---- Asynchronous collectives -------------------------------------------------------- *
 * Each returns 0 and stores a handle in *handle once the request is queued, or -1 without a
 * handle if the arguments are invalid (bad type, negative count, NULL buffer, duplicate
 * pending name, device buffers without NCCL) or the runtime is not running. */

/* recvbuf[i] = op over ranks of sendbuf[i], for count elements. sendbuf may equal recvbuf. */
int hvd_allreduce_async(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                        hvd_dtype dtype, hvd_reduce_op op, int device, hvd_handle *handle,
                        hvd_err *err);

/* Like hvd_allreduce_async, with each rank's input multiplied by prescale before the
 * reduction and the result multiplied by postscale after it (AVERAGE's division included).
 * Only with HVD_OP_SUM and HVD_OP_AVERAGE. Integer types scale in double precision and
 * truncate toward zero, saturating at the type's range. */
int hvd_allreduce_scaled_async(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                               hvd_dtype dtype, hvd_reduce_op op, double prescale, double postscale,
                               int device, hvd_handle *handle, hvd_err *err);

/* Concatenates every rank's first_dim rows of row_elems elements in rank order into out.
 * first_dim may differ between ranks (0 included); row_elems must not. */
int hvd_allgather_async(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                        hvd_dtype dtype, int device, hvd_output *out, hvd_handle *handle,
                        hvd_err *err);

/* Copies root's count elements of buf into buf on every other rank. */
int hvd_broadcast_async(const char *name, void *buf, int64_t count, hvd_dtype dtype, int root,
                        int device, hvd_handle *handle, hvd_err *err);

/* Sends splits[r] rows (of row_elems elements) of sendbuf to rank r, in rank order; splits
 * has hvd_size() entries summing to at most first_dim (as Horovod's: the rows after them are
 * not sent), or is NULL for an even split (first_dim must then divide by the size). out
 * receives the rows from every rank, in rank order. */
int hvd_alltoall_async(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                       const int64_t *splits, hvd_dtype dtype, int device, hvd_output *out,
                       hvd_handle *handle, hvd_err *err);

/* Reduces first_dim rows of row_elems elements over ranks and leaves rank r the rows
 * [offset_r, offset_r + hvd_reducescatter_rows(first_dim, r, size)) in recvbuf, where the
 * first (first_dim % size) ranks get one row more than the others. */
int hvd_reducescatter_async(const char *name, const void *sendbuf, void *recvbuf, int64_t first_dim,
                            int64_t row_elems, hvd_dtype dtype, hvd_reduce_op op, int device,
                            hvd_handle *handle, hvd_err *err);

/* Completes once every rank has submitted its barrier. */
int hvd_barrier_async(hvd_handle *handle, hvd_err *err);

/* Horovod's join: this rank has no more data. Until every rank has joined, this rank takes
 * part in the allreduces the other ranks still submit with zeros of the agreed shape and type
 * (on CUDA device `device` for device tensors; HVD_DEVICE_CPU gives host zeros only, and a
 * device allreduce then fails on every rank with a message saying so); other collectives
 * submitted while a rank is joined fail on every rank. Average still divides by hvd_size():
 * a joined rank counts as a zero. Completes on every rank once the last rank joined, with
 * that rank in *last_rank (which must stay valid until the handle completes). */
int hvd_join_async(int device, int32_t *last_rank, hvd_handle *handle, hvd_err *err);

/* Rows that rank `rank` of `size` receives from a reducescatter of first_dim rows (-1 if the
 * arguments are invalid). */
int64_t hvd_reducescatter_rows(int64_t first_dim, int rank, int size);

/* ---- Completion ---------------------------------------------------------------------- */

/* Returns 1 if the handle has completed (successfully or not), 0 if it is still pending, -1 if
 * it is not a handle of this process (never issued, or already released by hvd_wait). Does
 * not release the handle. */
int hvd_poll(hvd_handle handle);

/* Blocks until the handle completes and releases it. Returns 0 if the collective succeeded,
 * -1 if it failed (mismatch across ranks, shutdown with the tensor pending, MPI/NCCL error)
 * or the handle is unknown, with the reason in err (HVD_E_NOT_FOUND, also for a thread that
 * waited for a handle another thread released meanwhile: wait for a handle in one thread).
 * Never waits for a rank that has stopped: shutdown anywhere fails every pending handle. */
int hvd_wait(hvd_handle handle, hvd_err *err);

/* ---- Synchronous convenience wrappers: submit and wait. Return as hvd_wait. ---------- */

int hvd_allreduce(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                  hvd_dtype dtype, hvd_reduce_op op, int device, hvd_err *err);
int hvd_allgather(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                  hvd_dtype dtype, int device, hvd_output *out, hvd_err *err);
int hvd_broadcast(const char *name, void *buf, int64_t count, hvd_dtype dtype, int root, int device,
                  hvd_err *err);
int hvd_alltoall(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                 const int64_t *splits, hvd_dtype dtype, int device, hvd_output *out, hvd_err *err);
int hvd_reducescatter(const char *name, const void *sendbuf, void *recvbuf, int64_t first_dim,
                      int64_t row_elems, hvd_dtype dtype, hvd_reduce_op op, int device,
                      hvd_err *err);
int hvd_barrier(hvd_err *err);
int hvd_join(int device, int32_t *last_rank, hvd_err *err);

/* ---- Helpers ------------------------------------------------------------------------- */

/* Frees out->data (free or cudaFree) and out->rank_rows and zeroes the struct. NULL is fine. */
void hvd_output_free(hvd_output *out);

/* Size of one element in bytes, or 0 for an invalid type. */
size_t hvd_dtype_size(hvd_dtype dtype);

/* Name of a type ("float32") or reduce op ("sum"); "?" when invalid. Never NULL. */
const char *hvd_dtype_name(hvd_dtype dtype);
const char *hvd_reduce_op_name(hvd_reduce_op op);

/* binary16 / bfloat16 <-> binary32 conversions (round to nearest even), for callers that fill
 * or read HVD_FLOAT16 / HVD_BFLOAT16 buffers. */
uint16_t hvd_float_to_f16(float f);
float hvd_f16_to_float(uint16_t h);
uint16_t hvd_float_to_bf16(float f);
float hvd_bf16_to_float(uint16_t b);

/* Copies the engine's counters into *out. Returns 0, or -1 if the runtime never started. */
int hvd_get_stats(hvd_stats *out);

#ifdef __cplusplus
}
#endif

#endif
