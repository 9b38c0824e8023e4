/* The public collective calls: argument checks, building the entry, and the synchronous
 * wrappers. Everything that can be checked on this rank alone is checked here, before the
 * request reaches other ranks; what needs other ranks (matching shapes) is checked by the
 * coordinator. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "entry.h"
#include "fault.h"
#include "hvd/runtime.h"
#include "mpi_check.h"
#include "state.h"
#include "types.h"
#ifdef HVD_HAVE_NCCL
#include "ops_nccl.h"
#endif

#ifdef HVD_HAVE_NCCL
/* The CUDA device this rank's device collectives use (the first one it submitted). */
static _Atomic int s_rank_device = -1;
#endif

/* Longest accepted name (the wire format allows 65535; this keeps logs readable). */
#define RT_MAX_NAME 4096

/* A new entry, or NULL with err on out of memory (nothing has reached other ranks). */
static rt_entry *new_entry(int optype, hvd_dtype dtype, int device, const char *name,
                           hvd_err *err) {
    rt_entry *e = rt_fault_hit(RT_FAULT_SUBMIT) ? NULL : rt_entry_new(optype, dtype, device);
    if (!e)
        hvd_err_set(err, HVD_E_INTERNAL, "%s of '%s': out of memory submitting the tensor",
                    rt_optype_name(optype), name ? name : "(unnamed)");
    return e;
}

static int check_common(const char *op, const char *name, hvd_dtype dtype, int device,
                        hvd_handle *handle, hvd_err *err) {
    if (!handle) return hvd_err_set(err, HVD_E_INVALID, "%s: the handle pointer is NULL", op);
    if (name && (!*name || strlen(name) > RT_MAX_NAME))
        return hvd_err_set(err, HVD_E_INVALID, "%s: a tensor name must have 1 to %d bytes", op,
                           RT_MAX_NAME);
    if (!rt_dtype_valid((int)dtype))
        return hvd_err_set(err, HVD_E_INVALID, "%s of '%s': %d is not an hvd_dtype", op,
                           name ? name : "(unnamed)", (int)dtype);
    if (device < HVD_DEVICE_CPU)
        return hvd_err_set(err, HVD_E_INVALID,
                           "%s of '%s': device %d is neither HVD_DEVICE_CPU nor "
                           "a CUDA ordinal",
                           op, name ? name : "(unnamed)", device);
    if (device >= 0) {
#ifdef HVD_HAVE_NCCL
        const char *why = rt_cuda_unavailable();
        if (why)
            return hvd_err_set(err, HVD_E_INVALID, "%s of '%s' on CUDA device %d: %s", op,
                               name ? name : "(unnamed)", device, why);
        int n = rt_cuda_device_count();
        if (device >= n)
            return hvd_err_set(err, HVD_E_INVALID,
                               "%s of '%s': CUDA device %d does not exist (this process sees %d)",
                               op, name ? name : "(unnamed)", device, n);
        /* One NCCL communicator per rank, on one device: refuse a second device here, on this
         * rank, rather than fail inside a collective the other ranks have entered. */
        int expected = -1;
        if (!atomic_compare_exchange_strong(&s_rank_device, &expected, device) &&
            expected != device)
            return hvd_err_set(
                err, HVD_E_INVALID,
                "%s of '%s': this rank already runs device collectives on CUDA device "
                "%d; use one device per rank",
                op, name ? name : "(unnamed)", expected);
#else
        return hvd_err_set(
            err, HVD_E_INVALID,
            "%s of '%s': device buffers need the NCCL backend, and this build has none "
            "(configure with CUDA and NCCL installed)",
            op, name ? name : "(unnamed)");
#endif
    }
    return 0;
}

/* Checks that rows * row_elems elements of dtype fit in memory sizes. */
static int check_extent(const char *op, const char *name, int64_t rows, int64_t row_elems,
                        hvd_dtype dtype, hvd_err *err) {
    if (rows < 0 || row_elems < 0)
        return hvd_err_set(err, HVD_E_INVALID, "%s of '%s': negative size (%lld x %lld)", op,
                           name ? name : "(unnamed)", (long long)rows, (long long)row_elems);
    if (row_elems && rows > INT64_MAX / row_elems / (int64_t)rt_dtype_size(dtype))
        return hvd_err_set(err, HVD_E_INVALID, "%s of '%s': %lld x %lld elements overflow", op,
                           name ? name : "(unnamed)", (long long)rows, (long long)row_elems);
    return 0;
}

