/* The interface round at scale: a driver for N tasks in its own process, and N fake task
 * services ("task i" servers on loopback) in this one. Once all registered, the driver runs
 * hvd_driver_common_interfaces: it tells every task (REGISTRATION_DONE with the tasks it is to
 * probe), every task told to probe reports reaching those tasks on "lo" and "eth0", and the
 * driver intersects the probed pairs. Tasks are registered 8 per host; with --network-per-host
 * each host declares its own eth0 address (a real cluster: every ordered pair of hosts is
 * probed), else all declare the same (fake hosts on one machine: a ring of hosts).
 *
 *   interfaces_bench [--tasks N] [--network-per-host] [--header]
 *
 * Prints a Markdown row: the time of the whole round, the pairs probed, and the driver's peak
 * resident set. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "bench_common.h"
#include "hvd/driver.h"
#include "hvd/rpc.h"

#define REPORTERS 16

/* ---- The driver (child process) ------------------------------------------------------------ */

typedef struct child_report {
    int rc;
    double round_ms;
    char ifaces[64];
    char msg[HVD_ERR_MAX];
} child_report;

static void run_driver(uint32_t n, const hvd_secret *secret, int to_parent, int from_parent) {
    hvd_driver_config cfg = {.num_tasks = n, .secret = *secret, .bind_host = "127.0.0.1"};
    hvd_err err;
    hvd_driver *d = hvd_driver_start(&cfg, &err);
    hvd_addr *a = NULL;
    size_t na = 0;
    uint16_t port = 0;
    if (d && hvd_driver_addrs(d, &a, &na, &err) == 0) port = a[0].port;
    free(a);
    write_full(to_parent, &port, sizeof port);
    if (!port) _exit(1);
    child_report rep = {0};
    rep.rc = hvd_driver_wait_registration(d, 60000, &err);
    char **ifs = NULL;
    int64_t t0 = now_us();
    if (rep.rc == 0) rep.rc = hvd_driver_common_interfaces(d, 120000, &ifs, &err);
    rep.round_ms = (double)(now_us() - t0) / 1000.0;
    if (rep.rc != 0) snprintf(rep.msg, sizeof rep.msg, "%s", err.msg);
    for (size_t k = 0; ifs && ifs[k]; k++) {
        size_t used = strlen(rep.ifaces);
        snprintf(rep.ifaces + used, sizeof rep.ifaces - used, "%s%s", k ? "," : "", ifs[k]);
        free(ifs[k]);
    }
    free(ifs);
    write_full(to_parent, &rep, sizeof rep);
    char go;
    (void)!read(from_parent, &go, 1);
    hvd_driver_stop(d);
    _exit(0);
}

/* ---- The fake tasks (this process) ---------------------------------------------------------- */

typedef struct fleet {
    uint32_t n;
    hvd_secret secret;
    hvd_addr driver;
    hvd_server **srv;
    hvd_addr (*addrs)[2]; /* [n]: each task's "lo" and "eth0" address */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *queue; /* tasks told to probe, not yet reported */
    uint32_t **told; /* [n] the tasks each was told to probe (under mu) */
    size_t *ntold;
    uint64_t pairs; /* reported pairs */
    size_t head, tail;
    bool quit;
    int failures;
} fleet;

typedef struct fake_ref {
    fleet *f;
    uint32_t index;
} fake_ref;

static void on_registration_done(hvd_call *call, const msgpack_object *body, void *user) {
    fake_ref *ref = user;
    hvd_peers_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_registration_done_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    bool probe = m.probe;
    fleet *f = ref->f;
    uint32_t *told = calloc(m.tasks.n + 1, sizeof *told);
    const hvd_task_info *t = m.tasks.v;
    for (size_t k = 0; told && k < m.tasks.n; k++)
        told[k] = t[k].index;
    pthread_mutex_lock(&f->mu);
    free(f->told[ref->index]);
    f->told[ref->index] = told;
    f->ntold[ref->index] = told ? m.tasks.n : 0;
    pthread_mutex_unlock(&f->mu);
    hvd_msg_free(&hvd_registration_done_desc, &m);
    hvd_call_reply(call, &hvd_ack_desc, NULL);
    if (!probe) return;
    pthread_mutex_lock(&f->mu);
    f->queue[f->tail++] = ref->index;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Reports task i reaching every task it was told to probe on both of its addresses. */
static int send_report(fleet *f, hvd_client *c, uint32_t i, hvd_reach *reach, hvd_err *err) {
    size_t k = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t x = 0; x < f->ntold[i]; x++) {
        uint32_t j = f->told[i][x];
        reach[k++] = (hvd_reach){.to = j, .addrs = {f->addrs[j], 2}};
    }
    f->pairs += k;
    pthread_mutex_unlock(&f->mu);
    hvd_reachable_msg m = {.from = i, .reach = {reach, k}};
    return hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, HVD_CALL_RETRY, err);
}

static void *reporter(void *p) {
    fleet *f = p;
    hvd_client_config cc = {.service = HVD_DRIVER_SERVICE,
                            .secret = f->secret,
                            .addrs = &f->driver,
                            .naddrs = 1,
                            .io_timeout_ms = 60000};
    hvd_err err;
    hvd_client *c = hvd_client_connect(&cc, &err);
    hvd_reach *reach = calloc(f->n, sizeof *reach);
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && f->head == f->tail)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->head == f->tail) break;
        uint32_t i = f->queue[f->head++];
        pthread_mutex_unlock(&f->mu);
        int rc = c ? send_report(f, c, i, reach, &err) : -1;
        pthread_mutex_lock(&f->mu);
        if (rc != 0 && f->failures++ == 0) fprintf(stderr, "interfaces_bench: %s\n", err.msg);
    }
    pthread_mutex_unlock(&f->mu);
    free(reach);
    hvd_client_close(c);
    return NULL;
}

