/* Produces a timeline (HOROVOD_TIMELINE is set by run_timeline.sh, which then checks the
 * file with check_timeline.py): fused allreduces over three steps (negotiated, then cached),
 * a broadcast and an allgather, and a broadcast whose name needs escaping in JSON (a quote, a
 * backslash, control characters and a byte that is not UTF-8). Results are checked too. */
#include "rt_testlib.h"

static void test_workload(void) {
    int size = hvd_size(), rank = hvd_rank();
    hvd_err err = {0};
    for (int step = 0; step < 3; step++) {
        float in[5][16], out[5][16];
        hvd_handle h[5];
        for (int k = 0; k < 5; k++) {
            char name[32];
            snprintf(name, sizeof name, "tl.grad.%d", k);
            for (int i = 0; i < 16; i++)
                in[k][i] = (float)(rank + k + i);
            CHECK(hvd_allreduce_async(name, in[k], out[k], 16, HVD_FLOAT32, HVD_OP_AVERAGE, -1,
                                      &h[k], &err) == 0);
        }
        for (int k = 0; k < 5; k++) {
            CHECK(hvd_wait(h[k], &err) == 0);
            CHECK(out[k][3] == (float)(k + 3) + (float)(size - 1) / 2);
        }
    }
    int64_t v[3] = {rank, rank, rank};
    CHECK(hvd_broadcast("tl.bcast", v, 3, HVD_INT64, size - 1, -1, &err) == 0 && v[2] == size - 1);
    hvd_output out;
    CHECK(hvd_allgather("tl.gather", v, 1, 3, HVD_INT64, -1, &out, &err) == 0 &&
          out.first_dim == size);
    hvd_output_free(&out);
    CHECK(hvd_broadcast("tl.esc\"\\\t\x01\xff", v, 3, HVD_INT64, 0, -1, &err) == 0 &&
          v[2] == size - 1);
}

int main(void) {
    tl_init();
    RUN(test_workload);
    hvd_shutdown();
    return test_finish();
}