static bool op_valid(hvd_reduce_op op) {
    return (int)op >= 0 && op < HVD_NUM_REDUCE_OPS;
}

int hvd_allreduce_scaled_async(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                               hvd_dtype dtype, hvd_reduce_op op, double prescale, double postscale,
                               int device, hvd_handle *handle, hvd_err *err) {
    if (check_common("allreduce", name, dtype, device, handle, err) ||
        check_extent("allreduce", name, count, 1, dtype, err))
        return -1;
    const char *n = name ? name : "(unnamed)";
    if (!op_valid(op))
        return hvd_err_set(err, HVD_E_INVALID, "allreduce of '%s': %d is not an hvd_reduce_op", n,
                           (int)op);
    if (count > 0 && (!sendbuf || !recvbuf))
        return hvd_err_set(err, HVD_E_INVALID, "allreduce of '%s': NULL buffer", n);
    if (!isfinite(prescale) || !isfinite(postscale))
        return hvd_err_set(err, HVD_E_INVALID, "allreduce of '%s': scale factors must be finite",
                           n);
    if ((prescale != 1.0 || postscale != 1.0) && op != HVD_OP_SUM && op != HVD_OP_AVERAGE)
        return hvd_err_set(err, HVD_E_INVALID,
                           "allreduce of '%s': prescale/postscale apply only to sum and average, "
                           "not %s",
                           n, hvd_reduce_op_name(op));
    rt_entry *e = new_entry(RT_ALLREDUCE, dtype, device, name, err);
    if (!e) return -1;
    e->p.op = (uint8_t)op;
    e->p.count = count;
    e->p.prescale = prescale;
    e->p.postscale = postscale;
    e->in = sendbuf;
    e->out = recvbuf;
    return rt_submit(e, name, handle, err);
}

int hvd_allreduce_async(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                        hvd_dtype dtype, hvd_reduce_op op, int device, hvd_handle *handle,
                        hvd_err *err) {
    return hvd_allreduce_scaled_async(name, sendbuf, recvbuf, count, dtype, op, 1.0, 1.0, device,
                                      handle, err);
}

int hvd_allgather_async(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                        hvd_dtype dtype, int device, hvd_output *out, hvd_handle *handle,
                        hvd_err *err) {
    if (check_common("allgather", name, dtype, device, handle, err) ||
        check_extent("allgather", name, first_dim, row_elems, dtype, err))
        return -1;
    const char *n = name ? name : "(unnamed)";
    if (!out) return hvd_err_set(err, HVD_E_INVALID, "allgather of '%s': NULL output", n);
    if (first_dim * row_elems > 0 && !sendbuf)
        return hvd_err_set(err, HVD_E_INVALID, "allgather of '%s': NULL buffer", n);
    memset(out, 0, sizeof *out);
    out->device = device;
    rt_entry *e = new_entry(RT_ALLGATHER, dtype, device, name, err);
    if (!e) return -1;
    e->p.row_elems = row_elems;
    e->rows = first_dim;
    e->in = sendbuf;
    e->result = out;
    return rt_submit(e, name, handle, err);
}

int hvd_broadcast_async(const char *name, void *buf, int64_t count, hvd_dtype dtype, int root,
                        int device, hvd_handle *handle, hvd_err *err) {
    if (check_common("broadcast", name, dtype, device, handle, err) ||
        check_extent("broadcast", name, count, 1, dtype, err))
        return -1;
    const char *n = name ? name : "(unnamed)";
    int size = rt_current_size(NULL); /* not running: rt_submit says so */
    if (size > 0 && (root < 0 || root >= size))
        return hvd_err_set(err, HVD_E_INVALID, "broadcast of '%s': root %d is not a rank (size %d)",
                           n, root, size);
    if (count > 0 && !buf)
        return hvd_err_set(err, HVD_E_INVALID, "broadcast of '%s': NULL buffer", n);
    rt_entry *e = new_entry(RT_BROADCAST, dtype, device, name, err);
    if (!e) return -1;
    e->p.count = count;
    e->p.root = root;
    e->in = buf;
    e->out = buf;
    return rt_submit(e, name, handle, err);
}

