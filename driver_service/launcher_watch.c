/* The watcher: SIGINT, SIGTERM and SIGHUP (read from the process's signal pipe), the lifeline
 * of the program that started hvd-driver (--lifeline-fd) and a task service that dies while
 * the job runs end the job through the same path: the driver is
 * aborted (so that waits for registration or interfaces return at once), mpirun is stopped
 * through the launch's stop flag, the ssh sessions are interrupted, and main's cleanup runs
 * (tasks shut down, the private directory with the secret file removed). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/proc.h"
#include "common/sig.h"
#include "launcher.h"

#define LOST_TASK_GRACE_MS 2000 /* a task that ended its part also drops its connection */
#define WATCH_TICK_MS      200  /* how often lost tasks are looked at */

static struct {
    pthread_t thread;
    bool running;
    int signal_fd;            /* the process's signal pipe */
    int lifeline_fd;          /* --lifeline-fd, until cut; -1: none */
    int orphaned;             /* atomic: the lifeline was cut */
    int quit[2];              /* main -> watcher: end */
    int stop;                 /* hvd_launch_config.stop (atomic) */
    hvd_driver *d;            /* atomic */
    ssh_tasks *ssh;           /* atomic */
    const local_tasks *local; /* atomic */
    int ignore_lost;          /* atomic */
    pthread_mutex_t mu;       /* guards reason */
    char reason[512];         /* why the job was stopped; "" if it was not */
} w = {.quit = {-1, -1}, .lifeline_fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

/* Stops the job (how: HVD_LAUNCH_STOP or HVD_LAUNCH_STOP_LOST, which an earlier ordinary
 * stop is raised to). */
static void stop_job(const char *why, int how) {
    pthread_mutex_lock(&w.mu);
    if (!w.reason[0]) snprintf(w.reason, sizeof w.reason, "%s", why);
    pthread_mutex_unlock(&w.mu);
    int was = __atomic_exchange_n(&w.stop, how, __ATOMIC_SEQ_CST);
    if (was > how) __atomic_store_n(&w.stop, was, __ATOMIC_SEQ_CST);
    if (was) return;
    hvd_driver *d = __atomic_load_n(&w.d, __ATOMIC_ACQUIRE);
    if (d) hvd_driver_abort(d, why);
}

void watch_stop_job(const char *why) {
    stop_job(why, HVD_LAUNCH_STOP);
}

void watch_stop_reason(char *out, size_t cap) {
    pthread_mutex_lock(&w.mu);
    snprintf(out, cap, "%s", w.reason);
    pthread_mutex_unlock(&w.mu);
}

const int *watch_stop_flag(void) {
    return &w.stop;
}

void watch_set_driver(hvd_driver *d) {
    __atomic_store_n(&w.d, d, __ATOMIC_RELEASE);
    if (d && hvd_signals_first()) watch_stop_job("interrupted"); /* before the driver existed */
}

void watch_set_ssh(ssh_tasks *st) {
    __atomic_store_n(&w.ssh, st, __ATOMIC_RELEASE);
    if (st && hvd_signals_first()) ssh_tasks_interrupt(st);
}

void watch_set_local(const local_tasks *lt) {
    __atomic_store_n(&w.local, lt, __ATOMIC_RELEASE);
}

void watch_ignore_lost(void) {
    __atomic_store_n(&w.ignore_lost, 1, __ATOMIC_RELEASE);
}

static void on_signal(int sig) {
    char why[64];
    snprintf(why, sizeof why, "interrupted by %s", signal_name(sig));
    watch_stop_job(why);
    ssh_tasks *st = __atomic_load_n(&w.ssh, __ATOMIC_ACQUIRE);
    if (st) ssh_tasks_interrupt(st);
}

/* The lifeline is readable: cut when its write end closed (the starter is gone); bytes
 * written to it mean nothing. */
static void check_lifeline(void) {
    char buf[64];
    ssize_t n = read(w.lifeline_fd, buf, sizeof buf);
    if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
    close(w.lifeline_fd);
    w.lifeline_fd = -1;
    __atomic_store_n(&w.orphaned, 1, __ATOMIC_RELEASE);
    watch_stop_job("the program that started hvd-driver went away (its --lifeline-fd closed)");
    ssh_tasks *st = __atomic_load_n(&w.ssh, __ATOMIC_ACQUIRE);
    if (st) ssh_tasks_interrupt(st);
}

bool watch_orphaned(void) {
    if (__atomic_load_n(&w.orphaned, __ATOMIC_ACQUIRE)) return true;
    if (w.lifeline_fd < 0) return false;
    struct pollfd p = {.fd = w.lifeline_fd, .events = POLLIN};
    char c;
    return poll(&p, 1, 0) == 1 && read(w.lifeline_fd, &c, 1) == 0;
}

/* A task service lost while the job runs stops it: at once when its connection timed out
 * (a network partition is never a normal end), else after a grace period. */
static void check_lost(int64_t *lost_since) {
    hvd_driver *d = __atomic_load_n(&w.d, __ATOMIC_ACQUIRE);
    if (!d || __atomic_load_n(&w.ignore_lost, __ATOMIC_ACQUIRE) || hvd_driver_lost_tasks(d) == 0)
        return;
    int64_t now = hvd_now_ms();
    if (*lost_since < 0) *lost_since = now;
    char why[sizeof w.reason];
    if (hvd_driver_lost_reason(d, why, sizeof why)) /* timed out: unreachable */
        stop_job(why, HVD_LAUNCH_STOP_LOST);
    else if (now - *lost_since >= LOST_TASK_GRACE_MS)
        watch_stop_job(why[0] ? why
                              : "a task service went away while the job ran (its connection to "
                                "the driver broke: did the executor die?)");
}

/* A local task service whose process ended before it registered stops the job: nothing else
 * tells (its exit descriptor is readable once the task and everything it ran are gone; the
 * task said why on stderr). A registered one that goes is a lost task (check_lost). */
static void check_local(void) {
    const local_tasks *lt = __atomic_load_n(&w.local, __ATOMIC_ACQUIRE);
    hvd_driver *d = __atomic_load_n(&w.d, __ATOMIC_ACQUIRE);
    if (!lt || !d || __atomic_load_n(&w.ignore_lost, __ATOMIC_ACQUIRE)) return;
    for (int i = 0; i < lt->n; i++) {
        struct pollfd p = {.fd = hvd_proc_exit_fd(lt->procs[i]), .events = POLLIN};
        if (p.fd < 0 || poll(&p, 1, 0) <= 0) continue;
        hvd_task_info info;
        if (hvd_driver_task(d, (uint32_t)i, &info, NULL) == 0) {
            hvd_msg_free(&hvd_task_info_desc, &info);
            continue;
        }
        char why[160];
        snprintf(why, sizeof why,
                 "task %d (started by hvd-driver --local, pid %d) exited before it registered: "
                 "see its lines above",
                 i, (int)hvd_proc_pid(lt->procs[i]));
        stop_job(why, HVD_LAUNCH_STOP);
        return;
    }
}

static void *watch_main(void *arg) {
    (void)arg;
    int64_t lost_since = -1;
    for (;;) {
        struct pollfd p[3] = {{.fd = w.signal_fd, .events = POLLIN},
                              {.fd = w.quit[0], .events = POLLIN},
                              {.fd = w.lifeline_fd, .events = POLLIN}};
        if (poll(p, w.lifeline_fd >= 0 ? 3 : 2, WATCH_TICK_MS) > 0) {
            if (p[1].revents) return NULL;
            int sig;
            while ((sig = hvd_signals_next(w.signal_fd)) != 0)
                on_signal(sig);
            if (w.lifeline_fd >= 0 && p[2].revents) check_lifeline();
        }
        check_lost(&lost_since);
        check_local();
    }
}

int watch_start(int signal_fd, int lifeline_fd, hvd_err *err) {
    w.signal_fd = signal_fd;
    w.lifeline_fd = lifeline_fd;
    if (pipe2(w.quit, O_CLOEXEC) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot create a pipe: %s", strerror(errno));
    /* The thread takes no signals: they reach the pipe through the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w.thread, NULL, watch_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return hvd_err_set(err, HVD_E_INTERNAL, "cannot start a thread: %s", strerror(rc));
    w.running = true;
    return 0;
}

void watch_end(void) {
    if (!w.running) return;
    (void)!write(w.quit[1], "q", 1);
    pthread_join(w.thread, NULL);
    w.running = false;
    __atomic_store_n(&w.d, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&w.ssh, NULL, __ATOMIC_RELEASE);
}
