/* Termination signals as bytes on a pipe (common/sig.h). */
#include "common/sig.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static int pipe_w = -1;  /* the handler's end */
static pid_t owner;      /* the process that installed the handler */
static int first_signal; /* written by the handler, read by any thread (atomic) */

/* One signal on the pipe: written whole (well under PIPE_BUF, so never split). */
typedef struct sig_record {
    int32_t sig;
    int32_t sender; /* si_pid: who sent it (0: the kernel, or unknown) */
} sig_record;

static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    int saved = errno;
    if (getpid() != owner) {
        /* A child forked without exec (by an entry point running inside hvd-exec, say)
         * inherited this handler: the signal is its own, to act on as if none were installed,
         * not a record on its parent's pipe. Blocked until this returns, then default. */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig);
        errno = saved;
        return;
    }
    int zero = 0;
    __atomic_compare_exchange_n(&first_signal, &zero, sig, false, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    sig_record r = {sig, si && si->si_code <= 0 ? (int32_t)si->si_pid : 0}; /* SI_USER et al. */
    if (pipe_w >= 0) (void)!write(pipe_w, &r, sizeof r);
    errno = saved;
}

int hvd_signals_install(hvd_err *err) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot create the signal pipe: %s",
                           strerror(errno));
    pipe_w = p[1];
    owner = getpid();
    struct sigaction sa = {.sa_sigaction = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
    return p[0];
}

int hvd_signals_next_from(int fd, pid_t *sender) {
    sig_record r;
    ssize_t n;
    while ((n = read(fd, &r, sizeof r)) < 0 && errno == EINTR) {
    }
    if (n != (ssize_t)sizeof r) return 0;
    if (sender) *sender = r.sender;
    return r.sig;
}

int hvd_signals_next(int fd) {
    return hvd_signals_next_from(fd, NULL);
}

int hvd_signals_first(void) {
    return __atomic_load_n(&first_signal, __ATOMIC_SEQ_CST);
}
