/* Running out of memory never ends the process and never leaves a rank waiting: the runtime's
 * test hook (runtime/fault.h) makes one rank's allocations fail at each place where that can
 * happen, and every rank must see the documented outcome (runtime/cycle.c):
 *
 *   - a submission: that call fails on that rank, nothing reaches the others, a retry works;
 *   - the fusion buffer: the step runs unfused on every rank, with correct results;
 *   - the output of an allgather / alltoall: that tensor fails on every rank, naming the rank;
 *   - the background thread's bookkeeping: every rank fails its handles naming the rank and
 *     stops, as after hvd_shutdown.
 *
 * Run with -np 3. */
#include <time.h>

#include "../../runtime/fault.h"
#include "rt_testlib.h"

static int rank_, size_;

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static uint64_t fused_calls(void) {
    hvd_stats st;
    CHECK(hvd_get_stats(&st) == 0);
    return st.fused_calls;
}

static void test_submission(void) {
    hvd_err err = {0};
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    hvd_handle h;
    if (rank_ == 1) {
        rt_fault_arm(RT_FAULT_SUBMIT, 1);
        CHECK(hvd_allreduce_async("oom.submit", x, y, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) ==
              -1);
        CHECK_MSG(err.code == HVD_E_INTERNAL && strstr(err.msg, "out of memory") &&
                      strstr(err.msg, "'oom.submit'"),
                  "code %d: %s", err.code, err.msg);
    }
    /* The failed call reached no other rank; submitting again completes the collective. */
    CHECK(hvd_allreduce_async("oom.submit", x, y, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == 0);
    CHECK(hvd_wait(h, &err) == 0);
    CHECK(y[3] == 4.0f * size_);
}

/* One step of 8 fusable allreduces; checks the sums. */
static void fusable_step(const char *prefix) {
    enum { T = 8, N = 1024 };
    static float in[T][N], out[T][N];
    hvd_handle h[T];
    hvd_err err = {0};
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++)
            in[t][i] = (float)(t + rank_);
    for (int t = 0; t < T; t++) {
        char name[64];
        snprintf(name, sizeof name, "%s.%d", prefix, t);
        CHECK(hvd_allreduce_async(name, in[t], out[t], N, HVD_FLOAT32, HVD_OP_SUM, -1, &h[t],
                                  &err) == 0);
    }
    int bad = 0;
    for (int t = 0; t < T; t++) {
        CHECK(hvd_wait(h[t], &err) == 0);
        float want = (float)(t * size_ + size_ * (size_ - 1) / 2);
        for (int i = 0; i < N; i++)
            bad += out[t][i] != want;
    }
    CHECK_MSG(bad == 0, "%s: %d wrong elements", prefix, bad);
}

static void test_fusion_buffer(void) {
    hvd_err err = {0};
    /* Rank 2 cannot grow its fusion buffer: every rank runs the step unfused. */
    if (rank_ == 2) rt_fault_arm(RT_FAULT_FUSION, 1000000);
    CHECK(hvd_barrier(&err) == 0);
    uint64_t before = fused_calls();
    fusable_step("oom.fusion");
    CHECK_MSG(fused_calls() == before, "fused %llu calls without a fusion buffer on rank 2",
              (unsigned long long)(fused_calls() - before));
    /* Memory is back: fusion resumes (a step may be split over cycles: allow a few). */
    rt_fault_arm(RT_FAULT_FUSION, 0);
    CHECK(hvd_barrier(&err) == 0);
    for (int i = 0; i < 5 && fused_calls() == before; i++)
        fusable_step("oom.fusion.after");
    CHECK(fused_calls() > before);
}

static void check_output_failure(const char *op, const char *name, int rank, int rc,
                                 const hvd_err *err, const hvd_output *out) {
    char who[32];
    snprintf(who, sizeof who, "rank %d ran out of memory", rank);
    CHECK_MSG(rc == -1 && err->code == HVD_E_INTERNAL && strstr(err->msg, op) &&
                  strstr(err->msg, name) && strstr(err->msg, who),
              "%s: rc %d, code %d: %s", op, rc, err->code, err->msg);
    CHECK(out->data == NULL && out->rank_rows == NULL);
}

static void test_outputs(void) {
    hvd_err err = {0};
    int64_t rows[3] = {1, 2, 3};
    float in[6] = {1, 2, 3, 4, 5, 6};
    hvd_output out;
    /* Allgather: rank 2 cannot allocate its result. */
    if (rank_ == 2) rt_fault_arm(RT_FAULT_OUTPUT, 1);
    int rc = hvd_allgather("oom.gather", in, rows[rank_], 2, HVD_FLOAT32, -1, &out, &err);
    check_output_failure("allgather", "'oom.gather'", 2, rc, &err, &out);
    rt_fault_arm(RT_FAULT_OUTPUT, 0);
    CHECK(hvd_allgather("oom.gather", in, rows[rank_], 2, HVD_FLOAT32, -1, &out, &err) == 0);
    CHECK(out.first_dim == 6 && out.rank_rows && out.rank_rows[2] == 3);
    hvd_output_free(&out);
    /* Alltoall: rank 0 cannot allocate its result. */
    if (rank_ == 0) rt_fault_arm(RT_FAULT_OUTPUT, 2);
    rc = hvd_alltoall("oom.alltoall", in, 3, 1, NULL, HVD_FLOAT32, -1, &out, &err);
    check_output_failure("alltoall", "'oom.alltoall'", 0, rc, &err, &out);
    rt_fault_arm(RT_FAULT_OUTPUT, 0);
    CHECK(hvd_alltoall("oom.alltoall", in, 3, 1, NULL, HVD_FLOAT32, -1, &out, &err) == 0);
    CHECK(out.first_dim == 3);
    hvd_output_free(&out);
}

static void test_bookkeeping(void) {
    hvd_err err = {0};
    float x[2] = {1, 2}, y[2];
    hvd_handle h;
    /* Rank 1's background thread cannot record what it drains: every rank stops. */
    if (rank_ == 1) rt_fault_arm(RT_FAULT_CYCLE, 1);
    int rc = hvd_allreduce_async("oom.cycle", x, y, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err);
    if (rc == 0) {
        rc = hvd_wait(h, &err);
        CHECK_MSG(rc == -1 && err.code == HVD_E_INTERNAL, "wait: rc %d, code %d: %s", rc, err.code,
                  err.msg);
    } else {
        /* Submitted after the runtime had already stopped. */
        CHECK_MSG(err.code == HVD_E_SHUTDOWN, "submit: code %d: %s", err.code, err.msg);
    }
    CHECK_MSG(strstr(err.msg, "rank 1 ran out of memory"), "%s", err.msg);
    for (int i = 0; i < 400 && hvd_is_running(); i++)
        nap_ms(5);
    CHECK(!hvd_is_running());
    CHECK(hvd_allreduce_async("oom.late", x, y, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h, &err) == -1 &&
          strstr(err.msg, "rank 1 ran out of memory"));
    CHECK(hvd_shutdown() == 0);
}

int main(void) {
    tl_init();
    rank_ = hvd_rank();
    size_ = hvd_size();
    if (size_ != 3) {
        fprintf(stderr, "run this test with -np 3\n");
        hvd_shutdown();
        return 77;
    }
    RUN(test_submission);
    RUN(test_fusion_buffer);
    RUN(test_outputs);
    RUN(test_bookkeeping);
    return test_finish();
}
