/* RPC benchmark and demo: a real authenticated service in its own process on loopback, and
 * clients in this process, every frame sealed.
 *
 *   rpc_bench [--clients LIST] [--seconds S] [--payload BYTES] [--markdown]
 *   rpc_bench --demo
 *
 * For each client count in LIST (default 1,64,1024) it runs that many client threads, each
 * with its own connection making blocking echo calls for S seconds (default 3), and reports
 * aggregate requests/s and the p50/p99 latency of single calls. --demo walks through the
 * layer's guarantees with real processes and prints what happens. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd/rpc.h"

enum { T_ECHO = 100, T_STREAM = 101 };

typedef struct echo_msg {
    hvd_bytes data;
} echo_msg;
static const hvd_field echo_fields[] = {HVD_FIELD(echo_msg, data, HVD_F_BIN)};
static const hvd_msg_desc echo_desc = HVD_MSG(T_ECHO, "echo", echo_msg, echo_fields);

typedef struct stream_msg {
    uint64_t bytes;
} stream_msg;
static const hvd_field stream_fields[] = {HVD_FIELD(stream_msg, bytes, HVD_F_U64)};
static const hvd_msg_desc stream_desc = HVD_MSG(T_STREAM, "stream", stream_msg, stream_fields);

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- The service (child process) --------------------------------------------------------- */

static void echo_h(hvd_call *call, const msgpack_object *body, void *user) {
    (void)user;
    echo_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &echo_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    hvd_call_reply(call, &echo_desc, &m);
    hvd_msg_free(&echo_desc, &m);
}

typedef struct streamer {
    hvd_call *call;
    uint64_t left;
} streamer;

static void stream_cancel(void *arg) {
    free(arg);
}

static void stream_pump(void *arg) {
    streamer *st = arg;
    static uint8_t chunk[65536];
    while (st->left > 0) {
        size_t n = st->left < sizeof chunk ? st->left : sizeof chunk;
        if (hvd_call_stream_room(st->call) < n) {
            hvd_call_on_writable(st->call, stream_pump, st);
            return;
        }
        hvd_call_stream(st->call, 1, chunk, n);
        st->left -= n;
    }
    hvd_call_reply(st->call, &hvd_ack_desc, NULL);
    free(st);
}

static void stream_h(hvd_call *call, const msgpack_object *body, void *user) {
    (void)user;
    stream_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &stream_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    streamer *st = malloc(sizeof *st);
    st->call = call;
    st->left = m.bytes;
    hvd_call_on_cancel(call, stream_cancel, st);
    stream_pump(st);
}

/* Starts the service in a child process; returns its pid and port. */
static pid_t spawn_service(const hvd_secret *secret, uint16_t *port) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(p[1]);
        ssize_t n = read(p[0], port, sizeof *port);
        close(p[0]);
        return n == sizeof *port ? pid : -1;
    }
    close(p[0]);
    hvd_server_config cfg = {.name = "bench", .secret = *secret, .max_conns = 20000};
    hvd_err err;
    hvd_server *s = hvd_server_create(&cfg, &err);
    if (!s || hvd_server_handle(s, T_ECHO, echo_h, NULL) ||
        hvd_server_handle(s, T_STREAM, stream_h, NULL) || hvd_server_start(s, &err)) {
        fprintf(stderr, "rpc_bench: service: %s\n", err.msg);
        _exit(1);
    }
    uint16_t port_ = hvd_server_port(s);
    (void)!write(p[1], &port_, sizeof port_);
    close(p[1]);
    pause(); /* until the parent kills us */
    _exit(0);
}

/* ---- Clients ------------------------------------------------------------------------------ */

typedef struct run {
    hvd_secret secret;
    uint16_t port;
    size_t payload;
    int64_t until_us;
    pthread_barrier_t *start;
    /* results */
    uint64_t calls, failures;
    uint32_t *lat_us; /* sampled latencies */
    size_t nlat, caplat;
} run;

static hvd_client *connect_bench(const hvd_secret *secret, uint16_t port, hvd_err *err) {
    hvd_addr a = {.ifname = "lo", .host = "127.0.0.1", .port = port};
    hvd_client_config cc = {
        .service = "bench", .secret = *secret, .addrs = &a, .naddrs = 1, .probe_timeout_ms = 20000};
    return hvd_client_connect(&cc, err);
}

static void *client_main(void *p) {
    run *r = p;
    hvd_err err;
    hvd_client *c = connect_bench(&r->secret, r->port, &err);
    pthread_barrier_wait(r->start);
    if (!c) {
        r->failures++;
        return NULL;
    }
    uint8_t *buf = calloc(1, r->payload ? r->payload : 1);
    echo_msg m = {{buf, r->payload}}, resp;
    while (now_us() < r->until_us) {
        int64_t t0 = now_us();
        if (hvd_client_call(c, &echo_desc, &m, &echo_desc, &resp, 0, 0, &err) != 0) {
            r->failures++;
            break;
        }
        int64_t dt = now_us() - t0;
        hvd_msg_free(&echo_desc, &resp);
        r->calls++;
        if (r->nlat < r->caplat) r->lat_us[r->nlat++] = (uint32_t)dt;
    }
    free(buf);
    hvd_client_close(c);
    return NULL;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct result {
    int clients;
    double rps;
    double p50_us, p99_us;
    uint64_t failures;
} result;

static result measure(const hvd_secret *secret, uint16_t port, int clients, double seconds,
                      size_t payload) {
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    run *runs = calloc((size_t)clients, sizeof *runs);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)clients + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < clients; i++) {
        runs[i] = (run){
            .secret = *secret, .port = port, .payload = payload, .start = &start, .caplat = 200000};
        runs[i].lat_us = malloc(runs[i].caplat * sizeof(uint32_t));
        runs[i].until_us = INT64_MAX;
        pthread_create(&th[i], &attr, client_main, &runs[i]);
    }
    /* Everyone has connected when the barrier opens; the clock starts then. */
    int64_t until = now_us() + (int64_t)(seconds * 1e6);
    for (int i = 0; i < clients; i++)
        runs[i].until_us = until;
    pthread_barrier_wait(&start);
    int64_t t0 = now_us();
    for (int i = 0; i < clients; i++)
        runs[i].until_us = t0 + (int64_t)(seconds * 1e6);
    result res = {.clients = clients};
    size_t total = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        total += runs[i].nlat;
    }
    int64_t elapsed = now_us() - t0;
    uint32_t *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    uint64_t calls = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(all + k, runs[i].lat_us, runs[i].nlat * sizeof *all);
        k += runs[i].nlat;
        calls += runs[i].calls;
        res.failures += runs[i].failures;
        free(runs[i].lat_us);
    }
    qsort(all, total, sizeof *all, cmp_u32);
    res.rps = (double)calls / ((double)elapsed / 1e6);
    res.p50_us = total ? all[total / 2] : 0;
    res.p99_us = total ? all[(size_t)((double)total * 0.99)] : 0;
    free(all);
    free(th);
    free(runs);
    pthread_barrier_destroy(&start);
    pthread_attr_destroy(&attr);
    return res;
}