int hvd_alltoall_async(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                       const int64_t *splits, hvd_dtype dtype, int device, hvd_output *out,
                       hvd_handle *handle, hvd_err *err) {
    if (check_common("alltoall", name, dtype, device, handle, err) ||
        check_extent("alltoall", name, first_dim, row_elems, dtype, err))
        return -1;
    const char *n = name ? name : "(unnamed)";
    int size = rt_current_size(err);
    if (size <= 0) return hvd_err_prefix(err, "alltoall of '%s': ", n);
    if (!out) return hvd_err_set(err, HVD_E_INVALID, "alltoall of '%s': NULL output", n);
    if (first_dim * row_elems > 0 && !sendbuf)
        return hvd_err_set(err, HVD_E_INVALID, "alltoall of '%s': NULL buffer", n);
    int64_t *sp = malloc((size_t)size * sizeof *sp);
    if (!sp)
        return hvd_err_set(err, HVD_E_INTERNAL, "alltoall of '%s': out of memory for the splits",
                           n);
    if (splits) {
        int64_t sum = 0;
        for (int r = 0; r < size; r++) {
            if (splits[r] < 0 || splits[r] > first_dim - sum) {
                free(sp);
                return hvd_err_set(err, HVD_E_INVALID,
                                   "alltoall of '%s': splits must be >= 0 and sum to at most the "
                                   "first dimension %lld",
                                   n, (long long)first_dim);
            }
            sum += splits[r]; /* less than first_dim: the rows after them are not sent */
            sp[r] = splits[r];
        }
    } else {
        if (first_dim % size != 0) {
            free(sp);
            return hvd_err_set(
                err, HVD_E_INVALID,
                "alltoall of '%s': first dimension %lld does not divide by %d ranks; "
                "pass splits",
                n, (long long)first_dim, size);
        }
        for (int r = 0; r < size; r++)
            sp[r] = first_dim / size;
    }
    memset(out, 0, sizeof *out);
    out->device = device;
    rt_entry *e = new_entry(RT_ALLTOALL, dtype, device, name, err);
    if (!e) {
        free(sp);
        return -1;
    }
    e->p.row_elems = row_elems;
    e->rows = first_dim;
    e->splits = sp;
    e->in = sendbuf;
    e->result = out;
    return rt_submit(e, name, handle, err);
}

int64_t hvd_reducescatter_rows(int64_t first_dim, int rank, int size) {
    if (first_dim < 0 || size <= 0 || rank < 0 || rank >= size) return -1;
    return first_dim / size + (rank < first_dim % size ? 1 : 0);
}

int hvd_reducescatter_async(const char *name, const void *sendbuf, void *recvbuf, int64_t first_dim,
                            int64_t row_elems, hvd_dtype dtype, hvd_reduce_op op, int device,
                            hvd_handle *handle, hvd_err *err) {
    if (check_common("reducescatter", name, dtype, device, handle, err) ||
        check_extent("reducescatter", name, first_dim, row_elems, dtype, err))
        return -1;
    const char *n = name ? name : "(unnamed)";
    if (!op_valid(op))
        return hvd_err_set(err, HVD_E_INVALID, "reducescatter of '%s': %d is not an hvd_reduce_op",
                           n, (int)op);
    if (first_dim * row_elems > 0 && !sendbuf)
        return hvd_err_set(err, HVD_E_INVALID, "reducescatter of '%s': NULL send buffer", n);
    if (sendbuf && sendbuf == recvbuf)
        return hvd_err_set(err, HVD_E_INVALID,
                           "reducescatter of '%s': the receive buffer must not be the send buffer",
                           n);
    rt_entry *e = new_entry(RT_REDUCESCATTER, dtype, device, name, err);
    if (!e) return -1;
    e->p.op = (uint8_t)op;
    e->p.count = first_dim * row_elems;
    e->p.row_elems = row_elems;
    e->rows = first_dim;
    e->in = sendbuf;
    e->out = recvbuf;
    return rt_submit(e, name, handle, err);
}

