/* Registration storm: a driver service in its own process on loopback, and N tasks that
 * connect and register at once from this process (a few threads, each holding many clients,
 * every connection authenticated and sealed).
 *
 *   registration_bench [--tasks N] [--threads T] [--rounds R] [--header]
 *
 * Measures, per round, the time from the start of the storm until the driver's
 * hvd_driver_wait_registration returns (all N in), and the driver process's peak resident
 * set (VmHWM from /proc/<pid>/status, with all N connections still open). Prints one
 * Markdown table row per round (--header adds the table's header). Targets at 1024 tasks:
 * under 1 s and under 50 MiB. Exit status 1 if any registration failed. */
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

#include "bench_common.h"
#include "hvd/driver.h"
#include "hvd/rpc.h"

#define TASKS_PER_HOST 8

/* ---- The driver (child process) ------------------------------------------------------------ */

typedef struct child_report {
    int rc;
    int64_t done_us; /* when wait_registration returned */
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
    rep.done_us = now_us();
    if (rep.rc != 0) snprintf(rep.msg, sizeof rep.msg, "%s", err.msg);
    write_full(to_parent, &rep, sizeof rep);
    char go;
    (void)!read(from_parent, &go, 1); /* the parent has read our peak RSS */
    hvd_driver_stop(d);
    _exit(0);
}

/* ---- The tasks (this process) --------------------------------------------------------------- */

typedef struct storm {
    uint16_t port;
    hvd_secret secret;
    uint32_t first, count; /* the tasks of one thread */
    pthread_barrier_t *start, *release;
    int failures;
    char first_error[HVD_ERR_MAX];
} storm;

static void *storm_thread(void *p) {
    storm *s = p;
    hvd_client **cs = calloc(s->count, sizeof *cs);
    hvd_addr drv = {.ifname = "lo", .host = "127.0.0.1", .port = s->port};
    pthread_barrier_wait(s->start);
    for (uint32_t k = 0; k < s->count; k++) {
        uint32_t index = s->first + k;
        hvd_client_config cc = {.service = HVD_DRIVER_SERVICE,
                                .secret = s->secret,
                                .addrs = &drv,
                                .naddrs = 1,
                                .probe_timeout_ms = 20000,
                                .io_timeout_ms = 20000};
        hvd_err err;
        cs[k] = hvd_client_connect(&cc, &err);
        char host[32], wd[32];
        snprintf(host, sizeof host, "bench-host-%u", index / TASKS_PER_HOST);
        snprintf(wd, sizeof wd, "/work/%u", index);
        /* What a task declares: a loopback and an "eth0" address of its own service. */
        hvd_addr addrs[2] = {{.ifname = "lo", .host = "127.0.0.1", .port = (uint16_t)(20000 + k)},
                             {.ifname = "eth0", .host = "10.0.0.1", .port = (uint16_t)(20000 + k)}};
        char *gpus[] = {"0"};
        hvd_task_info info = {.index = index,
                              .host_hash = host,
                              .addrs = {addrs, 2},
                              .gpus = {gpus, 1},
                              .work_dir = wd};
        if (!cs[k] || hvd_client_call(cs[k], &hvd_register_task_desc, &info, &hvd_ack_desc, NULL, 0,
                                      HVD_CALL_RETRY, &err) != 0) {
            if (s->failures++ == 0) snprintf(s->first_error, sizeof s->first_error, "%s", err.msg);
        }
    }
    /* Keep every connection open until the parent has measured the driver. */
    pthread_barrier_wait(s->release);
    for (uint32_t k = 0; k < s->count; k++)
        hvd_client_close(cs[k]);
    free(cs);
    return NULL;
}

static int round_run(uint32_t n, uint32_t nthreads, bool header) {
    hvd_secret secret;
    hvd_err err;
    if (hvd_secret_generate(&secret, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return 1;
    pid_t pid = fork(); /* before any thread exists in this process */
    if (pid < 0) return 1;
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        run_driver(n, &secret, up[1], down[0]);
    }
    close(up[1]);
    close(down[0]);
    uint16_t port = 0;
    if (read_full(up[0], &port, sizeof port) != 0 || !port) {
        fprintf(stderr, "registration_bench: the driver did not start\n");
        return 1;
    }
    long rss_idle = proc_kib(pid, "VmRSS");

    storm *st = calloc(nthreads, sizeof *st);
    pthread_t *th = calloc(nthreads, sizeof *th);
    pthread_barrier_t start, release;
    pthread_barrier_init(&start, NULL, nthreads + 1);
    pthread_barrier_init(&release, NULL, nthreads + 1);
    uint32_t per = n / nthreads, extra = n % nthreads, next = 0;
    for (uint32_t t = 0; t < nthreads; t++) {
        st[t] = (storm){.port = port,
                        .secret = secret,
                        .first = next,
                        .count = per + (t < extra),
                        .start = &start,
                        .release = &release};
        next += st[t].count;
        pthread_create(&th[t], NULL, storm_thread, &st[t]);
    }
    int64_t t0 = now_us();
    pthread_barrier_wait(&start);
    child_report rep;
    int rc = read_full(up[0], &rep, sizeof rep);
    long hwm = proc_kib(pid, "VmHWM");
    pthread_barrier_wait(&release);
    for (uint32_t t = 0; t < nthreads; t++)
        pthread_join(th[t], NULL);
    write_full(down[1], "x", 1);
    int status;
    waitpid(pid, &status, 0);
    close(up[0]);
    close(down[1]);

    int failures = 0;
    for (uint32_t t = 0; t < nthreads; t++) {
        if (st[t].failures && !failures)
            fprintf(stderr, "registration_bench: %s\n", st[t].first_error);
        failures += st[t].failures;
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&release);
    free(st);
    free(th);
    if (rc != 0 || rep.rc != 0) {
        fprintf(stderr, "registration_bench: %s\n", rc ? "the driver died" : rep.msg);
        return 1;
    }
    double ms = (double)(rep.done_us - t0) / 1000.0;
    if (header) {
        printf("| benchmark | tasks | client threads | all registered (ms) | driver peak RSS "
               "(MiB) | driver RSS before (MiB) |\n");
        printf("|---|---|---|---|---|---|\n");
    }
    printf("| registration storm | %u | %u | %.1f | %.1f | %.1f |\n", n, nthreads, ms,
           (double)hwm / 1024.0, (double)rss_idle / 1024.0);
    fflush(stdout);
    if (failures) fprintf(stderr, "registration_bench: %d registrations failed\n", failures);
    if (n == 1024)
        fprintf(stderr, "targets (1024 tasks: < 1000 ms, < 50 MiB): %s\n",
                ms < 1000.0 && hwm < 50 * 1024 ? "met" : "MISSED");
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    uint32_t n = 1024, threads = 16, rounds = 1;
    bool header = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc)
            n = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--header") == 0)
            header = true;
        else {
            fprintf(stderr, "usage: registration_bench [--tasks N] [--threads T] [--rounds R] "
                            "[--header]\n");
            return 2;
        }
    }
    if (n == 0 || threads == 0) return 2;
    if (threads > n) threads = n;
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    int rc = 0;
    for (uint32_t r = 0; r < rounds; r++)
        rc |= round_run(n, threads, header && r == 0);
    return rc;
}
