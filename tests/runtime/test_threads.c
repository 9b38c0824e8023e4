/* Several application threads per rank, as autograd's hooks and a training loop use the
 * runtime: each thread submits its own named allreduces and waits for them (in reverse order,
 * or through the blocking call) while the others do the same, so the background thread's
 * burst rule (a waiting thread ends the burst only for its own queued work) runs with waits
 * from several threads at once; every result must be right and nothing may hang. Then two
 * threads wait for one handle: one gets the result, the other HVD_E_NOT_FOUND (runtime.h). */
#include <pthread.h>

#include "rt_testlib.h"

#define NTHREADS 3
#define NSTEPS   200
#define NSIZES   3

static const int64_t sizes[NSIZES] = {4, 1000, 20000}; /* float32 elements */
static int rank_, size_;

typedef struct {
    int t;
    int bad;        /* wrong values or failed calls, counted here: CHECK is not thread-safe */
    char what[256]; /* the first of them */
} worker;

/* Small integers, so every float32 sum over ranks is exact. */
static float input(int rank, int t, int s, int k, int64_t i) {
    return (float)(rank * 1000 + t * 100 + s % 50 + k + (int)(i % 7));
}

static double expected(int t, int s, int k, int64_t i) {
    return 1000.0 * size_ * (size_ - 1) / 2 + size_ * (double)(t * 100 + s % 50 + k + (int)(i % 7));
}

static void fail(worker *w, const char *fmt, const char *name, const char *detail) {
    if (w->bad++ == 0 && snprintf(w->what, sizeof w->what, fmt, name, detail) < 0)
        w->what[0] = '\0';
}

static void check_out(worker *w, const char *name, const float *out, int s, int k) {
    for (int64_t i = 0; i < sizes[k]; i++)
        if ((double)out[i] != expected(w->t, s, k, i)) {
            char got[128];
            snprintf(got, sizeof got, " step %d [%lld] = %g, expected %g", s, (long long)i,
                     (double)out[i], expected(w->t, s, k, i));
            fail(w, "%s%s", name, got);
            return;
        }
}

/* One step: the first NSIZES-1 tensors async (waited for newest first), the last one through
 * the blocking call. */
static void step(worker *w, int s, float *in[NSIZES], float *out[NSIZES]) {
    hvd_handle h[NSIZES];
    char name[NSIZES][48];
    for (int k = 0; k < NSIZES; k++) {
        snprintf(name[k], sizeof name[k], "thread%d.t%d", w->t, k); /* the same every step */
        for (int64_t i = 0; i < sizes[k]; i++)
            in[k][i] = input(rank_, w->t, s, k, i);
    }
    for (int k = 0; k < NSIZES - 1; k++) {
        hvd_err err = {0};
        h[k] = 0;
        if (hvd_allreduce_async(name[k], in[k], out[k], sizes[k], HVD_FLOAT32, HVD_OP_SUM,
                                HVD_DEVICE_CPU, &h[k], &err) != 0)
            fail(w, "%s: submit: %s", name[k], err.msg);
    }
    hvd_err err = {0};
    int k = NSIZES - 1;
    if (hvd_allreduce(name[k], in[k], out[k], sizes[k], HVD_FLOAT32, HVD_OP_SUM, HVD_DEVICE_CPU,
                      &err) != 0)
        fail(w, "%s: %s", name[k], err.msg);
    else
        check_out(w, name[k], out[k], s, k);
    for (k = NSIZES - 2; k >= 0; k--) {
        hvd_err werr = {0};
        if (h[k] && hvd_wait(h[k], &werr) != 0)
            fail(w, "%s: wait: %s", name[k], werr.msg);
        else if (h[k])
            check_out(w, name[k], out[k], s, k);
    }
}

static void *work(void *arg) {
    worker *w = arg;
    float *in[NSIZES], *out[NSIZES];
    for (int k = 0; k < NSIZES; k++) {
        in[k] = malloc(sizeof(float) * (size_t)sizes[k]);
        out[k] = malloc(sizeof(float) * (size_t)sizes[k]);
    }
    for (int s = 0; s < NSTEPS; s++) /* all of them: the other ranks wait for each */
        step(w, s, in, out);
    for (int k = 0; k < NSIZES; k++) {
        free(in[k]);
        free(out[k]);
    }
    return NULL;
}

static void test_threads_submit_and_wait(void) {
    pthread_t th[NTHREADS];
    worker w[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        w[t] = (worker){.t = t};
        CHECK(pthread_create(&th[t], NULL, work, &w[t]) == 0);
    }
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        CHECK_MSG(w[t].bad == 0, "thread %d: %d failures, the first: %s", t, w[t].bad, w[t].what);
    }
}

typedef struct {
    hvd_handle h;
    int rc;
    hvd_err err;
} waiter;

static void *wait_one(void *arg) {
    waiter *w = arg;
    w->rc = hvd_wait(w->h, &w->err);
    return NULL;
}

static void test_two_waiters_one_handle(void) {
    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)(rank_ + i);
    hvd_handle h = 0;
    hvd_err err = {0};
    CHECK_MSG(hvd_allreduce_async("two_waiters", in, out, 16, HVD_FLOAT32, HVD_OP_SUM,
                                  HVD_DEVICE_CPU, &h, &err) == 0,
              "%s", err.msg);
    waiter a = {.h = h}, b = {.h = h};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, wait_one, &a) == 0);
    CHECK(pthread_create(&tb, NULL, wait_one, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    waiter *won = a.rc == 0 ? &a : &b, *lost = a.rc == 0 ? &b : &a;
    CHECK_MSG(won->rc == 0, "one waiter gets the result: %d %s / %d %s", a.rc, a.err.msg, b.rc,
              b.err.msg);
    CHECK_MSG(lost->rc == -1 && lost->err.code == HVD_E_NOT_FOUND,
              "the other gets HVD_E_NOT_FOUND: rc %d code %d '%s'", lost->rc, lost->err.code,
              lost->err.msg);
    for (int i = 0; i < 16; i++)
        CHECK_MSG((double)out[i] == size_ * (double)i + size_ * (size_ - 1) / 2.0, "[%d] = %g", i,
                  (double)out[i]);
    CHECK(hvd_poll(h) == -1); /* released */
}

int main(void) {
    tl_init();
    rank_ = hvd_rank();
    size_ = hvd_size();
    RUN(test_threads_submit_and_wait);
    RUN(test_two_waiters_one_handle);
    hvd_shutdown();
    return test_finish();
}
