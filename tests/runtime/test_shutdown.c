/* A rank shuts down while work is pending, on it and on the others: every pending handle on
 * every rank fails (never hangs) with HVD_E_SHUTDOWN and a message naming the tensor, the
 * rank that shut down and who had submitted it; the other ranks' runtime stops, later calls
 * fail at once, and hvd_shutdown/hvd_init behave. Run with -np 3. */
#include <time.h>

#include "rt_testlib.h"

static int rank_, size_;

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void check_msg(const char *what, const hvd_err *err, const char *const *parts) {
    CHECK_MSG(err->code == HVD_E_SHUTDOWN, "%s: code %d (%s)", what, err->code, err->msg);
    for (const char *const *p = parts; *p; p++)
        CHECK_MSG(strstr(err->msg, *p) != NULL, "%s: message lacks \"%s\": %s", what, *p, err->msg);
}

static void test_shutdown_with_pending_work(void) {
    hvd_err err = {0};
    float x[4] = {1, 2, 3, 4}, y[4];
    /* Normal work first; "cached" goes into the response cache. */
    for (int i = 0; i < 2; i++)
        CHECK(hvd_allreduce("cached", x, y, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &err) == 0);
    CHECK(y[3] == 4.0f * size_);

    if (rank_ == 0) {
        /* Rank 0: one name only it submits (negotiated in full), one from the cache that the
         * others will never submit again, then it shuts down. */
        hvd_handle h_only, h_cached;
        float a[3] = {0}, b[3];
        CHECK(hvd_allreduce_async("only.rank0", a, b, 3, HVD_FLOAT32, HVD_OP_SUM, -1, &h_only,
                                  &err) == 0);
        CHECK(hvd_allreduce_async("cached", x, y, 4, HVD_FLOAT32, HVD_OP_SUM, -1, &h_cached,
                                  &err) == 0);
        /* Once this barrier completes, every rank's earlier submissions have reached its
         * background thread (the queue is drained in order). */
        CHECK(hvd_barrier(&err) == 0);
        CHECK(hvd_shutdown() == 0);
        CHECK(!hvd_is_running());
        /* The handles outlive the runtime and carry the reason. */
        CHECK(hvd_poll(h_only) == 1);
        CHECK(hvd_wait(h_only, &err) == -1);
        const char *p1[] = {"'only.rank0'", "hvd_shutdown on rank 0", "submitted by rank 0",
                            "never submitted by ranks 1,2", NULL};
        check_msg("only.rank0", &err, p1);
        CHECK(hvd_wait(h_cached, &err) == -1);
        const char *p2[] = {"'cached'", "hvd_shutdown on rank 0", NULL};
        check_msg("cached", &err, p2);
        /* This process's MPI was finalized by hvd_shutdown: no second start. */
        CHECK(hvd_init(&err) == -1 && strstr(err.msg, "MPI"));
    } else {
        /* Others: a name rank 0 never submits; waiting must end with the error. */
        hvd_handle h;
        double d[2] = {1, 2}, e[2];
        CHECK(hvd_allreduce_async("only.others", d, e, 2, HVD_FLOAT64, HVD_OP_SUM, -1, &h, &err) ==
              0);
        CHECK(hvd_barrier(&err) == 0);
        int rc = hvd_wait(h, &err);
        CHECK(rc == -1);
        const char *p[] = {"'only.others'", "hvd_shutdown on rank 0", "submitted by ranks 1,2",
                           "never submitted by rank 0", NULL};
        check_msg("only.others", &err, p);
        /* The runtime stopped here too: later submissions fail at once. */
        for (int i = 0; i < 200 && hvd_is_running(); i++)
            nap_ms(5);
        CHECK(!hvd_is_running());
        hvd_handle h2;
        CHECK(hvd_allreduce_async("late", d, e, 2, HVD_FLOAT64, HVD_OP_SUM, -1, &h2, &err) == -1 &&
              err.code == HVD_E_SHUTDOWN && strstr(err.msg, "another rank called hvd_shutdown"));
        /* alltoall needs the size before it queues anything: the same refusal. */
        hvd_output out = {0};
        CHECK(hvd_alltoall_async("late.a2a", d, 2, 1, NULL, HVD_FLOAT64, -1, &out, &h2, &err) ==
                  -1 &&
              err.code == HVD_E_SHUTDOWN && strstr(err.msg, "alltoall of 'late.a2a'") &&
              strstr(err.msg, "another rank called hvd_shutdown"));
        CHECK(hvd_init(&err) == -1 && strstr(err.msg, "hvd_shutdown"));
        CHECK(hvd_shutdown() == 0);
        CHECK(hvd_shutdown() == 0); /* idempotent */
    }
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
    RUN(test_shutdown_with_pending_work);
    return test_finish();
}
