/* Collectives on CUDA device buffers with NCCL (built when CMake finds CUDA and NCCL).
 *
 * One NCCL communicator per rank, over the rank's CUDA device, created at the first device
 * collective: rank 0 makes the NCCL id and broadcasts it over the runtime's MPI communicator
 * (every rank reaches that point at the same group, because groups run in the agreed order).
 * Work goes to a private non-blocking stream; the background thread waits for the stream
 * before completing handles, so device results are ready for any stream when hvd_wait
 * returns. Shapes that NCCL cannot express directly are built from grouped point-to-point or
 * rooted calls, the way Horovod does: allgatherv = one broadcast per rank, alltoallv = send/recv
 * pairs, uneven reducescatter = one reduce per rank.
 *
 * A rank that runs out of memory must not leave the others inside a collective: the device
 * fusion buffer is reserved before the cycle's agreement (rt_nccl_reserve_fusion), the outputs
 * of allgather and alltoall are allocated before their data moves with the outcome agreed over
 * MPI, and integer scaling goes through a host staging buffer in chunks, so it needs no memory
 * it might not get. */
#include "ops_nccl.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "types.h"

/* CUDA and NCCL are loaded with dlopen at the first device collective (or device query), not
 * linked: a runtime built on a machine with CUDA must still load and run host collectives on
 * a CPU-only executor, where libcudart and libnccl do not exist. The headers still type-check
 * every call: each pointer has the type of the function it stands for. */
#define CUDA_FUNCTIONS(X)                                                                          \
    X(cudaSetDevice)                                                                               \
    X(cudaGetDeviceCount)                                                                          \
    X(cudaGetErrorString)                                                                          \
    X(cudaMalloc)                                                                                  \
    X(cudaFree)                                                                                    \
    X(cudaMemcpyAsync)                                                                             \
    X(cudaMemset)                                                                                  \
    X(cudaDeviceSynchronize)                                                                       \
    X(cudaStreamCreateWithFlags)                                                                   \
    X(cudaStreamSynchronize)                                                                       \
    X(cudaStreamDestroy)
#define NCCL_FUNCTIONS(X)                                                                          \
    X(ncclGetUniqueId)                                                                             \
    X(ncclCommInitRank)                                                                            \
    X(ncclCommDestroy)                                                                             \
    X(ncclGetErrorString)                                                                          \
    X(ncclAllReduce)                                                                               \
    X(ncclBroadcast)                                                                               \
    X(ncclReduce)                                                                                  \
    X(ncclSend)                                                                                    \
    X(ncclRecv)                                                                                    \
    X(ncclGroupStart)                                                                              \
    X(ncclGroupEnd)                                                                                \
    X(ncclRedOpCreatePreMulSum)                                                                    \
    X(ncclRedOpDestroy)

#define DECLARE_POINTER(f) __typeof__(f) *p_##f;
static struct {
    CUDA_FUNCTIONS(DECLARE_POINTER)
    NCCL_FUNCTIONS(DECLARE_POINTER)
} api;

static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static bool api_ok;
static char api_error[256];

static void *open_first(const char *a, const char *b) {
    void *h = dlopen(a, RTLD_NOW | RTLD_GLOBAL);
    return h ? h : dlopen(b, RTLD_NOW | RTLD_GLOBAL);
}

