/* Errors. Mismatches across ranks (shape, type, op, collective, root, row size), also for a
 * name that is in the response cache, must fail the handle on EVERY rank with a message that
 * names the tensor and the ranks on each side, and the runtime must keep working afterwards.
 * Invalid arguments fail locally at submission. Run with -np 3. */
#include "rt_testlib.h"

static int rank_, size_;

/* Submits an allreduce that every rank waits for, and checks the outcome. */
static void expect_error(const char *name, int rc_submit, hvd_handle h, hvd_err *err,
                         const char *const *must_contain) {
    CHECK_MSG(rc_submit == 0, "%s: submission failed: %s", name, err->msg);
    if (rc_submit != 0) return;
    int rc = hvd_wait(h, err);
    CHECK_MSG(rc == -1, "%s: expected an error on rank %d", name, rank_);
    if (rc != -1) return;
    CHECK_MSG(err->code == HVD_E_INVALID, "%s: code %d", name, err->code);
    for (const char *const *s = must_contain; *s; s++)
        CHECK_MSG(strstr(err->msg, *s) != NULL, "%s: message lacks \"%s\": %s", name, *s, err->msg);
}

static void test_shape_mismatch(void) {
    float buf[20] = {0}, out[20];
    hvd_handle h;
    hvd_err err = {0};
    int n = rank_ == 1 ? 20 : 10;
    int rc = hvd_allreduce_async("mm.shape", buf, out, n, HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU,
                                 &h, &err);
    const char *want[] = {"'mm.shape'", "shapes", "10 elements on ranks 0,2",
                          "20 elements on rank 1", NULL};
    expect_error("mm.shape", rc, h, &err, want);
    tl_still_works("after.shape");
}

static void test_type_mismatch(void) {
    float buf[4] = {0}, out[4];
    hvd_handle h;
    hvd_err err = {0};
    int rc = hvd_allreduce_async("mm.type", buf, out, 4, rank_ == 2 ? HVD_INT32 : HVD_FLOAT32,
                                 HVD_OP_SUM, HVD_DEVICE_CPU, &h, &err);
    const char *want[] = {"'mm.type'", "types", "float32 on ranks 0,1", "int32 on rank 2", NULL};
    expect_error("mm.type", rc, h, &err, want);
}

static void test_op_mismatch(void) {
    double buf[3] = {0}, out[3];
    hvd_handle h;
    hvd_err err = {0};
    int rc = hvd_allreduce_async("mm.op", buf, out, 3, HVD_FLOAT64,
                                 rank_ == 0 ? HVD_OP_MAX : HVD_OP_SUM, HVD_DEVICE_CPU, &h, &err);
    const char *want[] = {"'mm.op'", "reduce ops", "max on rank 0", "sum on ranks 1,2", NULL};
    expect_error("mm.op", rc, h, &err, want);
}

static void test_collective_mismatch(void) {
    int32_t buf[2] = {0}, out[2];
    hvd_handle h;
    hvd_err err = {0};
    int rc = rank_ == 2
                 ? hvd_broadcast_async("mm.coll", buf, 2, HVD_INT32, 0, HVD_DEVICE_CPU, &h, &err)
                 : hvd_allreduce_async("mm.coll", buf, out, 2, HVD_INT32, HVD_OP_SUM,
                                       HVD_DEVICE_CPU, &h, &err);
    const char *want[] = {"'mm.coll'", "allreduce on ranks 0,1", "broadcast on rank 2", NULL};
    expect_error("mm.coll", rc, h, &err, want);
}

static void test_root_mismatch(void) {
    uint8_t buf[5] = {0};
    hvd_handle h;
    hvd_err err = {0};
    int rc = hvd_broadcast_async("mm.root", buf, 5, HVD_UINT8, rank_ == 0 ? 1 : 0, HVD_DEVICE_CPU,
                                 &h, &err);
    const char *want[] = {"'mm.root'", "root 1 on rank 0", "root 0 on ranks 1,2", NULL};
    expect_error("mm.root", rc, h, &err, want);
}

static void test_row_mismatch(void) {
    int8_t buf[12] = {0};
    hvd_output out;
    hvd_handle h;
    hvd_err err = {0};
    int row = rank_ == 1 ? 4 : 3;
    int rc =
        hvd_allgather_async("mm.row", buf, 12 / row, row, HVD_INT8, HVD_DEVICE_CPU, &out, &h, &err);
    const char *want[] = {"'mm.row'", "3 elements per row on ranks 0,2",
                          "4 elements per row on rank 1", NULL};
    expect_error("mm.row", rc, h, &err, want);
    CHECK(out.data == NULL);
}

/* A name in the response cache (steady state), then submitted with another shape by one
 * rank: the cache must not let the other ranks run it; everyone gets the error; the next
 * steps work again. */