static int run(uint32_t n, bool per_host, bool header) {
    fleet f = {.n = n};
    hvd_err err;
    if (hvd_secret_generate(&f.secret, &err) != 0) return 1;
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return 1;
    pid_t pid = fork(); /* before any thread exists in this process */
    if (pid < 0) return 1;
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        run_driver(n, &f.secret, up[1], down[0]);
    }
    close(up[1]);
    close(down[0]);
    uint16_t port = 0;
    if (read_full(up[0], &port, sizeof port) != 0 || !port) return 1;
    f.driver = (hvd_addr){.ifname = "lo", .host = "127.0.0.1", .port = port};

    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cv, NULL);
    f.srv = calloc(n, sizeof *f.srv);
    f.addrs = calloc(n, sizeof *f.addrs);
    f.queue = calloc(n, sizeof *f.queue);
    f.told = calloc(n, sizeof *f.told);
    f.ntold = calloc(n, sizeof *f.ntold);
    fake_ref *refs = calloc(n, sizeof *refs);
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        char name[HVD_SERVICE_NAME_MAX];
        hvd_task_service_name(i, name);
        hvd_server_config sc = {.name = name, .secret = f.secret, .bind_host = "127.0.0.1"};
        refs[i] = (fake_ref){&f, i};
        f.srv[i] = hvd_server_create(&sc, &err);
        if (!f.srv[i] ||
            hvd_server_handle(f.srv[i], HVD_MSG_REGISTRATION_DONE, on_registration_done,
                              &refs[i]) != 0 ||
            hvd_server_start(f.srv[i], &err) != 0) {
            fprintf(stderr, "interfaces_bench: task %u: %s\n", i, err.msg);
            rc = 1;
            break;
        }
        uint16_t p = hvd_server_port(f.srv[i]);
        f.addrs[i][0] = (hvd_addr){.ifname = "lo", .host = "127.0.0.1", .port = p};
        f.addrs[i][1] = (hvd_addr){.ifname = "eth0", .host = "127.0.0.1", .port = p};
        if (per_host) /* not reachable: the driver tells the fakes on lo */
            snprintf(f.addrs[i][1].host, sizeof f.addrs[i][1].host, "127.1.%u.%u", (i / 8) / 250,
                     (i / 8) % 250 + 1);
    }
    pthread_t th[REPORTERS];
    for (int t = 0; t < REPORTERS; t++)
        pthread_create(&th[t], NULL, reporter, &f);
    /* Register everyone (8 tasks per host). */
    hvd_client_config cc = {
        .service = HVD_DRIVER_SERVICE, .secret = f.secret, .addrs = &f.driver, .naddrs = 1};
    hvd_client *c = rc == 0 ? hvd_client_connect(&cc, &err) : NULL;
    for (uint32_t i = 0; c && i < n && rc == 0; i++) {
        char host[32];
        snprintf(host, sizeof host, "bench-host-%u", i / 8);
        hvd_task_info info = {.index = i, .host_hash = host, .addrs = {f.addrs[i], 2}};
        if (hvd_client_call(c, &hvd_register_task_desc, &info, &hvd_ack_desc, NULL, 0, 0, &err)) {
            fprintf(stderr, "interfaces_bench: %s\n", err.msg);
            rc = 1;
        }
    }
    hvd_client_close(c);

    child_report rep = {.rc = -1};
    if (rc == 0 && read_full(up[0], &rep, sizeof rep) != 0) rep.rc = -1;
    long hwm = proc_kib(pid, "VmHWM");
    write_full(down[1], "x", 1);
    if (rc != 0) kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    pthread_mutex_lock(&f.mu);
    f.quit = true;
    pthread_cond_broadcast(&f.cv);
    pthread_mutex_unlock(&f.mu);
    for (int t = 0; t < REPORTERS; t++)
        pthread_join(th[t], NULL);
    for (uint32_t i = 0; i < n; i++)
        hvd_server_destroy(f.srv[i]);
    free(f.srv);
    free(f.addrs);
    free(f.queue);
    for (uint32_t i = 0; i < n; i++)
        free(f.told[i]);
    free(f.told);
    free(f.ntold);
    free(refs);
    if (rc != 0) return 1;
    if (rep.rc != 0) {
        fprintf(stderr, "interfaces_bench: %s\n", rep.msg);
        return 1;
    }
    if (header) {
        printf(
            "| benchmark | tasks | hosts | pairs probed | round (ms) | common interfaces | driver "
            "peak RSS (MiB) |\n");
        printf("|---|---|---|---|---|---|---|\n");
    }
    printf("| interface round (%s) | %u | %u | %llu | %.1f | %s | %.1f |\n",
           per_host ? "network per host" : "one network", n, (n + 7) / 8,
           (unsigned long long)f.pairs, rep.round_ms, rep.ifaces, (double)hwm / 1024.0);
    return f.failures ? 1 : 0;
}

int main(int argc, char **argv) {
    uint32_t n = 1024;
    bool header = false, per_host = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc)
            n = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--network-per-host") == 0)
            per_host = true;
        else if (strcmp(argv[i], "--header") == 0)
            header = true;
        else {
            fprintf(stderr,
                    "usage: interfaces_bench [--tasks N] [--network-per-host] [--header]\n");
            return 2;
        }
    }
    if (n < 2) return 2;
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    return run(n, per_host, header);
}
