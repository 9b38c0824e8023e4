/* The NCCL backend on CUDA device buffers: every type, the reductions and scaling, fusion on
 * device, allgather/broadcast/alltoall/reducescatter with device outputs, and a step that
 * mixes host and device tensors. References are computed on the host from the formula that
 * generated every rank's input. Works on 1 rank (one GPU, no mpirun: Open MPI's singleton
 * mode) and on N ranks (rank r uses GPU local_rank % device count).
 *
 * Exits 77 (skipped) when this build has no NCCL backend or the machine has no CUDA device,
 * saying so. `rt_test_gpu --mpi-only` starts the runtime and runs one host allreduce without
 * touching CUDA, to check an MPI installation (tests/gpu/run_gpu_tests.sh uses it to check
 * the carried Open MPI before blaming the GPU). */
#include <cuda_runtime.h>
#include <stdbool.h>
#include <string.h>

#include "../runtime/rt_testlib.h"

static int rank_, size_, dev_;

static double val(int r, int t, int64_t i, hvd_dtype dt) {
    double v = (double)((r * 7 + i * 3 + t * 5) % 9) - 4;
    if (dt == HVD_UINT8) v += 4;
    if (tl_is_float(dt) && (i + r) % 2) v += 0.5;
    return v;
}

static double pval(int r, int t, int64_t i, hvd_dtype dt) {
    double v = ((r + i + t) % 3 == 0) ? 2 : 1;
    if (dt != HVD_UINT8 && r == 0 && (i + t) % 5 == 0) v = -v;
    return v;
}

static double reduce_ref(hvd_reduce_op op, hvd_dtype dt, int t, int64_t i) {
    double acc = 0;
    for (int r = 0; r < size_; r++) {
        double v = op == HVD_OP_PRODUCT ? pval(r, t, i, dt) : val(r, t, i, dt);
        if (r == 0)
            acc = v;
        else if (op == HVD_OP_MIN)
            acc = v < acc ? v : acc;
        else if (op == HVD_OP_MAX)
            acc = v > acc ? v : acc;
        else if (op == HVD_OP_PRODUCT)
            acc *= v;
        else
            acc += v;
    }
    if (op == HVD_OP_AVERAGE) acc = tl_is_float(dt) ? acc / size_ : (double)((int64_t)acc / size_);
    return acc;
}

/* Host staging helpers. */
static void *to_device(const void *host, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (bytes) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void *to_host(const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost);
    return h;
}

static void *host_input(hvd_dtype dt, int t, int64_t n, bool product) {
    void *h = malloc((size_t)n * tl_esize(dt) + 1);
    for (int64_t i = 0; i < n; i++)
        tl_set(h, dt, i, product ? pval(rank_, t, i, dt) : val(rank_, t, i, dt));
    return h;
}

static const int64_t sizes[] = {0, 1, 7, 1025, 65537};
#define NSIZES 5

static void test_allreduce_every_type(void) {
    int t = 0;
    for (int d = 0; d < HVD_NUM_DTYPES; d++) {
        hvd_dtype dt = all_dtypes[d];
        for (int s = 0; s < NSIZES; s++) {
            int64_t n = sizes[s];
            size_t bytes = (size_t)n * tl_esize(dt);
            for (int op = 0; op < HVD_NUM_REDUCE_OPS; op++, t++) {
                void *h = host_input(dt, t, n, op == HVD_OP_PRODUCT);
                void *din = to_device(h, bytes), *dout = to_device(NULL, bytes);
                char name[64];
                snprintf(name, sizeof name, "gpu.ar.%s.%s.%lld", hvd_dtype_name(dt),
                         hvd_reduce_op_name((hvd_reduce_op)op), (long long)n);
                hvd_err err = {0};
                int rc = hvd_allreduce(name, din, dout, n, dt, (hvd_reduce_op)op, dev_, &err);
                CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
                void *got = to_host(dout, bytes);
                double *want = malloc(sizeof(double) * (size_t)n + 1);
                for (int64_t i = 0; i < n; i++)
                    want[i] = reduce_ref((hvd_reduce_op)op, dt, t, i);
                if (rc == 0) CHECK(tl_check_array(name, got, dt, want, n));
                free(h);
                free(got);
                free(want);
                cudaFree(din);
                cudaFree(dout);
            }
        }
    }
}

