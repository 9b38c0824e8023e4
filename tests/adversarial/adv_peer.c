/* Adversarial peer against a LIVE driver service and a LIVE task service.
 *
 *   adv_peer attacks --driver-pid P --task-pid Q [--task-index I] [--secs S]
 *   adv_peer stall   --task-pid Q [--task-index I] [--secs S]
 *
 * The job secret and the driver's addresses come from the environment (HVD_SECRET or
 * HVD_SECRET_FILE, HVD_DRIVER_ADDRS), as for hvd-rsh. Every case runs while a legitimate
 * client pings the attacked service; the case prints one JSON line:
 *   {"service":..., "case":..., "attempts":N, "as_expected":N, "ping_n":N, "ping_fail":N,
 *    "p50_ms":x, "p99_ms":x, "max_ms":x, "rss_before_kb":N, "rss_max_kb":N, "rss_after_kb":N,
 *    "alive":true, "note":"..."}
 * "as_expected" counts attempts the service answered as the protocol says (dropped the
 * connection without answering). Exit status 0; the Python harness judges the numbers. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "envelope.h"
#include "frame.h"
#include "handshake.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "common/sock.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

static int alive(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* ---- target ------------------------------------------------------------------------------ */

typedef struct target {
    const char *label; /* "driver" or "task" */
    char service[HVD_SERVICE_NAME_MAX];
    hvd_addr addr; /* an IPv4 loopback address of it */
    hvd_addr *addrs;
    size_t naddrs;
    pid_t pid;
} target;

static hvd_secret g_secret;

static hvd_client *legit_client(const target *t) {
    hvd_client_config cfg = {0};
    cfg.service = t->service;
    cfg.secret = g_secret;
    cfg.addrs = t->addrs;
    cfg.naddrs = t->naddrs;
    cfg.io_timeout_ms = 10000;
    hvd_err err;
    hvd_client *c = hvd_client_connect(&cfg, &err);
    if (!c) fprintf(stderr, "adv_peer: connect %s: %s\n", t->service, err.msg);
    return c;
}

static void pick_loopback(target *t) {
    t->addr = t->addrs[0];
    for (size_t i = 0; i < t->naddrs; i++)
        if (strcmp(t->addrs[i].host, "127.0.0.1") == 0) t->addr = t->addrs[i];
}

/* ---- the legitimate pinger --------------------------------------------------------------- */

typedef struct pinger {
    const target *t;
    pthread_t th;
    atomic_int stop;
    double *lat;
    size_t n, cap;
    int fails;
    long rss_max;
} pinger;

