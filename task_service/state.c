/* The task service's state: logging, waiting on it, and what several layers ask of it (see
 * state.h). */
#include "state.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "hvd/defaults.h"
#include "common/env.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"

void task_log(hvd_task *t, int level, const char *fmt, ...) {
    if (!t->cfg.log || level > t->cfg.log_level) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    t->cfg.log(t->cfg.log_user, level, line);
}

bool task_wait_until(hvd_task *t, int64_t deadline_ms) {
    if (deadline_ms < 0) {
        pthread_cond_wait(&t->cv, &t->mu);
        return true;
    }
    if (hvd_now_ms() >= deadline_ms) return false;
    struct timespec ts = hvd_ms_to_timespec(deadline_ms); /* cv runs on CLOCK_MONOTONIC */
    pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    return hvd_now_ms() < deadline_ms;
}

void task_sleep_ms(int ms) {
    if (ms <= 0) return;
    struct timespec until = hvd_ms_to_timespec(hvd_now_ms() + ms);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
}

int task_attempt_ms(int64_t deadline_ms) {
    int64_t left = deadline_ms - hvd_now_ms();
    if (left >= TASK_DRIVER_PROBE_MS) return TASK_DRIVER_PROBE_MS;
    return left > 100 ? (int)left : 100;
}

void task_info(const hvd_task *t, hvd_task_info *info) {
    *info = (hvd_task_info){.index = t->cfg.index,
                            .host_hash = (char *)t->host_hash,
                            .addrs = {t->addrs, t->naddrs},
                            .gpus = {t->gpus, t->ngpus},
                            .work_dir = t->work_dir,
                            .free_port = t->free_port,
                            .elastic = t->cfg.elastic};
}

hvd_client *task_driver_connect(hvd_task *t, int timeout_ms, hvd_err *err) {
    hvd_client_config cc = {.service = HVD_DRIVER_SERVICE,
                            .secret = t->cfg.secret,
                            .addrs = t->driver_addrs,
                            .naddrs = t->n_driver_addrs,
                            .probe_timeout_ms = timeout_ms,
                            .stagger_ms = HVD_CONNECT_STAGGER_MS};
    hvd_client *c = hvd_client_connect(&cc, err);
    hvd_secret_wipe(&cc.secret);
    return c;
}

/* Open MPI's shared-memory BTL names its segment files in /dev/shm after the real hostname,
 * the job id and the local rank, so two host hashes on one machine (several executors of a
 * machine each with its own host hash, or test "hosts") would open each other's files and
 * crash. Each task service gives its command a private directory instead, unless the
 * executor's environment already chose one. Made when the command starts (t->shm_dir stays
 * NULL if it cannot be made); the keeper removes it when the command ends. */
void task_make_shm_dir(hvd_task *t) {
    if (t->shm_dir || hvd_env_get(t->cmd_env, "OMPI_MCA_btl_vader_backing_directory")) return;
    t->shm_dir = task_temp_dir("hvd-task");
}

char *task_temp_dir(const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/%s-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp && *tmp ? tmp : "/tmp"), prefix);
    return mkdtemp(path) ? strdup(path) : NULL;
}