static void test_scaled_every_type(void) {
    for (int d = 0; d < HVD_NUM_DTYPES; d++) {
        hvd_dtype dt = all_dtypes[d];
        int64_t n = 1031;
        size_t bytes = (size_t)n * tl_esize(dt);
        int t = 500 + d;
        double pre = tl_is_float(dt) ? 0.5 : 2.0, post = tl_is_float(dt) ? 3.0 : 0.5;
        void *h = host_input(dt, t, n, false);
        void *dbuf = to_device(h, bytes); /* in place */
        char name[64];
        snprintf(name, sizeof name, "gpu.scaled.%s", hvd_dtype_name(dt));
        hvd_handle hd;
        hvd_err err = {0};
        int rc = hvd_allreduce_scaled_async(name, dbuf, dbuf, n, dt, HVD_OP_AVERAGE, pre, post,
                                            dev_, &hd, &err);
        if (rc == 0) rc = hvd_wait(hd, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        void *got = to_host(dbuf, bytes);
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            double sum = 0;
            for (int r = 0; r < size_; r++)
                sum += val(r, t, i, dt);
            if (tl_is_float(dt)) {
                want[i] = sum * pre * post / size_;
            } else {
                int64_t s2 = (int64_t)(sum * pre) / size_;
                want[i] = trunc((double)s2 * post);
            }
        }
        if (rc == 0) CHECK(tl_check_array(name, got, dt, want, n));
        free(h);
        free(got);
        free(want);
        cudaFree(dbuf);
    }
}

/* 64 small float32 tensors plus 64 bf16 ones in one step: fused on device. */
static void test_fusion_on_device(void) {
    enum { T = 64, N = 333 };
    void *din[2 * T], *dout[2 * T];
    hvd_handle h[2 * T];
    hvd_stats a, b;
    hvd_get_stats(&a);
    for (int k = 0; k < 2 * T; k++) {
        hvd_dtype dt = k < T ? HVD_FLOAT32 : HVD_BFLOAT16;
        void *hi = host_input(dt, 700 + k, N, false);
        din[k] = to_device(hi, N * tl_esize(dt));
        dout[k] = to_device(NULL, N * tl_esize(dt));
        free(hi);
        char name[32];
        snprintf(name, sizeof name, "gpu.fuse.%d", k);
        hvd_err err = {0};
        CHECK(hvd_allreduce_async(name, din[k], dout[k], N, dt, HVD_OP_SUM, dev_, &h[k], &err) ==
              0);
    }
    int bad = 0;
    for (int k = 0; k < 2 * T; k++) {
        hvd_dtype dt = k < T ? HVD_FLOAT32 : HVD_BFLOAT16;
        hvd_err err = {0};
        if (hvd_wait(h[k], &err) != 0) {
            fprintf(stderr, "gpu.fuse.%d: %s\n", k, err.msg);
            bad++;
        } else {
            void *got = to_host(dout[k], N * tl_esize(dt));
            double want[N];
            for (int i = 0; i < N; i++)
                want[i] = reduce_ref(HVD_OP_SUM, dt, 700 + k, i);
            if (!tl_check_array("gpu.fuse", got, dt, want, N)) bad++;
            free(got);
        }
        cudaFree(din[k]);
        cudaFree(dout[k]);
    }
    CHECK(bad == 0);
    hvd_get_stats(&b);
    CHECK_MSG(b.fused_calls > a.fused_calls, "no fused device call");
}

