/* hvd_join (Horovod's join): ranks with less data join early and stand in with zeros for the
 * allreduces the others still run; the join completes on every rank with the last rank to
 * join. Checked against sums computed here from what each rank contributed: fused small
 * tensors, a tensor large enough to run alone, Average (a joined rank counts as a zero),
 * cached names (the same names every step) and, in the second run, no cache and no fusion.
 * Then: a collective other than allreduce while a rank is joined fails on the ranks that
 * submitted it (also from the cache), a rank that joins at once stands in for names
 * negotiated in the same cycle, a second pending join is refused, and the runtime works
 * normally after every join. Run with -np 3. */
#include <unistd.h>

#include "rt_testlib.h"

static int rank_, size_;

/* Steps rank r trains for: the last rank has the most data, so it joins last. */
static int steps_of(int r) {
    return 2 + 3 * r;
}

#define NT 4
static const int64_t counts[NT] = {7, 1000, 300000 /* 1.2 MB: runs alone */, 33};

/* Element i of tensor k that rank r contributes at step t. */
static double value(int r, int t, int k, int64_t i) {
    return (r + 1) * 100.0 + t * 10.0 + k + (double)(i % 5);
}

/* One training step: NT float32 Sums and one int32 Average, all submitted, then waited on. */
static void step(int t) {
    static float in[NT][300000], out[NT][300000];
    int32_t avg_in[6], avg_out[6];
    hvd_handle h[NT + 1];
    hvd_err err = {0};
    char name[32];
    for (int k = 0; k < NT; k++) {
        for (int64_t i = 0; i < counts[k]; i++)
            in[k][i] = (float)value(rank_, t, k, i);
        snprintf(name, sizeof name, "grad.%d", k);
        int rc = hvd_allreduce_async(name, in[k], out[k], counts[k], HVD_FLOAT32, HVD_OP_SUM,
                                     HVD_DEVICE_CPU, &h[k], &err);
        CHECK_MSG(rc == 0, "step %d: submit %s: %s", t, name, err.msg);
        if (rc != 0) return;
    }
    for (int i = 0; i < 6; i++)
        avg_in[i] = 3 * (rank_ + 1) * (i + 1);
    int rc = hvd_allreduce_async("avg", avg_in, avg_out, 6, HVD_INT32, HVD_OP_AVERAGE,
                                 HVD_DEVICE_CPU, &h[NT], &err);
    CHECK_MSG(rc == 0, "step %d: submit avg: %s", t, err.msg);
    if (rc != 0) return;
    for (int k = 0; k <= NT; k++) {
        rc = hvd_wait(h[k], &err);
        CHECK_MSG(rc == 0, "step %d tensor %d on rank %d: %s", t, k, rank_, err.msg);
    }
    /* Ranks past their last step contribute zeros. */
    for (int k = 0; k < NT; k++) {
        int bad = 0;
        for (int64_t i = 0; i < counts[k] && bad < 3; i++) {
            double want = 0;
            for (int r = 0; r < size_; r++)
                if (t < steps_of(r)) want += value(r, t, k, i);
            if (fabs(out[k][i] - want) > 1e-3 * fabs(want)) {
                CHECK_MSG(0, "rank %d step %d grad.%d[%lld] = %g, want %g", rank_, t, k,
                          (long long)i, out[k][i], want);
                bad++;
            }
        }
    }
    for (int i = 0; i < 6; i++) {
        int32_t sum = 0;
        for (int r = 0; r < size_; r++)
            if (t < steps_of(r)) sum += 3 * (r + 1) * (i + 1);
        int32_t want = sum / size_; /* divided by every rank, joined ones included */
        CHECK_MSG(avg_out[i] == want, "rank %d step %d avg[%d] = %d, want %d", rank_, t, i,
                  avg_out[i], want);
    }
}