static void load_api(void) {
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    void *c = open_first(cudart, "libcudart.so");
    if (!c) {
        snprintf(api_error, sizeof api_error, "cannot load the CUDA runtime (%s): %s", cudart,
                 dlerror());
        return;
    }
    void *n = open_first("libnccl.so.2", "libnccl.so");
    if (!n) {
        snprintf(api_error, sizeof api_error, "cannot load NCCL (libnccl.so.2): %s", dlerror());
        return;
    }
#define LOAD(lib, f)                                                                               \
    if (!(*(void **)&api.p_##f = dlsym(lib, #f))) {                                                \
        snprintf(api_error, sizeof api_error, "%s lacks %s: too old?",                             \
                 lib == c ? cudart : "libnccl.so.2", #f);                                          \
        return;                                                                                    \
    }
#define LOAD_CUDA(f) LOAD(c, f)
#define LOAD_NCCL(f) LOAD(n, f)
    CUDA_FUNCTIONS(LOAD_CUDA)
    NCCL_FUNCTIONS(LOAD_NCCL)
    api_ok = true;
}

const char *rt_cuda_unavailable(void) {
    pthread_once(&api_once, load_api);
    return api_ok ? NULL : api_error;
}

struct rt_nccl {
    bool ready;  /* communicator created */
    bool failed; /* creation failed: every later device collective fails at once */
    int device;  /* CUDA ordinal the communicator runs on */
    ncclComm_t comm;
    cudaStream_t stream;
    void *fusion;      /* device fusion buffer */
    size_t fusion_cap; /* its size */
    int fusion_device; /* the device it is on */
    void *host_tmp;    /* staging for integer scaling, host_tmp_cap bytes (may be NULL) */
    size_t host_tmp_cap;
    unsigned char host_small[4096]; /* staging when host_tmp cannot be had */
    void *zeros, *sink;             /* a joined rank's stand-ins (hvd_join): input and output */
    size_t standin_cap;             /* bytes in each */
    int standin_device;
};

/* Integer scaling stages at most this much at a time. */
#define HOST_TMP_MAX (16u << 20)

rt_nccl *rt_nccl_create(void) {
    return calloc(1, sizeof(rt_nccl));
}

void rt_nccl_free(rt_nccl *n) {
    if (!n) return;
    if (n->ready) {
        api.p_cudaSetDevice(n->device);
        api.p_cudaStreamSynchronize(n->stream);
        api.p_ncclCommDestroy(n->comm);
        api.p_cudaStreamDestroy(n->stream);
    }
    if (n->fusion) {
        api.p_cudaSetDevice(n->fusion_device);
        api.p_cudaFree(n->fusion);
    }
    if (n->zeros || n->sink) {
        api.p_cudaSetDevice(n->standin_device);
        api.p_cudaFree(n->zeros);
        api.p_cudaFree(n->sink);
    }
    free(n->host_tmp);
    free(n);
}

int rt_nccl_reserve_fusion(rt_nccl *n, int device, size_t bytes) {
    if (bytes <= n->fusion_cap && n->fusion_device == device) return 0;
    if (rt_cuda_unavailable() || api.p_cudaSetDevice(device) != cudaSuccess) return -1;
    size_t cap = 1u << 20;
    while (cap < bytes)
        cap *= 2;
    void *p = NULL;
    if (n->fusion && n->fusion_device == device) {
        /* Free first: the old buffer may be what stands between the device and the new one. */
        api.p_cudaFree(n->fusion);
        n->fusion = NULL;
        n->fusion_cap = 0;
    }
    if (api.p_cudaMalloc(&p, cap) != cudaSuccess) return -1;
    if (n->fusion) {
        api.p_cudaSetDevice(n->fusion_device);
        api.p_cudaFree(n->fusion);
        api.p_cudaSetDevice(device);
    }
    n->fusion = p;
    n->fusion_cap = cap;
    n->fusion_device = device;
    return 0;
}

int rt_nccl_stand_in_buffers(rt_nccl *n, int device, size_t bytes, void **zeros, void **sink) {
    if (bytes > n->standin_cap || n->standin_device != device || !n->zeros) {
        if (rt_cuda_unavailable()) return -1;
        if (n->zeros || n->sink) {
            api.p_cudaSetDevice(n->standin_device);
            api.p_cudaFree(n->zeros);
            api.p_cudaFree(n->sink);
        }
        n->zeros = n->sink = NULL;
        n->standin_cap = 0;
        if (api.p_cudaSetDevice(device) != cudaSuccess ||
            api.p_cudaMalloc(&n->zeros, bytes) != cudaSuccess ||
            api.p_cudaMalloc(&n->sink, bytes) != cudaSuccess ||
            api.p_cudaMemset(n->zeros, 0, bytes) != cudaSuccess ||
            api.p_cudaDeviceSynchronize() != cudaSuccess) { /* zeros before any stream reads */
            if (n->zeros) api.p_cudaFree(n->zeros);
            if (n->sink) api.p_cudaFree(n->sink);
            n->zeros = n->sink = NULL;
            return -1;
        }
        n->standin_cap = bytes;
        n->standin_device = device;
    }
    *zeros = n->zeros;
    *sink = n->sink;
    return 0;
}

int rt_cuda_device_count(void) {
    int n = 0;
    if (rt_cuda_unavailable() || api.p_cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

void rt_cuda_free(void *p) {
    if (!rt_cuda_unavailable()) api.p_cudaFree(p);
}

static int cuda_fail(hvd_err *err, cudaError_t rc, const char *what, const char *name) {
    return hvd_err_set(err, HVD_E_INTERNAL, "%s for tensor '%s' failed: %s", what, name,
                       api.p_cudaGetErrorString(rc));
}

static int nccl_fail(hvd_err *err, ncclResult_t rc, const char *what, const char *name) {
    return hvd_err_set(err, HVD_E_INTERNAL, "%s for tensor '%s' failed: %s", what, name,
                       api.p_ncclGetErrorString(rc));
}

static ncclDataType_t nccl_dtype(hvd_dtype t) {
    switch (t) {
    case HVD_UINT8:
        return ncclUint8;
    case HVD_INT8:
        return ncclInt8;
    case HVD_INT32:
        return ncclInt32;
    case HVD_INT64:
        return ncclInt64;
    case HVD_FLOAT16:
        return ncclFloat16;
    case HVD_BFLOAT16:
        return ncclBfloat16;
    case HVD_FLOAT32:
        return ncclFloat32;
    case HVD_FLOAT64:
        return ncclFloat64;
    }
    return ncclUint8;
}

static ncclRedOp_t nccl_op(hvd_reduce_op op) {
    switch (op) {
    case HVD_OP_AVERAGE:
        return ncclAvg;
    case HVD_OP_MIN:
        return ncclMin;
    case HVD_OP_MAX:
        return ncclMax;
    case HVD_OP_PRODUCT:
        return ncclProd;
    default:
        return ncclSum;
    }
}

/* Creates the communicator on first use; collective over x->comm. */
static int ensure_comm(rt_exec *x, rt_nccl *n, int device, const char *name, hvd_err *err) {
    if (n->ready) {
        if (device != n->device)
            return hvd_err_set(
                err, HVD_E_INVALID,
                "tensor '%s' is on CUDA device %d, but this rank's NCCL communicator "
                "runs on device %d: use one device per rank",
                name, device, n->device);
        return api.p_cudaSetDevice(device) == cudaSuccess
                   ? 0
                   : hvd_err_set(err, HVD_E_INTERNAL, "api.p_cudaSetDevice(%d) failed", device);
    }
    if (n->failed)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "the NCCL communicator could not be created earlier; device collectives "
                           "are unavailable");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int ok = api.p_cudaSetDevice(device) == cudaSuccess;
    if (ok && x->rank == 0) ok = api.p_ncclGetUniqueId(&id) == ncclSuccess;
    int all_ok = 0;
    /* Agree before anyone enters ncclCommInitRank, which would wait forever for a rank that
     * gave up. */
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, x->comm) != MPI_SUCCESS || !all_ok ||
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, x->comm) != MPI_SUCCESS) {
        n->failed = true;
        return hvd_err_set(
            err, HVD_E_INTERNAL,
            "cannot set up NCCL for tensor '%s': CUDA device %d or the NCCL id failed "
            "on %s",
            name, device, ok ? "another rank" : "this rank");
    }
    ncclResult_t nr = api.p_ncclCommInitRank(&n->comm, x->size, id, x->rank);
    if (nr != ncclSuccess) {
        n->failed = true;
        return nccl_fail(err, nr, "ncclCommInitRank", name);
    }
    cudaError_t cr = api.p_cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (cr != cudaSuccess) {
        api.p_ncclCommDestroy(n->comm);
        n->failed = true;
        return cuda_fail(err, cr, "cudaStreamCreate", name);
    }
    n->device = device;
    n->ready = true;
    return 0;
}

