/* hvd_init failing on one rank (a malformed HOROVOD_* knob there) must fail on every rank,
 * promptly, with the reason on that rank and a pointer to it on the others: never leave the
 * other ranks waiting in start-up collectives. Run with -np 3. */
#include "rt_testlib.h"

static void test_bad_knob_on_one_rank(void) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    int rank = r ? atoi(r) : 0;
    if (rank == 1) setenv("HOROVOD_FUSION_THRESHOLD", "lots", 1);
    hvd_err err = {0};
    int64_t t0 = test_now_ms();
    CHECK(hvd_init(&err) == -1);
    CHECK(err.code == HVD_E_INVALID || err.code == HVD_E_INTERNAL);
    if (rank == 1)
        CHECK_MSG(strstr(err.msg, "HOROVOD_FUSION_THRESHOLD=lots"), "%s", err.msg);
    else
        CHECK_MSG(strstr(err.msg, "failed on another rank"), "%s", err.msg);
    CHECK(test_now_ms() - t0 < 30000);
    CHECK(!hvd_is_running() && hvd_rank() == -1);
    float x = 1, y;
    CHECK(hvd_allreduce("x", &x, &y, 1, HVD_FLOAT32, HVD_OP_SUM, -1, &err) == -1 &&
          err.code == HVD_E_STATE);
    CHECK(hvd_shutdown() == 0);
}

int main(void) {
    RUN(test_bad_knob_on_one_rank);
    return test_finish();
}