static void test_uneven_training(void) {
    for (int t = 0; t < steps_of(rank_); t++)
        step(t);
    int32_t last = -1;
    hvd_err err = {0};
    hvd_stats before, after;
    CHECK(hvd_get_stats(&before) == 0);
    int rc = hvd_join(HVD_DEVICE_CPU, &last, &err);
    CHECK_MSG(rc == 0, "join on rank %d: %s", rank_, err.msg);
    CHECK(hvd_get_stats(&after) == 0);
    /* Rank 0 stood in for the others' later steps: from its response cache, when there is
     * one (the names are the same every step). */
    const char *cap = getenv("HOROVOD_CACHE_CAPACITY");
    if (rank_ == 0 && !(cap && atoi(cap) == 0))
        CHECK_MSG(after.cached_responses > before.cached_responses,
                  "rank 0 stood in for no cached name while joined (%llu -> %llu)",
                  (unsigned long long)before.cached_responses,
                  (unsigned long long)after.cached_responses);
    CHECK_MSG(last == size_ - 1, "join on rank %d returned %d, want %d (it joined last)", rank_,
              last, size_ - 1);
    tl_still_works("after.join");
    /* A second round over the same (cached) names, with the roles the same. */
    for (int t = 0; t < steps_of(rank_); t++)
        step(t);
    rc = hvd_join(HVD_DEVICE_CPU, &last, &err);
    CHECK_MSG(rc == 0 && last == size_ - 1, "second join on rank %d: rc %d last %d: %s", rank_, rc,
              last, err.msg);
}

/* All ranks join with nothing else to do: they agree on who was last. */
static void test_join_alone(void) {
    int32_t last = -1;
    hvd_err err = {0};
    int rc = hvd_join(HVD_DEVICE_CPU, &last, &err);
    CHECK_MSG(rc == 0 && last >= 0 && last < size_, "join: rc %d last %d: %s", rc, last, err.msg);
    int32_t lo = 0, hi = 0;
    CHECK(hvd_allreduce("last.min", &last, &lo, 1, HVD_INT32, HVD_OP_MIN, -1, &err) == 0);
    CHECK(hvd_allreduce("last.max", &last, &hi, 1, HVD_INT32, HVD_OP_MAX, -1, &err) == 0);
    CHECK_MSG(lo == hi, "ranks disagree on the last rank to join: %d..%d", lo, hi);
}

/* Rank 0 joins; the others' broadcast cannot take zeros from it and fails on both. */
static void test_other_collective_while_joined(void) {
    hvd_err err = {0};
    int32_t last = -1;
    if (rank_ == 0) {
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    } else {
        float buf[8] = {0};
        int rc = hvd_broadcast("bcast.while.joined", buf, 8, HVD_FLOAT32, 1, HVD_DEVICE_CPU, &err);
        CHECK_MSG(rc == -1, "broadcast with rank 0 joined succeeded on rank %d", rank_);
        CHECK_MSG(err.code == HVD_E_INVALID, "code %d: %s", err.code, err.msg);
        CHECK_MSG(strstr(err.msg, "broadcast of tensor 'bcast.while.joined' cannot run while "
                                  "rank 0 joined") != NULL,
                  "message: %s", err.msg);
        /* An allreduce still runs, with rank 0's zeros. */
        int64_t x = rank_, y = -1;
        CHECK(hvd_allreduce("sum.while.joined", &x, &y, 1, HVD_INT64, HVD_OP_SUM, -1, &err) == 0);
        CHECK_MSG(y == (int64_t)size_ * (size_ - 1) / 2, "sum with rank 0 joined: %lld",
                  (long long)y);
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    }
    CHECK_MSG(last >= 1, "rank %d: last to join %d, want a rank other than 0", rank_, last);
    tl_still_works("after.bcast");
}

/* Rank 0 joins first, while ranks 1 and 2 negotiate new names every step (nothing cached,
 * several small allreduces fused). Run first: rank 0 has never fused, and its join reaches
 * the coordinator after the others' first names, which then run in the very cycle that
 * sends the join: its fusion buffer must be reserved for that cycle already. */