/* With a timeline, each phase waits for the stream so its span shows real device time. */
static void phase_end(rt_exec *x, rt_nccl *n, rt_group *g) {
    if (!x->tl) return;
    api.p_cudaStreamSynchronize(n->stream);
    rt_ops_activity(x, g, NULL);
}

/* Host staging of up to `want` bytes: a buffer grown to at most HOST_TMP_MAX, or the small
 * one inside n when that cannot be had. Sets *cap to the room it offers. Never fails. */
static void *host_tmp(rt_nccl *n, size_t want, size_t *cap) {
    if (want > HOST_TMP_MAX) want = HOST_TMP_MAX;
    if (want > n->host_tmp_cap) {
        void *p = realloc(n->host_tmp, want);
        if (p) {
            n->host_tmp = p;
            n->host_tmp_cap = want;
        }
    }
    if (n->host_tmp) {
        *cap = n->host_tmp_cap;
        return n->host_tmp;
    }
    *cap = sizeof n->host_small;
    return n->host_small;
}

/* Scales device data through host memory, a staging buffer at a time (integer types with
 * prescale/postscale only: NCCL scales floats itself, and no CUDA kernels are compiled into
 * the runtime). */
static cudaError_t scale_via_host(rt_nccl *n, void *dev, int64_t count, hvd_dtype t,
                                  double factor) {
    if (factor == 1.0 || count == 0) return cudaSuccess;
    size_t es = rt_dtype_size(t), cap;
    void *h = host_tmp(n, (size_t)count * es, &cap);
    size_t per = cap / es;
    for (int64_t off = 0; off < count; off += (int64_t)per) {
        int64_t k = count - off < (int64_t)per ? count - off : (int64_t)per;
        char *d = (char *)dev + (size_t)off * es;
        size_t bytes = (size_t)k * es;
        cudaError_t rc = api.p_cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, n->stream);
        if (rc == cudaSuccess) rc = api.p_cudaStreamSynchronize(n->stream);
        if (rc != cudaSuccess) return rc;
        rt_scale(h, k, t, factor);
        rc = api.p_cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, n->stream);
        if (rc == cudaSuccess) rc = api.p_cudaStreamSynchronize(n->stream);
        if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
}

