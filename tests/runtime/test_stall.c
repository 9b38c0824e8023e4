/* The stall inspector: rank 0 submits two tensors that rank 1 does not submit for 5 s (one
 * new, one that sits in the response cache). With HOROVOD_STALL_CHECK_TIME_SECONDS=1 the
 * coordinator must print which rank is missing which tensors (run_and_grep.sh checks the
 * log), and with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3 rank 0's handles must fail with
 * HVD_E_TIMEOUT naming the missing rank instead of hanging. Run with -np 2. */
#include <time.h>

#include "rt_testlib.h"

static void test_stall(void) {
    int rank = hvd_rank();
    hvd_err err = {0};
    float x[2] = {1, 1}, y[2];
    for (int i = 0; i < 2; i++)
        CHECK(hvd_allreduce("stall.cached", x, y, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &err) == 0);
    if (rank == 0) {
        hvd_handle h1, h2;
        float a[2], b[2];
        CHECK(hvd_allreduce_async("stall.new", x, a, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h1, &err) ==
              0);
        CHECK(hvd_allreduce_async("stall.cached", x, b, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &h2,
                                  &err) == 0);
        int64_t t0 = test_now_ms();
        CHECK(hvd_wait(h1, &err) == -1);
        CHECK_MSG(err.code == HVD_E_TIMEOUT && strstr(err.msg, "'stall.new'") &&
                      strstr(err.msg, "never submitted by rank 1"),
                  "%s", err.msg);
        CHECK(hvd_wait(h2, &err) == -1);
        CHECK_MSG(err.code == HVD_E_TIMEOUT && strstr(err.msg, "'stall.cached'") &&
                      strstr(err.msg, "never submitted by rank 1"),
                  "%s", err.msg);
        fprintf(stderr, "stall errors after %lld ms\n", (long long)(test_now_ms() - t0));
        hvd_stats st;
        hvd_get_stats(&st);
        CHECK(st.stall_warnings >= 1);
    } else {
        struct timespec ts = {5, 0};
        nanosleep(&ts, NULL);
    }
    /* Both ranks carry on normally. */
    CHECK(hvd_allreduce("stall.after", x, y, 2, HVD_FLOAT32, HVD_OP_SUM, -1, &err) == 0 &&
          y[0] == 2.0f);
}

int main(void) {
    tl_init();
    if (hvd_size() != 2) {
        hvd_shutdown();
        return 77;
    }
    RUN(test_stall);
    hvd_shutdown();
    return test_finish();
}