static void test_cached_then_mismatch(void) {
    float in[8], out[8];
    for (int i = 0; i < 8; i++)
        in[i] = (float)rank_;
    hvd_err err = {0};
    for (int step = 0; step < 3; step++) {
        int rc = hvd_allreduce("steady", in, out, 8, HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU, &err);
        CHECK_MSG(rc == 0 && out[7] == (float)(size_ * (size_ - 1) / 2), "%s", err.msg);
    }
    hvd_stats st;
    hvd_get_stats(&st);
    CHECK(st.cached_responses >= 2); /* steps 2 and 3 came from the cache */
    hvd_handle h;
    int rc = hvd_allreduce_async("steady", in, out, rank_ == 2 ? 7 : 8, HVD_FLOAT32, HVD_OP_SUM,
                                 HVD_DEVICE_CPU, &h, &err);
    const char *want[] = {"'steady'", "8 elements on ranks 0,1", "7 elements on rank 2", NULL};
    expect_error("steady (mismatch)", rc, h, &err, want);
    for (int step = 0; step < 2; step++) {
        rc = hvd_allreduce("steady", in, out, 8, HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU, &err);
        CHECK_MSG(rc == 0 && out[0] == (float)(size_ * (size_ - 1) / 2), "%s", err.msg);
    }
}

static void test_local_argument_errors(void) {
    float a[4] = {0}, b[4];
    hvd_handle h;
    hvd_err err = {0};
    CHECK(hvd_allreduce_async("x", a, b, 4, (hvd_dtype)42, HVD_OP_SUM, -1, &h, &err) == -1 &&
          err.code == HVD_E_INVALID);
    CHECK(hvd_allreduce_async("x", a, b, -1, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == -1);
    CHECK(hvd_allreduce_async("x", a, b, 4, HVD_FLOAT32, (hvd_reduce_op)9, -1, &h, &err) == -1);
    CHECK(hvd_allreduce_async("x", NULL, b, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == -1);
    CHECK(hvd_allreduce_async("x", a, b, 4, HVD_FLOAT32, HVD_OP_SUM, -1, NULL, &err) == -1);
    CHECK(hvd_allreduce_async("", a, b, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == -1);
    CHECK(hvd_allreduce_scaled_async("x", a, b, 4, HVD_FLOAT32, HVD_OP_MIN, 2, 1, -1, &h, &err) ==
              -1 &&
          strstr(err.msg, "sum and average"));
    CHECK(hvd_allreduce_scaled_async("x", a, b, 4, HVD_FLOAT32, HVD_OP_SUM, NAN, 1, -1, &h, &err) ==
          -1);
    CHECK(hvd_broadcast_async("x", a, 4, HVD_FLOAT32, size_, -1, &h, &err) == -1 &&
          strstr(err.msg, "root"));
    int64_t splits[3] = {5, 5, 5}; /* more than the 4 rows */
    hvd_output out;
    CHECK(hvd_alltoall_async("x", a, 4, 1, splits, HVD_FLOAT32, -1, &out, &h, &err) == -1 &&
          strstr(err.msg, "splits"));
    CHECK(hvd_reducescatter_async("x", a, a, 4, 1, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == -1);
    CHECK(hvd_allreduce_async("x", a, b, 4, HVD_FLOAT32, HVD_OP_SUM, 99, &h, &err) == -1 &&
          err.code == HVD_E_INVALID);
    CHECK(hvd_allreduce_async("x", a, b, 4, HVD_FLOAT32, HVD_OP_SUM, -7, &h, &err) == -1);
    /* Unknown handles. */
    CHECK(hvd_poll(0) == -1 && hvd_poll(123456789) == -1);
    CHECK(hvd_wait(987654321, &err) == -1 && err.code == HVD_E_NOT_FOUND);
    CHECK(hvd_reducescatter_rows(10, 0, 3) == 4 && hvd_reducescatter_rows(10, 2, 3) == 3 &&
          hvd_reducescatter_rows(10, 3, 3) == -1);
}

/* The same name twice while the first is pending: refused locally, the first still works. */
static void test_duplicate_pending_name(void) {
    float a[2] = {1, 2}, b[2], c[2];
    hvd_handle h1, h2;
    hvd_err err = {0};
    CHECK(hvd_allreduce_async("dup", a, b, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h1, &err) == 0);
    CHECK(hvd_allreduce_async("dup", a, c, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h2, &err) == -1 &&
          err.code == HVD_E_STATE && strstr(err.msg, "'dup'"));
    CHECK(hvd_wait(h1, &err) == 0 && b[1] == 2.0f * size_);
    CHECK(hvd_poll(h1) == -1); /* released by hvd_wait */
}

int main(void) {
    tl_init();
    rank_ = hvd_rank();
    size_ = hvd_size();
    if (size_ != 3) {
        fprintf(stderr, "run this test with -np 3 (messages name ranks 0..2)\n");
        hvd_shutdown();
        return 77;
    }
    RUN(test_shape_mismatch);
    RUN(test_type_mismatch);
    RUN(test_op_mismatch);
    RUN(test_collective_mismatch);
    RUN(test_root_mismatch);
    RUN(test_row_mismatch);
    RUN(test_cached_then_mismatch);
    RUN(test_local_argument_errors);
    RUN(test_duplicate_pending_name);
    tl_still_works("at.end");
    hvd_shutdown();
    return test_finish();
}