/* Reduces count elements of buf in place, with the group's op and scaling. */
static int reduce_in_place(rt_exec *x, rt_nccl *n, rt_group *g, void *buf, int64_t count,
                           hvd_err *err) {
    hvd_dtype t = g->p.dtype;
    hvd_reduce_op op = g->p.op;
    double pre = g->p.prescale, post = g->p.postscale;
    const char *name = g->entries[0]->name;
    ncclRedOp_t nop = nccl_op(op);
    bool custom = false;
    if ((pre != 1.0 || post != 1.0) && rt_dtype_is_float(t)) {
        /* sum(pre*x)*post == sum(pre*post*x): fold both factors (and AVERAGE's 1/size) into
         * NCCL's pre-multiplied sum. */
        double f = pre * post / (op == HVD_OP_AVERAGE ? x->size : 1);
        union {
            uint16_t h;
            float f32;
            double f64;
        } scalar;
        if (t == HVD_FLOAT16)
            scalar.h = hvd_float_to_f16((float)f);
        else if (t == HVD_BFLOAT16)
            scalar.h = hvd_float_to_bf16((float)f);
        else if (t == HVD_FLOAT32)
            scalar.f32 = (float)f;
        else
            scalar.f64 = f;
        ncclResult_t nr = api.p_ncclRedOpCreatePreMulSum(&nop, &scalar, nccl_dtype(t),
                                                         ncclScalarHostImmediate, n->comm);
        if (nr != ncclSuccess) return nccl_fail(err, nr, "ncclRedOpCreatePreMulSum", name);
        custom = true;
    } else if (pre != 1.0) {
        cudaError_t cr = scale_via_host(n, buf, count, t, pre);
        if (cr != cudaSuccess) return cuda_fail(err, cr, "prescale", name);
    }
    rt_ops_activity(x, g, "NCCL_ALLREDUCE");
    ncclResult_t nr =
        api.p_ncclAllReduce(buf, buf, (size_t)count, nccl_dtype(t), nop, n->comm, n->stream);
    if (custom) api.p_ncclRedOpDestroy(nop, n->comm);
    if (nr != ncclSuccess) {
        rt_ops_activity(x, g, NULL);
        return nccl_fail(err, nr, "ncclAllReduce", name);
    }
    phase_end(x, n, g);
    if (!custom && post != 1.0) {
        cudaError_t cr = scale_via_host(n, buf, count, t, post);
        if (cr != cudaSuccess) return cuda_fail(err, cr, "postscale", name);
    }
    return 0;
}