static void *pinger_main(void *arg) {
    pinger *p = arg;
    hvd_client *c = legit_client(p->t);
    while (!atomic_load(&p->stop)) {
        long r = rss_kb(p->t->pid);
        if (r > p->rss_max) p->rss_max = r;
        double t0 = now_ms();
        hvd_pong pong;
        hvd_err err;
        int ok = c && hvd_client_ping(c, &pong, &err) == 0;
        double dt = now_ms() - t0;
        if (ok) {
            hvd_msg_free(&hvd_pong_desc, &pong);
            if (p->n == p->cap) {
                p->cap = p->cap ? 2 * p->cap : 1024;
                p->lat = realloc(p->lat, p->cap * sizeof *p->lat);
            }
            p->lat[p->n++] = dt;
        } else {
            p->fails++;
            if (!c) c = legit_client(p->t);
        }
        usleep(5000);
    }
    if (c) hvd_client_close(c);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct run {
    const target *t;
    const char *name;
    pinger p;
    long rss_before;
    int attempts, as_expected;
    char note[256];
} run;

static void run_begin(run *r, const target *t, const char *name) {
    memset(r, 0, sizeof *r);
    r->t = t;
    r->name = name;
    r->rss_before = rss_kb(t->pid);
    r->p.t = t;
    pthread_create(&r->p.th, NULL, pinger_main, &r->p);
    usleep(100 * 1000);
}

static void run_end(run *r) {
    usleep(200 * 1000);
    atomic_store(&r->p.stop, 1);
    pthread_join(r->p.th, NULL);
    pinger *p = &r->p;
    double p50 = -1, p99 = -1, mx = -1;
    if (p->n) {
        qsort(p->lat, p->n, sizeof *p->lat, cmp_d);
        p50 = p->lat[p->n / 2];
        p99 = p->lat[(size_t)((double)(p->n - 1) * 0.99)];
        mx = p->lat[p->n - 1];
    }
    printf("{\"service\":\"%s\",\"case\":\"%s\",\"attempts\":%d,\"as_expected\":%d,"
           "\"ping_n\":%zu,\"ping_fail\":%d,\"p50_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,"
           "\"rss_before_kb\":%ld,\"rss_max_kb\":%ld,\"rss_after_kb\":%ld,\"alive\":%s,"
           "\"note\":\"%s\"}\n",
           r->t->label, r->name, r->attempts, r->as_expected, p->n, p->fails, p50, p99, mx,
           r->rss_before, p->rss_max, rss_kb(r->t->pid), alive(r->t->pid) ? "true" : "false",
           r->note);
    fflush(stdout);
    free(p->lat);
}

/* ---- raw peer (the handshake by hand; tests/rpc/test_rpc.c) ------------------------------- */

typedef struct raw {
    int fd;
    hvd_seal tx, rx;
    int keyed;
} raw;

static int raw_tcp(raw *r, const target *t) {
    memset(r, 0, sizeof *r);
    hvd_err err;
    r->fd = hvd_connect_start(&t->addr, &err);
    if (r->fd < 0) return -1;
    if (hvd_wait_fd(r->fd, POLLOUT, 3000) != 1) {
        close(r->fd);
        r->fd = -1;
        return -1;
    }
    return 0;
}

static int send_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        if (hvd_wait_fd(fd, POLLOUT, 3000) != 1) return -1;
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Handshake with `secret`; leaves the confirmation frame unread. */
static int raw_connect(raw *r, const target *t, const hvd_secret *secret) {
    if (raw_tcp(r, t) != 0) return -1;
    uint8_t nc[HVD_NONCE_LEN], hello[HVD_HELLO_LEN], ch[HVD_CHALLENGE_LEN], pc[HVD_MAC_LEN];
    uint8_t c2s[HVD_KEY_LEN], s2c[HVD_KEY_LEN];
    hvd_hs_nonce(nc);
    hvd_hs_hello(nc, hello);
    if (send_all(r->fd, hello, sizeof hello) != 0) return -1;
    size_t got = 0;
    while (got < sizeof ch) {
        if (hvd_wait_fd(r->fd, POLLIN, 3000) != 1) return -1;
        ssize_t n = recv(r->fd, ch + got, sizeof ch - got, 0);
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    hvd_hs_proof(secret, t->service, 0, nc, ch + 8, pc);
    hvd_hs_keys(secret, t->service, nc, ch + 8, c2s, s2c);
    hvd_seal_init(&r->tx, c2s, 1);
    hvd_seal_init(&r->rx, s2c, 0);
    r->keyed = 1;
    return send_all(r->fd, pc, sizeof pc);
}

static void raw_close(raw *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    if (r->keyed) {
        hvd_seal_free(&r->tx);
        hvd_seal_free(&r->rx);
    }
    r->keyed = 0;
}

/* Reads one frame into a malloc'd buffer (*out, header included). Returns its length, 0 on
 * EOF/timeout. */
static size_t raw_read_frame(raw *r, uint8_t **out, int timeout_ms) {
    uint8_t hdr[4];
    size_t got = 0;
    while (got < 4) {
        if (hvd_wait_fd(r->fd, POLLIN, timeout_ms) != 1) return 0;
        ssize_t n = recv(r->fd, hdr + got, 4 - got, 0);
        if (n <= 0) return 0;
        got += (size_t)n;
    }
    size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
    if (len > (64u << 20) + 16) return 0;
    uint8_t *b = malloc(4 + len);
    memcpy(b, hdr, 4);
    got = 0;
    while (got < len) {
        if (hvd_wait_fd(r->fd, POLLIN, timeout_ms) != 1) {
            free(b);
            return 0;
        }
        ssize_t n = recv(r->fd, b + 4 + got, len - got, 0);
        if (n <= 0) {
            free(b);
            return 0;
        }
        got += (size_t)n;
    }
    *out = b;
    return 4 + len;
}

/* True if the service closes the connection (EOF or reset) within timeout_ms, having sent
 * nothing more than `allow` frames' worth of bytes (ignored). */
static int raw_closed(raw *r, int timeout_ms) {
    uint8_t b[4096];
    double end = now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(end - now_ms());
        if (left <= 0 || hvd_wait_fd(r->fd, POLLIN, left) != 1) return 0;
        ssize_t n = recv(r->fd, b, sizeof b, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
        if (n < 0 && errno != EAGAIN && errno != EINTR) return 0;
    }
}

/* Opens the confirmation frame. Returns 0 if it authenticates. */
static int raw_confirm(raw *r) {
    uint8_t *f = NULL;
    size_t n = raw_read_frame(r, &f, 3000);
    if (!n) return -1;
    size_t plen;
    hvd_err err;
    int rc = hvd_frame_open(&r->rx, f, n - 4, &plen, &err);
    free(f);
    return rc;
}

static void seal_ping(raw *r, uint64_t id, hvd_buf *out) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    hvd_envelope_pack(&sb, HVD_KIND_REQUEST, HVD_MSG_PING, id, &hvd_ping_desc, NULL);
    hvd_frame_seal(&r->tx, (const uint8_t *)sb.data, sb.size, out);
    msgpack_sbuffer_destroy(&sb);
}

/* Sends a sealed ping and checks the pong. */
static int raw_ping(raw *r, uint64_t id, hvd_buf *sent) {
    hvd_buf f = {0};
    seal_ping(r, id, &f);
    int ok = send_all(r->fd, f.data, f.len) == 0;
    if (sent) {
        hvd_buf_append(sent, f.data, f.len);
    }
    hvd_buf_free(&f);
    uint8_t *fr = NULL;
    size_t n = ok ? raw_read_frame(r, &fr, 3000) : 0;
    if (!n) return -1;
    size_t plen;
    hvd_err err;
    int rc = hvd_frame_open(&r->rx, fr, n - 4, &plen, &err);
    free(fr);
    return rc;
}

/* ---- cases ------------------------------------------------------------------------------- */

static double g_secs = 2.0;
static double g_stall_secs = 2.0;
#define LOOP(r) for (double end_ = now_ms() + g_secs * 1000; now_ms() < end_; (r)->attempts++)

static void case_wrong_secret(const target *t) {
    run r;
    run_begin(&r, t, "wrong_secret");
    hvd_secret bad;
    hvd_err err;
    hvd_secret_generate(&bad, &err);
    LOOP(&r) {
        raw a;
        if (raw_connect(&a, t, &bad) == 0 && raw_closed(&a, 3000)) r.as_expected++;
        raw_close(&a);
    }
    run_end(&r);
}

static void case_replay_new(const target *t) {
    run r;
    run_begin(&r, t, "replay_other_conn");
    LOOP(&r) {
        raw a, b;
        hvd_buf cap = {0};
        if (raw_connect(&a, t, &g_secret) != 0 || raw_confirm(&a) != 0 ||
            raw_ping(&a, 1, &cap) != 0) {
            raw_close(&a);
            hvd_buf_free(&cap);
            continue;
        }
        if (raw_connect(&b, t, &g_secret) == 0 && raw_confirm(&b) == 0 &&
            send_all(b.fd, cap.data, cap.len) == 0 && raw_closed(&b, 3000))
            r.as_expected++;
        raw_close(&a);
        raw_close(&b);
        hvd_buf_free(&cap);
    }
    run_end(&r);
}

static void case_replay_same(const target *t) {
    run r;
    run_begin(&r, t, "replay_same_conn");
    LOOP(&r) {
        raw a;
        hvd_buf cap = {0};
        if (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0 &&
            raw_ping(&a, 1, &cap) == 0 && send_all(a.fd, cap.data, cap.len) == 0 &&
            raw_closed(&a, 3000))
            r.as_expected++;
        raw_close(&a);
        hvd_buf_free(&cap);
    }
    run_end(&r);
}

static void case_reorder(const target *t) {
    run r;
    run_begin(&r, t, "reordered");
    LOOP(&r) {
        raw a;
        hvd_buf f1 = {0}, f2 = {0};
        if (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0) {
            seal_ping(&a, 1, &f1);
            seal_ping(&a, 2, &f2);
            if (send_all(a.fd, f2.data, f2.len) == 0 && send_all(a.fd, f1.data, f1.len) == 0 &&
                raw_closed(&a, 3000))
                r.as_expected++;
        }
        raw_close(&a);
        hvd_buf_free(&f1);
        hvd_buf_free(&f2);
    }
    run_end(&r);
}

static void case_reflect(const target *t) {
    run r;
    run_begin(&r, t, "reflected");
    LOOP(&r) {
        raw a;
        /* Send the service's own confirmation frame (s2c counter 0) back to it: c2s frame 0
         * is expected, same counter, other key. */
        uint8_t *f = NULL;
        size_t n;
        if (raw_connect(&a, t, &g_secret) == 0 && (n = raw_read_frame(&a, &f, 3000)) > 0) {
            if (send_all(a.fd, f, n) == 0 && raw_closed(&a, 3000)) r.as_expected++;
            free(f);
        }
        raw_close(&a);
    }
    run_end(&r);
}

static void case_truncated(const target *t) {
    run r;
    run_begin(&r, t, "truncated");
    /* Half a frame, then close; and 100 connections left holding half a frame. */
    raw held[100];
    int nheld = 0;
    LOOP(&r) {
        raw a;
        hvd_buf f = {0};
        if (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0) {
            seal_ping(&a, 1, &f);
            if (send_all(a.fd, f.data, f.len / 2) == 0) r.as_expected++;
        }
        hvd_buf_free(&f);
        if (nheld < 100 && a.fd >= 0)
            held[nheld++] = a;
        else
            raw_close(&a);
    }
    snprintf(r.note, sizeof r.note, "%d connections held with half a frame, then closed", nheld);
    for (int i = 0; i < nheld; i++)
        raw_close(&held[i]);
    run_end(&r);
}

static void case_len_2g(const target *t) {
    run r;
    run_begin(&r, t, "length_2GiB");
    LOOP(&r) {
        raw a;
        uint8_t hdr[4] = {0x80, 0, 0, 0}, junk[1024] = {0};
        if (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0 &&
            send_all(a.fd, hdr, 4) == 0) {
            send(a.fd, junk, sizeof junk, MSG_NOSIGNAL);
            if (raw_closed(&a, 3000)) r.as_expected++;
        }
        raw_close(&a);
    }
    run_end(&r);
}

/* A key holder claims max_frame (64 MiB) and sends 8 MiB of it, on 8 connections. */
static void case_big_partial(const target *t) {
    run r;
    run_begin(&r, t, "64MiB_claimed_8MiB_sent_x8");
    raw held[8];
    int nheld = 0;
    static uint8_t junk[1 << 20];
    for (int i = 0; i < 8; i++) {
        r.attempts++;
        raw a;
        uint32_t L = (64u << 20) + 16;
        uint8_t hdr[4] = {L >> 24, L >> 16, L >> 8, L};
        if (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0 &&
            send_all(a.fd, hdr, 4) == 0) {
            int ok = 1;
            for (int k = 0; k < 8 && ok; k++)
                ok = send_all(a.fd, junk, sizeof junk) == 0;
            if (ok) r.as_expected++;
            held[nheld++] = a;
        } else
            raw_close(&a);
    }
    usleep((useconds_t)(g_secs * 1e6));
    snprintf(r.note, sizeof r.note, "%d connections held %.1f s, then closed", nheld, g_secs);
    for (int i = 0; i < nheld; i++)
        raw_close(&held[i]);
    run_end(&r);
}

static void case_random(const target *t) {
    run r;
    run_begin(&r, t, "random_bytes");
    uint8_t junk[4096];
    int i = 0;
    LOOP(&r) {
        raw a;
        for (size_t k = 0; k < sizeof junk; k++)
            junk[k] = (uint8_t)rand();
        int pre = (i++ % 2) == 0; /* before the handshake, or after it */
        int ok = pre ? raw_tcp(&a, t)
                     : (raw_connect(&a, t, &g_secret) == 0 && raw_confirm(&a) == 0 ? 0 : -1);
        if (ok == 0) {
            send(a.fd, junk, sizeof junk, MSG_NOSIGNAL);
            /* After the handshake the first 4 random bytes are a length: above the maximum the
             * service must drop the connection at once; a length it accepts that is longer than
             * what was sent makes it wait for the rest (until the idle timeout), and a shorter
             * one makes it drop the connection when the frame fails authentication. */
            size_t L =
                (size_t)junk[0] << 24 | (size_t)junk[1] << 16 | (size_t)junk[2] << 8 | junk[3];
            int waits = !pre && L >= 16 && L <= (64u << 20) + 16 && L > sizeof junk - 4;
            if (waits ? !raw_closed(&a, 300) : raw_closed(&a, 3000)) r.as_expected++;
        }
        raw_close(&a);
    }
    snprintf(r.note, sizeof r.note, "4 KiB, half before and half after the handshake");
    run_end(&r);
}

static void case_idle(const target *t, int authenticated) {
    run r;
    run_begin(&r, t, authenticated ? "1000_idle_authenticated" : "1000_idle_tcp");
    enum { N = 1000 };
    static raw conns[N];
    int n = 0;
    for (int i = 0; i < N; i++) {
        r.attempts++;
        int ok =
            authenticated
                ? (raw_connect(&conns[n], t, &g_secret) == 0 && raw_confirm(&conns[n]) == 0 ? 0
                                                                                            : -1)
                : raw_tcp(&conns[n], t);
        if (ok == 0) {
            n++;
            r.as_expected++;
        } else
            raw_close(&conns[n]);
    }
    usleep((useconds_t)(g_secs * 1e6));
    /* How many are still open (not closed by the service)? */
    int open_ = 0;
    for (int i = 0; i < n; i++) {
        struct pollfd p = {conns[i].fd, POLLIN, 0};
        char b;
        if (poll(&p, 1, 0) == 0 || (recv(conns[i].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0)) open_++;
    }
    snprintf(r.note, sizeof r.note, "%d opened, %d still open after %.1f s, then closed", n, open_,
             g_secs);
    for (int i = 0; i < n; i++)
        raw_close(&conns[i]);
    run_end(&r);
}

/* ---- stall: a subscriber that never reads a chatty command's output ------------------------ */

typedef struct reader {
    const target *t;
    atomic_long bytes;
    double deadline;
    int rc;
    char err[512];
} reader;

static int count_chunk(uint32_t ch, const uint8_t *d, size_t n, void *user) {
    (void)ch;
    (void)d;
    reader *rd = user;
    atomic_fetch_add(&rd->bytes, (long)n);
    return now_ms() > rd->deadline; /* abandon at the deadline */
}

static void *reader_main(void *arg) {
    reader *rd = arg;
    hvd_client *c = legit_client(rd->t);
    hvd_exit_msg ex;
    hvd_err err;
    rd->rc = c ? hvd_client_call_stream(c, &hvd_attach_desc, NULL, count_chunk, rd, -1, NULL,
                                        &hvd_exit_desc, &ex, 60000, &err)
               : -1;
    if (rd->rc != 0 && c) snprintf(rd->err, sizeof rd->err, "%.200s", err.msg);
    if (c) hvd_client_close(c);
    return NULL;
}

static void case_stall(const target *t) {
    /* Start the chatty command (the task's one command). */
    hvd_client *c = legit_client(t);
    if (!c) return;
    hvd_run_msg run_req = {0};
    run_req.command = "yes 'hvd-bridge adversarial stall test: a line of chatty output' | head -c "
                      "400000000; exec sleep 300";
    hvd_err err;
    /* The staller subscribes first, so it is attached from the first byte. */
    raw s;
    if (raw_connect(&s, t, &g_secret) != 0 || raw_confirm(&s) != 0) {
        fprintf(stderr, "adv_peer: stall: handshake failed\n");
        return;
    }
    int small = 4096;
    setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    hvd_envelope_pack(&sb, HVD_KIND_REQUEST, HVD_MSG_ATTACH, 7, &hvd_attach_desc, NULL);
    hvd_buf f = {0};
    hvd_frame_seal(&s.tx, (const uint8_t *)sb.data, sb.size, &f);
    msgpack_sbuffer_destroy(&sb);
    send_all(s.fd, f.data, f.len);
    hvd_buf_free(&f);
    usleep(200 * 1000);

    run r;
    run_begin(&r, t, "stalled_subscriber");
    reader rd = {.t = t, .deadline = now_ms() + g_stall_secs * 1000};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    usleep(100 * 1000);
    int rc = hvd_client_call(c, &hvd_run_desc, &run_req, &hvd_ack_desc, NULL, 10000, 0, &err);
    double t0 = now_ms();
    if (rc != 0) snprintf(r.note, sizeof r.note, "RUN_COMMAND failed: %.200s", err.msg);
    /* Sample the legitimate reader's progress every 250 ms: when does it stall, and does it
     * resume (the service drops an ATTACH subscriber that holds the output back for 2 s)? */
    long prev = 0;
    double stalled_at = -1, resumed_at = -1;
    while (now_ms() < rd.deadline) {
        usleep(250 * 1000);
        long b = atomic_load(&rd.bytes);
        double el = (now_ms() - t0) / 1e3;
        if (b == prev && b > 0 && stalled_at < 0) stalled_at = el;
        if (b != prev && stalled_at >= 0 && resumed_at < 0) resumed_at = el;
        prev = b;
    }
    double secs = (now_ms() - t0) / 1e3;
    r.attempts = 1;
    long got = atomic_load(&rd.bytes);
    /* The service kept serving, and a stall did not outlast the drop of the staller. */
    r.as_expected = got > 0 && (stalled_at < 0 || resumed_at >= 0);
    if (rc == 0) {
        int k = snprintf(r.note, sizeof r.note,
                         "legit subscriber got %.1f MB in %.1f s while another read nothing",
                         got / 1e6, secs);
        if (stalled_at >= 0)
            k += snprintf(r.note + k, sizeof r.note - (size_t)k, "; its output stopped at %.1f s",
                          stalled_at);
        if (resumed_at >= 0)
            snprintf(r.note + k, sizeof r.note - (size_t)k, ", resumed at %.1f s", resumed_at);
        else if (stalled_at >= 0)
            snprintf(r.note + k, sizeof r.note - (size_t)k, ", not resumed in the window");
    }
    run_end(&r);
    pthread_join(th, NULL);
    /* Stop the command. */
    hvd_client_call(c, &hvd_abort_desc, NULL, &hvd_ack_desc, NULL, 5000, 0, &err);
    raw_close(&s);
    hvd_client_close(c);
}

/* ---- main -------------------------------------------------------------------------------- */

static int task_target(target *tk, hvd_client *drv, uint32_t index, pid_t pid) {
    hvd_index_msg req = {index};
    hvd_addrs_msg rep;
    hvd_err err;
    double end = now_ms() + 30000;
    for (;;) {
        if (hvd_client_call(drv, &hvd_task_addrs_desc, &req, &hvd_addrs_desc, &rep, 5000,
                            HVD_CALL_RETRY, &err) == 0)
            break;
        if (now_ms() > end) {
            fprintf(stderr, "adv_peer: TASK_ADDRS %u: %s\n", index, err.msg);
            return -1;
        }
        usleep(100 * 1000);
    }
    tk->label = "task";
    hvd_task_service_name(index, tk->service);
    tk->addrs = hvd_addrs_from_list(&rep.addrs, &tk->naddrs);
    hvd_msg_free(&hvd_addrs_desc, &rep);
    tk->pid = pid;
    pick_loopback(tk);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (argc < 2) {
        fprintf(stderr, "usage: adv_peer attacks|stall --driver-pid P --task-pid Q [--task-index "
                        "I] [--secs S] [CASE...]\n");
        return 2;
    }
    const char *mode = argv[1];
    pid_t dpid = 0, tpid = 0;
    uint32_t tindex = 0;
    const char *only[32];
    int nonly = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--driver-pid") && i + 1 < argc)
            dpid = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--task-pid") && i + 1 < argc)
            tpid = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--task-index") && i + 1 < argc)
            tindex = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
            g_secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--stall-secs") && i + 1 < argc)
            g_stall_secs = atof(argv[++i]);
        else if (nonly < 32)
            only[nonly++] = argv[i];
    }
    hvd_err err;
    hvd_client *drv = hvd_driver_connect_env(&g_secret, &err);
    if (!drv) {
        fprintf(stderr, "adv_peer: driver: %s\n", err.msg);
        return 1;
    }
    target dt = {0};
    dt.label = "driver";
    snprintf(dt.service, sizeof dt.service, "driver");
    hvd_addrs_parse(getenv("HVD_DRIVER_ADDRS"), &dt.addrs, &dt.naddrs, &err);
    dt.pid = dpid;
    pick_loopback(&dt);
    target tk = {0};
    if (task_target(&tk, drv, tindex, tpid) != 0) return 1;
    hvd_client_close(drv);

    if (!strcmp(mode, "stall")) {
        case_stall(&tk);
        free(dt.addrs);
        free(tk.addrs);
        return 0;
    }
    static const struct {
        const char *name;
        void (*fn)(const target *);
    } cases[] = {
        {"wrong_secret", case_wrong_secret},
        {"replay_other_conn", case_replay_new},
        {"replay_same_conn", case_replay_same},
        {"reordered", case_reorder},
        {"reflected", case_reflect},
        {"truncated", case_truncated},
        {"length_2GiB", case_len_2g},
        {"big_partial", case_big_partial},
        {"random_bytes", case_random},
    };
    const target *targets[2] = {&dt, &tk};
    for (int ti = 0; ti < 2; ti++) {
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            int want = nonly == 0;
            for (int k = 0; k < nonly; k++)
                want |= !strcmp(only[k], cases[ci].name);
            if (want) cases[ci].fn(targets[ti]);
        }
        int want = nonly == 0;
        for (int k = 0; k < nonly; k++)
            want |= !strcmp(only[k], "idle");
        if (want) {
            case_idle(targets[ti], 0);
            case_idle(targets[ti], 1);
        }
    }
    free(dt.addrs);
    free(tk.addrs);
    return 0;
}