static int count_stream(uint32_t ch, const uint8_t *d, size_t n, void *user) {
    (void)ch;
    (void)d;
    *(uint64_t *)user += n;
    return 0;
}

static int demo(const hvd_secret *secret, uint16_t port, pid_t service_pid) {
    hvd_err err;
    printf("hvd-bridge RPC demo: the authenticated RPC layer every part of the launcher talks\n"
           "over, on its own (scripts/run-example.sh runs a whole job)\n\n");
    printf("1. A service named 'bench' runs in process %d on port %u, all interfaces.\n",
           (int)service_pid, port);
    hvd_addr *addrs;
    size_t n;
    if (hvd_local_addrs(&addrs, &n, port, NULL, &err) == 0) {
        char *text = hvd_addrs_format(addrs, n);
        printf("   Its addresses: %s\n", text);
        free(text);
        free(addrs);
    }
    hvd_secret wrong;
    hvd_secret_generate(&wrong, &err);
    hvd_client *bad = connect_bench(&wrong, port, &err);
    printf("2. A client with a wrong secret is refused:\n   %s\n",
           bad ? "CONNECTED (bug!)" : err.msg);
    hvd_client_close(bad);
    hvd_client *c = connect_bench(secret, port, &err);
    if (!c) {
        printf("   the right secret failed too: %s\n", err.msg);
        return 1;
    }
    hvd_pong pong;
    if (hvd_client_ping(c, &pong, &err) != 0) {
        printf("   ping failed: %s\n", err.msg);
        return 1;
    }
    printf("3. With the job secret: ping answered by '%s', which saw us as %s.\n", pong.service,
           pong.peer_host);
    hvd_msg_free(&hvd_pong_desc, &pong);
    uint64_t got = 0;
    stream_msg sm = {64u << 20};
    int64_t t0 = now_us();
    int rc = hvd_client_call_stream(c, &stream_desc, &sm, count_stream, &got, -1, NULL,
                                    &hvd_ack_desc, NULL, 0, &err);
    double secs = (double)(now_us() - t0) / 1e6;
    printf("4. A sealed stream of 64 MiB: %s, %.0f MiB/s.\n", rc == 0 ? "complete" : err.msg,
           (double)got / 1048576.0 / secs);
    hvd_client_close(c);
    result r = measure(secret, port, 64, 1.0, 64);
    printf("5. 64 clients, 1 s of 64-byte echo calls: %.0f requests/s, p50 %.0f us, p99 %.0f us,"
           " %llu failures.\n",
           r.rps, r.p50_us, r.p99_us, (unsigned long long)r.failures);
    return r.failures ? 1 : 0;
}

int main(int argc, char **argv) {
    const char *list = "1,64,1024";
    double seconds = 3;
    size_t payload = 64;
    int markdown = 0, want_demo = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            list = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--payload") && i + 1 < argc)
            payload = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--markdown"))
            markdown = 1;
        else if (!strcmp(argv[i], "--demo"))
            want_demo = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--clients 1,64,1024] [--seconds S] [--payload BYTES] "
                    "[--markdown] | --demo\n",
                    argv[0]);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    hvd_secret secret;
    hvd_err err;
    if (hvd_secret_generate(&secret, &err) != 0) {
        fprintf(stderr, "rpc_bench: %s\n", err.msg);
        return 1;
    }
    uint16_t port = 0;
    pid_t pid = spawn_service(&secret, &port);
    if (pid < 0) {
        fprintf(stderr, "rpc_bench: the service did not start\n");
        return 1;
    }
    int rc = 0;
    if (want_demo) {
        rc = demo(&secret, port, pid);
    } else {
        if (markdown)
            printf("| clients | requests/s | p50 (us) | p99 (us) | failures "
                   "|\n|---|---|---|---|---|\n");
        char *copy = strdup(list);
        for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
            result r = measure(&secret, port, atoi(tok), seconds, payload);
            if (markdown)
                printf("| %d | %.0f | %.0f | %.0f | %llu |\n", r.clients, r.rps, r.p50_us, r.p99_us,
                       (unsigned long long)r.failures);
            else
                printf("clients=%d requests/s=%.0f p50_us=%.0f p99_us=%.0f failures=%llu\n",
                       r.clients, r.rps, r.p50_us, r.p99_us, (unsigned long long)r.failures);
            fflush(stdout);
            if (r.failures) rc = 1;
        }
        free(copy);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return rc;
}