static int exec_allreduce(rt_exec *x, rt_nccl *n, rt_group *g, hvd_err *err) {
    size_t es = rt_dtype_size(g->p.dtype);
    if (g->total_elems == 0) return 0;
    cudaError_t cr;
    if (g->n == 1) {
        rt_entry *e = g->entries[0];
        if (e->in != e->out) {
            cr = api.p_cudaMemcpyAsync(e->out, e->in, (size_t)e->p.count * es,
                                       cudaMemcpyDeviceToDevice, n->stream);
            if (cr != cudaSuccess) return cuda_fail(err, cr, "cudaMemcpyAsync", e->name);
        }
        return reduce_in_place(x, n, g, e->out, e->p.count, err);
    }
    /* Reserved by the cycle before the ranks agreed on this cycle's work (and the cycle plans
     * without fusion on every rank when some rank could not), so no rank backs out here. */
    size_t bytes = (size_t)g->total_elems * es;
    if (!n->fusion || bytes > n->fusion_cap || n->fusion_device != n->device)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "internal error: the device fusion buffer was not reserved for '%s'",
                           g->entries[0]->name);
    char *fb = n->fusion;
    rt_ops_activity(x, g, "MEMCPY_IN_FUSION_BUFFER");
    size_t off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t b = (size_t)g->entries[i]->p.count * es;
        if (b) {
            cr = api.p_cudaMemcpyAsync(fb + off, g->entries[i]->in, b, cudaMemcpyDeviceToDevice,
                                       n->stream);
            if (cr != cudaSuccess)
                return cuda_fail(err, cr, "copy into the fusion buffer", g->entries[i]->name);
        }
        off += b;
    }
    phase_end(x, n, g);
    int rc = reduce_in_place(x, n, g, fb, g->total_elems, err);
    if (rc != 0) return rc;
    rt_ops_activity(x, g, "MEMCPY_OUT_FUSION_BUFFER");
    off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t b = (size_t)g->entries[i]->p.count * es;
        if (b) {
            cr = api.p_cudaMemcpyAsync(g->entries[i]->out, fb + off, b, cudaMemcpyDeviceToDevice,
                                       n->stream);
            if (cr != cudaSuccess)
                return cuda_fail(err, cr, "copy out of the fusion buffer", g->entries[i]->name);
        }
        off += b;
    }
    phase_end(x, n, g);
    return 0;
}

/* Allocates the device result of an allgather or alltoall (bytes) and agrees over MPI, before
 * any data moves, that every rank has it and its row counts (rows_ok). Returns 0 with *data
 * (NULL for 0 bytes), or -1 with the same err on every rank and nothing allocated. */
