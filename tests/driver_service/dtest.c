/* Helpers shared by the driver service tests (dtest.h). */
#include "dtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

hvd_secret g_secret;

void cap_log(void *user, const char *line) {
    logcap *lc = user;
    pthread_mutex_lock(&lc->mu);
    if (lc->n < LOG_LINES) lc->lines[lc->n++] = strdup(line);
    pthread_mutex_unlock(&lc->mu);
}

void logcap_init(logcap *lc) {
    memset(lc, 0, sizeof *lc);
    pthread_mutex_init(&lc->mu, NULL);
}

void logcap_free(logcap *lc) {
    for (int i = 0; i < lc->n; i++)
        free(lc->lines[i]);
    pthread_mutex_destroy(&lc->mu);
}

bool log_has_all(logcap *lc, const char *const *needles) {
    pthread_mutex_lock(&lc->mu);
    bool found = false;
    for (int i = 0; i < lc->n && !found; i++) {
        bool all = true;
        for (int k = 0; needles[k] && all; k++)
            all = strstr(lc->lines[i], needles[k]) != NULL;
        found = all;
    }
    pthread_mutex_unlock(&lc->mu);
    return found;
}

hvd_driver *start_driver(uint32_t n, logcap *lc, const hvd_code_msg *code,
                         const char *const *nics) {
    hvd_driver_config cfg = {.num_tasks = n,
                             .secret = g_secret,
                             .code = code,
                             .nics = nics,
                             .bind_host = "127.0.0.1",
                             .log = lc ? cap_log : NULL,
                             .log_user = lc};
    hvd_err err;
    hvd_driver *d = hvd_driver_start(&cfg, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    return d;
}

hvd_client *driver_connect(hvd_driver *d, hvd_err *err) {
    hvd_addr *a = NULL;
    size_t n = 0;
    if (hvd_driver_addrs(d, &a, &n, err) != 0) return NULL;
    hvd_client_config cc = {.service = HVD_DRIVER_SERVICE,
                            .secret = g_secret,
                            .addrs = a,
                            .naddrs = n,
                            .probe_timeout_ms = 5000,
                            .io_timeout_ms = 10000};
    hvd_client *c = hvd_client_connect(&cc, err);
    free(a);
    return c;
}

hvd_client *driver_client(hvd_driver *d) {
    hvd_err err;
    hvd_client *c = driver_connect(d, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    return c;
}

int register_addrs(hvd_client *c, uint32_t index, const char *host, hvd_addr *addrs, size_t naddrs,
                   hvd_err *err) {
    char wd[64];
    snprintf(wd, sizeof wd, "/tmp/work-%u", index);
    char *gpus[] = {"0", "1"};
    hvd_task_info info = {.index = index,
                          .host_hash = (char *)host,
                          .addrs = {addrs, naddrs},
                          .gpus = {gpus, 2},
                          .work_dir = wd};
    return hvd_client_call(c, &hvd_register_task_desc, &info, &hvd_ack_desc, NULL, 0,
                           HVD_CALL_RETRY, err);
}

/* Registers task `index` on loopback with one "lo" address at port (any non-zero port). */
int register_task(hvd_client *c, uint32_t index, const char *host, uint16_t port, hvd_err *err) {
    hvd_addr a = {.ifname = "lo", .host = "127.0.0.1", .port = port};
    return register_addrs(c, index, host, &a, 1, err);
}

void dtest_init(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    hvd_err err;
    if (hvd_secret_generate(&g_secret, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}