int hvd_barrier_async(hvd_handle *handle, hvd_err *err) {
    if (!handle) return hvd_err_set(err, HVD_E_INVALID, "barrier: the handle pointer is NULL");
    rt_entry *e = new_entry(RT_BARRIER, HVD_UINT8, HVD_DEVICE_CPU, NULL, err);
    if (!e) return -1;
    return rt_submit(e, NULL, handle, err);
}

int hvd_join_async(int device, int32_t *last_rank, hvd_handle *handle, hvd_err *err) {
    if (!handle) return hvd_err_set(err, HVD_E_INVALID, "join: the handle pointer is NULL");
    if (!last_rank) return hvd_err_set(err, HVD_E_INVALID, "join: the last_rank pointer is NULL");
    if (check_common("join", NULL, HVD_UINT8, device, handle, err) != 0) return -1;
    /* The stand-ins for this rank's allreduces live on `device`; the request only says
     * whether there is one, which is all the coordinator needs (root, see params.h). */
    rt_entry *e = new_entry(RT_JOIN, HVD_UINT8, HVD_DEVICE_CPU, NULL, err);
    if (!e) return -1;
    e->device = device;
    e->p.root = device >= 0;
    e->out = last_rank;
    /* One name for every join: a second join while one is pending is refused. */
    return rt_submit(e, "hvd.join", handle, err);
}

/* ---- synchronous wrappers ------------------------------------------------------------- */

int hvd_allreduce(const char *name, const void *sendbuf, void *recvbuf, int64_t count,
                  hvd_dtype dtype, hvd_reduce_op op, int device, hvd_err *err) {
    hvd_handle h;
    if (hvd_allreduce_async(name, sendbuf, recvbuf, count, dtype, op, device, &h, err)) return -1;
    return hvd_wait(h, err);
}

int hvd_allgather(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                  hvd_dtype dtype, int device, hvd_output *out, hvd_err *err) {
    hvd_handle h;
    if (hvd_allgather_async(name, sendbuf, first_dim, row_elems, dtype, device, out, &h, err))
        return -1;
    return hvd_wait(h, err);
}

int hvd_broadcast(const char *name, void *buf, int64_t count, hvd_dtype dtype, int root, int device,
                  hvd_err *err) {
    hvd_handle h;
    if (hvd_broadcast_async(name, buf, count, dtype, root, device, &h, err)) return -1;
    return hvd_wait(h, err);
}

int hvd_alltoall(const char *name, const void *sendbuf, int64_t first_dim, int64_t row_elems,
                 const int64_t *splits, hvd_dtype dtype, int device, hvd_output *out,
                 hvd_err *err) {
    hvd_handle h;
    if (hvd_alltoall_async(name, sendbuf, first_dim, row_elems, splits, dtype, device, out, &h,
                           err))
        return -1;
    return hvd_wait(h, err);
}

int hvd_reducescatter(const char *name, const void *sendbuf, void *recvbuf, int64_t first_dim,
                      int64_t row_elems, hvd_dtype dtype, hvd_reduce_op op, int device,
                      hvd_err *err) {
    hvd_handle h;
    if (hvd_reducescatter_async(name, sendbuf, recvbuf, first_dim, row_elems, dtype, op, device, &h,
                                err))
        return -1;
    return hvd_wait(h, err);
}

int hvd_barrier(hvd_err *err) {
    hvd_handle h;
    if (hvd_barrier_async(&h, err)) return -1;
    return hvd_wait(h, err);
}

int hvd_join(int device, int32_t *last_rank, hvd_err *err) {
    hvd_handle h;
    if (hvd_join_async(device, last_rank, &h, err)) return -1;
    return hvd_wait(h, err);
}

const char *hvd_mpi_built_for(void) {
    return rt_mpi_built_for();
}

int hvd_nccl_built(void) {
#ifdef HVD_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

void hvd_output_free(hvd_output *out) {
    if (!out) return;
    if (out->device >= 0 && out->data) {
#ifdef HVD_HAVE_NCCL
        rt_cuda_free(out->data);
#endif
    } else {
        free(out->data);
    }
    free(out->rank_rows);
    memset(out, 0, sizeof *out);
    out->device = HVD_DEVICE_CPU;
}