static int device_output(rt_exec *x, const char *op, const char *name, size_t bytes, bool rows_ok,
                         void **data, hvd_err *err) {
    *data = NULL;
    bool ok = rows_ok;
    if (bytes && api.p_cudaMalloc(data, bytes) != cudaSuccess) {
        *data = NULL;
        ok = false;
    }
    int failed_rank = -1;
    int rc = rt_ops_agree(x, ok, &failed_rank, NULL);
    if (rc == MPI_SUCCESS && failed_rank < 0) return 0;
    if (*data) api.p_cudaFree(*data);
    *data = NULL;
    if (rc != MPI_SUCCESS)
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Allreduce of %s checks for '%s' failed", op,
                           name);
    return hvd_err_set(err, HVD_E_INTERNAL,
                       "%s of tensor '%s' failed: rank %d ran out of memory for its result", op,
                       name, failed_rank);
}

static int exec_allgather(rt_exec *x, rt_nccl *n, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    size_t row_bytes = (size_t)e->p.row_elems * rt_dtype_size(e->p.dtype);
    /* Without memory for the row counts this rank still takes part, counting in scratch. */
    int64_t *rank_rows = calloc((size_t)size, sizeof *rank_rows);
    int64_t *rows = rank_rows ? rank_rows : x->rows;
    int rc = MPI_Allgather(&e->rows, 1, MPI_INT64_T, rows, 1, MPI_INT64_T, x->comm);
    if (rc != MPI_SUCCESS) {
        free(rank_rows);
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Allgather of first dimensions for '%s' failed",
                           e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += rows[r];
    size_t bytes = (size_t)total * row_bytes;
    void *data;
    if (device_output(x, "allgather", e->name, bytes, rank_rows != NULL, &data, err) != 0) {
        free(rank_rows);
        return -1;
    }
    if (bytes) {
        rt_ops_activity(x, g, "NCCL_ALLGATHER");
        api.p_ncclGroupStart();
        size_t off = 0;
        for (int r = 0; r < size; r++) {
            size_t b = (size_t)rank_rows[r] * row_bytes;
            if (b)
                api.p_ncclBroadcast(e->in, (char *)data + off, b, ncclUint8, r, n->comm, n->stream);
            off += b;
        }
        ncclResult_t nr = api.p_ncclGroupEnd();
        phase_end(x, n, g);
        if (nr != ncclSuccess) {
            api.p_cudaFree(data);
            free(rank_rows);
            return nccl_fail(err, nr, "grouped ncclBroadcast (allgather)", e->name);
        }
    }
    e->result->data = data;
    e->result->first_dim = total;
    e->result->rank_rows = rank_rows;
    e->result->bytes = bytes;
    e->result->device = e->device;
    return 0;
}

static int exec_broadcast(rt_exec *x, rt_nccl *n, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    size_t bytes = (size_t)e->p.count * rt_dtype_size(e->p.dtype);
    if (!bytes) return 0;
    rt_ops_activity(x, g, "NCCL_BROADCAST");
    ncclResult_t nr =
        api.p_ncclBroadcast(e->out, e->out, bytes, ncclUint8, e->p.root, n->comm, n->stream);
    phase_end(x, n, g);
    return nr == ncclSuccess ? 0 : nccl_fail(err, nr, "ncclBroadcast", e->name);
}

static int exec_alltoall(rt_exec *x, rt_nccl *n, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    size_t row_bytes = (size_t)e->p.row_elems * rt_dtype_size(e->p.dtype);
    int64_t *recv_rows = calloc((size_t)size, sizeof *recv_rows);
    int64_t *rows = recv_rows ? recv_rows : x->rows;
    if (MPI_Alltoall(e->splits, 1, MPI_INT64_T, rows, 1, MPI_INT64_T, x->comm) != MPI_SUCCESS) {
        free(recv_rows);
        return hvd_err_set(err, HVD_E_INTERNAL, "MPI_Alltoall of split sizes for '%s' failed",
                           e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += rows[r];
    size_t bytes = (size_t)total * row_bytes;
    void *data;
    if (device_output(x, "alltoall", e->name, bytes, recv_rows != NULL, &data, err) != 0) {
        free(recv_rows);
        return -1;
    }
    ncclResult_t nr = ncclSuccess;
    if (row_bytes) {
        rt_ops_activity(x, g, "NCCL_ALLTOALL");
        api.p_ncclGroupStart();
        size_t soff = 0, roff = 0;
        for (int r = 0; r < size; r++) {
            size_t sb = (size_t)e->splits[r] * row_bytes, rb = (size_t)recv_rows[r] * row_bytes;
            if (sb)
                api.p_ncclSend((const char *)e->in + soff, sb, ncclUint8, r, n->comm, n->stream);
            if (rb) api.p_ncclRecv((char *)data + roff, rb, ncclUint8, r, n->comm, n->stream);
            soff += sb;
            roff += rb;
        }
        nr = api.p_ncclGroupEnd();
        phase_end(x, n, g);
    }
    if (nr != ncclSuccess) {
        if (data) api.p_cudaFree(data);
        free(recv_rows);
        return nccl_fail(err, nr, "grouped ncclSend/ncclRecv (alltoall)", e->name);
    }
    e->result->data = data;
    e->result->first_dim = total;
    e->result->rank_rows = recv_rows;
    e->result->bytes = bytes;
    e->result->device = e->device;
    return 0;
}

static int exec_reducescatter(rt_exec *x, rt_nccl *n, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    if (e->p.count == 0) return 0;
    int size = x->size;
    size_t es = rt_dtype_size(e->p.dtype);
    int64_t first_dim = e->p.count / e->p.row_elems;
    rt_ops_activity(x, g, "NCCL_REDUCESCATTER");
    api.p_ncclGroupStart();
    int64_t off = 0;
    for (int r = 0; r < size; r++) {
        int64_t rows = hvd_reducescatter_rows(first_dim, r, size);
        size_t cnt = (size_t)(rows * e->p.row_elems);
        if (cnt)
            api.p_ncclReduce((const char *)e->in + (size_t)off * es,
                             r == x->rank ? e->out : (void *)e->in, cnt, nccl_dtype(e->p.dtype),
                             nccl_op(e->p.op), r, n->comm, n->stream);
        off += rows * e->p.row_elems;
    }
    ncclResult_t nr = api.p_ncclGroupEnd();
    phase_end(x, n, g);
    return nr == ncclSuccess ? 0
                             : nccl_fail(err, nr, "grouped ncclReduce (reducescatter)", e->name);
}

int rt_nccl_execute(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_nccl *n = x->nccl;
    rt_entry *e0 = g->entries[0];
    /* Submission already refused device buffers when CUDA is unavailable, so every rank
     * running this has it. */
    const char *why = rt_cuda_unavailable();
    if (why) return hvd_err_set(err, HVD_E_STATE, "tensor '%s': %s", e0->name, why);
    if (ensure_comm(x, n, e0->device, e0->name, err) != 0) return -1;
    int rc;
    switch (g->p.optype) {
    case RT_ALLREDUCE:
        rc = exec_allreduce(x, n, g, err);
        break;
    case RT_ALLGATHER:
        rc = exec_allgather(x, n, g, err);
        break;
    case RT_BROADCAST:
        rc = exec_broadcast(x, n, g, err);
        break;
    case RT_ALLTOALL:
        rc = exec_alltoall(x, n, g, err);
        break;
    case RT_REDUCESCATTER:
        rc = exec_reducescatter(x, n, g, err);
        break;
    default:
        rc = hvd_err_set(err, HVD_E_INTERNAL, "collective type %d has no NCCL implementation",
                         g->p.optype);
        break;
    }
    /* Results must be on the device before the handle completes. */
    cudaError_t cr = api.p_cudaStreamSynchronize(n->stream);
    if (rc == 0 && cr != cudaSuccess) rc = cuda_fail(err, cr, "cudaStreamSynchronize", e0->name);
    return rc;
}