static void test_join_first_uncached(void) {
    hvd_err err = {0};
    int32_t last = -1;
    if (rank_ == 0) {
        usleep(300 * 1000); /* the others' first step waits for rank 0 at the coordinator */
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    } else {
        for (int t = 0; t < 4; t++) {
            static double in[6][70000], out[6][70000];
            const int64_t n[6] = {3, 50, 1000, 70000, 9, 1};
            hvd_handle h[6];
            for (int k = 0; k < 6; k++) {
                char name[48];
                snprintf(name, sizeof name, "fresh.%d.%d", t, k);
                for (int64_t i = 0; i < n[k]; i++)
                    in[k][i] = rank_ * 1000.0 + t * 10 + k + (double)(i % 3);
                CHECK(hvd_allreduce_async(name, in[k], out[k], n[k], HVD_FLOAT64, HVD_OP_SUM,
                                          HVD_DEVICE_CPU, &h[k], &err) == 0);
            }
            for (int k = 0; k < 6; k++) {
                CHECK_MSG(hvd_wait(h[k], &err) == 0, "step %d tensor %d: %s", t, k, err.msg);
                for (int64_t i = 0; i < n[k]; i++) {
                    double want = 3000.0 + 2 * (t * 10 + k + (double)(i % 3)); /* ranks 1, 2 */
                    if (out[k][i] != want) {
                        CHECK_MSG(0, "rank %d step %d fresh.%d[%lld] = %g, want %g", rank_, t, k,
                                  (long long)i, out[k][i], want);
                        break;
                    }
                }
            }
        }
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    }
    int32_t lo = -1, hi = -1;
    CHECK(hvd_allreduce("fresh.min", &last, &lo, 1, HVD_INT32, HVD_OP_MIN, -1, &err) == 0);
    CHECK(hvd_allreduce("fresh.max", &last, &hi, 1, HVD_INT32, HVD_OP_MAX, -1, &err) == 0);
    CHECK_MSG(lo == hi && lo >= 1, "last rank to join: %d..%d, want one rank of 1, 2", lo, hi);
}

/* Cached collectives other than allreduce, submitted while rank 0 is joined: they fail on the
 * ranks that submitted them (rank 0 does not stand in for them from its cache). */
static void test_cached_others_while_joined(void) {
    hvd_err err = {0};
    int32_t row[2] = {rank_, rank_}, buf[4] = {0};
    for (int k = 0; k < 2; k++) { /* the second time from the cache */
        hvd_output out = {0};
        CHECK_MSG(hvd_allgather("c.gather", row, 1, 2, HVD_INT32, -1, &out, &err) == 0, "%s",
                  err.msg);
        hvd_output_free(&out);
        CHECK(hvd_broadcast("c.bcast", buf, 4, HVD_INT32, 0, -1, &err) == 0);
    }
    int32_t last = -1;
    if (rank_ == 0) {
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    } else {
        hvd_output out = {0};
        int rc = hvd_allgather("c.gather", row, 1, 2, HVD_INT32, -1, &out, &err);
        CHECK_MSG(rc == -1 && strstr(err.msg, "allgather of tensor 'c.gather' cannot run while "
                                              "rank 0 joined"),
                  "cached allgather with rank 0 joined: rc %d: %s", rc, err.msg);
        hvd_output_free(&out);
        rc = hvd_broadcast("c.bcast", buf, 4, HVD_INT32, 0, -1, &err);
        CHECK_MSG(rc == -1 && strstr(err.msg, "cannot run while rank 0 joined"),
                  "cached broadcast with rank 0 joined: rc %d: %s", rc, err.msg);
        CHECK_MSG(hvd_join(HVD_DEVICE_CPU, &last, &err) == 0, "join: %s", err.msg);
    }
    tl_still_works("after.cached.others");
}

/* Bad arguments fail at submission, on this rank alone. */
static void test_join_arguments(void) {
    hvd_err err = {0};
    hvd_handle h;
    CHECK(hvd_join_async(HVD_DEVICE_CPU, NULL, &h, &err) == -1 && err.code == HVD_E_INVALID);
    int32_t last;
    CHECK(hvd_join_async(HVD_DEVICE_CPU, &last, NULL, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(hvd_join_async(-7, &last, &h, &err) == -1 && err.code == HVD_E_INVALID);
}

/* A second join while this rank's first is pending is refused; the first completes. */
static void test_second_join_refused(void) {
    hvd_err err = {0};
    hvd_handle h, h2;
    int32_t last = -1, last2 = -1;
    CHECK_MSG(hvd_join_async(HVD_DEVICE_CPU, &last, &h, &err) == 0, "%s", err.msg);
    CHECK(hvd_join_async(HVD_DEVICE_CPU, &last2, &h2, &err) == -1 && err.code == HVD_E_STATE &&
          strstr(err.msg, "already pending"));
    CHECK_MSG(hvd_wait(h, &err) == 0 && last >= 0 && last < size_, "join: last %d: %s", last,
              err.msg);
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
    RUN(test_join_arguments);
    RUN(test_join_first_uncached);
    RUN(test_uneven_training);
    RUN(test_join_alone);
    RUN(test_other_collective_while_joined);
    RUN(test_cached_others_while_joined);
    RUN(test_second_join_refused);
    tl_still_works("at.end");
    hvd_shutdown();
    return test_finish();
}