static void test_other_collectives(void) {
    for (int d = 0; d < HVD_NUM_DTYPES; d++) {
        hvd_dtype dt = all_dtypes[d];
        size_t es = tl_esize(dt);
        int t = 900 + d * 10;
        hvd_err err = {0};
        char name[64];
        /* allgather: rank r gives (r + 1) * 3 rows of 5 */
        int64_t rows = (rank_ + 1) * 3;
        void *h = host_input(dt, t, rows * 5, false);
        void *dd = to_device(h, (size_t)(rows * 5) * es);
        hvd_output out;
        snprintf(name, sizeof name, "gpu.ag.%s", hvd_dtype_name(dt));
        int rc = hvd_allgather(name, dd, rows, 5, dt, dev_, &out, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            CHECK(out.device == dev_);
            int64_t total = 0;
            for (int r = 0; r < size_; r++)
                total += (r + 1) * 3;
            CHECK(out.first_dim == total);
            void *got = to_host(out.data, out.bytes);
            double *want = malloc(sizeof(double) * (size_t)(total * 5));
            int64_t k = 0;
            for (int r = 0; r < size_; r++)
                for (int64_t i = 0; i < (r + 1) * 3 * 5; i++)
                    want[k++] = val(r, t, i, dt);
            CHECK(tl_check_array(name, got, dt, want, total * 5));
            free(got);
            free(want);
            hvd_output_free(&out);
        }
        free(h);
        cudaFree(dd);

        /* broadcast from the last rank */
        int64_t n = 777;
        h = host_input(dt, t + 1, n, false);
        dd = to_device(h, (size_t)n * es);
        snprintf(name, sizeof name, "gpu.bc.%s", hvd_dtype_name(dt));
        rc = hvd_broadcast(name, dd, n, dt, size_ - 1, dev_, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        void *got = to_host(dd, (size_t)n * es);
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            want[i] = val(size_ - 1, t + 1, i, dt);
        if (rc == 0) CHECK(tl_check_array(name, got, dt, want, n));
        free(got);
        free(want);
        free(h);
        cudaFree(dd);

        /* alltoall: 2 rows of 3 to every rank */
        rows = 2 * size_;
        h = host_input(dt, t + 2, rows * 3, false);
        dd = to_device(h, (size_t)(rows * 3) * es);
        snprintf(name, sizeof name, "gpu.a2a.%s", hvd_dtype_name(dt));
        rc = hvd_alltoall(name, dd, rows, 3, NULL, dt, dev_, &out, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            CHECK(out.first_dim == 2 * size_);
            got = to_host(out.data, out.bytes);
            want = malloc(sizeof(double) * (size_t)(2 * size_ * 3));
            for (int s = 0; s < size_; s++)
                for (int64_t i = 0; i < 6; i++)
                    want[s * 6 + i] = val(s, t + 2, rank_ * 6 + i, dt);
            CHECK(tl_check_array(name, got, dt, want, 2 * size_ * 3));
            free(got);
            free(want);
            hvd_output_free(&out);
        }
        free(h);
        cudaFree(dd);

        /* reducescatter (sum) of size * 4 + 1 rows of 2 */
        int64_t first = size_ * 4 + 1, mine = hvd_reducescatter_rows(first, rank_, size_), off = 0;
        for (int r = 0; r < rank_; r++)
            off += hvd_reducescatter_rows(first, r, size_);
        h = host_input(dt, t + 3, first * 2, false);
        dd = to_device(h, (size_t)(first * 2) * es);
        void *dr = to_device(NULL, (size_t)(mine * 2) * es);
        snprintf(name, sizeof name, "gpu.rs.%s", hvd_dtype_name(dt));
        rc = hvd_reducescatter(name, dd, dr, first, 2, dt, HVD_OP_SUM, dev_, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        got = to_host(dr, (size_t)(mine * 2) * es);
        want = malloc(sizeof(double) * (size_t)(mine * 2) + 1);
        for (int64_t i = 0; i < mine * 2; i++)
            want[i] = reduce_ref(HVD_OP_SUM, dt, t + 3, off * 2 + i);
        if (rc == 0) CHECK(tl_check_array(name, got, dt, want, mine * 2));
        free(got);
        free(want);
        free(h);
        cudaFree(dd);
        cudaFree(dr);
    }
}

/* Host and device tensors in one step: different groups, same cycle. */
static void test_mixed_host_device(void) {
    float hin[100], hout[100];
    for (int i = 0; i < 100; i++)
        hin[i] = (float)(rank_ + i);
    void *din = to_device(hin, sizeof hin), *dout = to_device(NULL, sizeof hin);
    hvd_handle a, b;
    hvd_err err = {0};
    CHECK(hvd_allreduce_async("mixed.host", hin, hout, 100, HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU,
                              &a, &err) == 0);
    CHECK(hvd_allreduce_async("mixed.dev", din, dout, 100, HVD_FLOAT32, HVD_OP_SUM, dev_, &b,
                              &err) == 0);
    CHECK(hvd_wait(a, &err) == 0 && hvd_wait(b, &err) == 0);
    float *got = to_host(dout, sizeof hin);
    for (int i = 0; i < 100; i += 33) {
        float want = (float)(size_ * i + size_ * (size_ - 1) / 2);
        CHECK(hout[i] == want && got[i] == want);
    }
    free(got);
    cudaFree(din);
    cudaFree(dout);
}

static int mpi_only(void) {
    tl_init();
    int32_t x = hvd_rank() + 1, y = 0;
    hvd_err err = {0};
    CHECK(hvd_allreduce("mpi.only", &x, &y, 1, HVD_INT32, HVD_OP_SUM, HVD_DEVICE_CPU, &err) == 0);
    CHECK(y == hvd_size() * (hvd_size() + 1) / 2);
    fprintf(stderr, "MPI works: rank %d of %d, nccl backend built: %d\n", hvd_rank(), hvd_size(),
            hvd_nccl_built());
    hvd_shutdown();
    return test_finish();
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--mpi-only") == 0) return mpi_only();
    if (!hvd_nccl_built()) {
        printf("skipped: this build has no NCCL backend (CUDA/NCCL were not found at "
               "configure time)\n");
        return 77;
    }
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("skipped: no CUDA device on this machine (%s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 77;
    }
    tl_init();
    rank_ = hvd_rank();
    size_ = hvd_size();
    dev_ = hvd_local_rank() % ndev;
    cudaSetDevice(dev_);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev_) == cudaSuccess)
        fprintf(stderr, "rank %d of %d on CUDA device %d: %s\n", rank_, size_, dev_, prop.name);
    RUN(test_allreduce_every_type);
    RUN(test_scaled_every_type);
    RUN(test_fusion_on_device);
    RUN(test_other_collectives);
    RUN(test_mixed_host_device);
    hvd_shutdown();
    return test_finish();
}
