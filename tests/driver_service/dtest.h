/* Helpers shared by the driver service tests: a thread-safe log capture, a driver on
 * loopback, clients that speak the driver protocol like a task would. */
#ifndef HVD_DTEST_H
#define HVD_DTEST_H

#include <pthread.h>
#include <stdbool.h>

#include "hvd/driver.h"
#include "hvd/rpc.h"
#include "testutil.h"

extern hvd_secret g_secret;

#define LOG_LINES 512
typedef struct logcap {
    pthread_mutex_t mu;
    char *lines[LOG_LINES];
    int n;
} logcap;

void cap_log(void *user, const char *line);
void logcap_init(logcap *lc);
void logcap_free(logcap *lc);
/* True if one captured line contains every one of the (NULL-terminated) needles. */
bool log_has_all(logcap *lc, const char *const *needles);
#define LOG_HAS(lc, ...) log_has_all((lc), (const char *const[]){__VA_ARGS__, NULL})

/* A driver for n tasks on 127.0.0.1 (lc, code, nics may be NULL). */
hvd_driver *start_driver(uint32_t n, logcap *lc, const hvd_code_msg *code, const char *const *nics);
/* A client of the driver's service; driver_client also CHECKs (main thread only: the CHECK
 * counters are not thread-safe), driver_connect is for other threads. */
hvd_client *driver_client(hvd_driver *d);
hvd_client *driver_connect(hvd_driver *d, hvd_err *err);
/* Registers task `index` with the given host hash and addresses (GPUs "0","1", work dir
 * /tmp/work-<index>). */
int register_addrs(hvd_client *c, uint32_t index, const char *host, hvd_addr *addrs, size_t naddrs,
                   hvd_err *err);
/* Registers task `index` with one "lo" address 127.0.0.1:port. */
int register_task(hvd_client *c, uint32_t index, const char *host, uint16_t port, hvd_err *err);
/* Raises RLIMIT_NOFILE to its hard limit; generates g_secret. */
void dtest_init(void);

#endif
