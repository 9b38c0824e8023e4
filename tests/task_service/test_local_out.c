/* Tests of the task service's bounded sink to its own stdout/stderr (task_service/
 * local_out.c): order and completeness, the bound, the room notification, and a destroy that
 * does not hang on a reader that never reads. */
#include "local_out.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int rooms;

static void on_room(void *arg) {
    (void)arg;
    atomic_fetch_add(&rooms, 1);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Reads fd to end-of-file into a malloc'd buffer. */
typedef struct reader {
    int fd;
    unsigned char *data;
    size_t len;
} reader;

static void *read_all(void *arg) {
    reader *r = arg;
    size_t cap = 1 << 20;
    r->data = malloc(cap);
    for (;;) {
        if (r->len == cap) r->data = realloc(r->data, cap *= 2);
        ssize_t n = read(r->fd, r->data + r->len, cap - r->len);
        if (n <= 0) break;
        r->len += (size_t)n;
    }
    return NULL;
}

static void test_order_bound_notify(void) {
    enum { MAX = 64 * 1024 };
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    atomic_store(&rooms, 0);
    hvd_err err;
    hvd_local_out *o = hvd_local_out_create(MAX, on_room, NULL, &err);
    CHECK(o != NULL);
    if (!o) return;
    /* Nobody reads yet: the pipe (64 KiB) and then the queue fill up. */
    unsigned char chunk[4096];
    size_t queued = 0;
    unsigned counter = 0;
    for (int i = 0; i < 200; i++) {
        for (size_t k = 0; k < sizeof chunk; k++)
            chunk[k] = (unsigned char)(counter + k);
        if (hvd_local_out_room(o) < sizeof chunk) {
            CHECK(hvd_local_out_write(o, p[1], chunk, sizeof chunk) == -1); /* refused */
            break;
        }
        CHECK(hvd_local_out_write(o, p[1], chunk, sizeof chunk) == 0);
        queued += sizeof chunk;
        counter += sizeof chunk;
        sleep_ms(1);
    }
    CHECK(queued < 200 * sizeof chunk); /* bounded: it refused at some point */
    hvd_local_out_notify(o);
    sleep_ms(100);
    CHECK(atomic_load(&rooms) == 0); /* still full */
    reader r = {.fd = p[0]};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, read_all, &r) == 0);
    int64_t deadline = test_now_ms() + 10000;
    while (atomic_load(&rooms) == 0 && test_now_ms() < deadline)
        sleep_ms(5);
    CHECK(atomic_load(&rooms) == 1);
    hvd_local_out_destroy(o); /* flushes */
    close(p[1]);
    pthread_join(th, NULL);
    CHECK(r.len == queued);
    bool same = true;
    for (size_t i = 0; i < r.len && same; i++)
        same = r.data[i] == (unsigned char)i; /* byte i of the stream is i mod 256 */
    CHECK(same);
    CHECK(atomic_load(&rooms) == 1);
    free(r.data);
    close(p[0]);
}

/* A queue already at most half full calls back at once. */
static void test_notify_now(void) {
    atomic_store(&rooms, 0);
    hvd_err err;
    hvd_local_out *o = hvd_local_out_create(1024, on_room, NULL, &err);
    CHECK(o != NULL);
    if (!o) return;
    hvd_local_out_notify(o);
    CHECK(atomic_load(&rooms) == 1);
    hvd_local_out_destroy(o);
}

/* Destroy gives up on a reader that never reads. */
static void test_destroy_stuck(void) {
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    hvd_err err;
    hvd_local_out *o = hvd_local_out_create(256 * 1024, on_room, NULL, &err);
    CHECK(o != NULL);
    if (!o) return;
    static unsigned char big[128 * 1024];
    CHECK(hvd_local_out_write(o, p[1], big, sizeof big) == 0); /* more than the pipe holds */
    int64_t t0 = test_now_ms();
    hvd_local_out_destroy(o);
    int64_t took = test_now_ms() - t0;
    CHECK_MSG(took >= 1500 && took < 5000, "destroy took %lld ms", (long long)took);
    /* Let the orphaned writer finish and free the sink. */
    static unsigned char sinkbuf[1 << 16];
    int64_t deadline = test_now_ms() + 2000;
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    while (test_now_ms() < deadline) {
        if (read(p[0], sinkbuf, sizeof sinkbuf) <= 0) sleep_ms(10);
    }
    close(p[0]);
    close(p[1]);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    RUN(test_order_bound_notify);
    RUN(test_notify_now);
    RUN(test_destroy_stuck);
    return test_finish();
}
