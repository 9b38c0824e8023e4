/* Termination signals as bytes on a pipe (common/sig.h). */
#include "common/sig.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

static int pipe_w = -1;  /* the handler's end */
static int first_signal; /* written by the handler, read by any thread (atomic) */

static void on_signal(int sig) {
    int saved = errno;
    int zero = 0;
    __atomic_compare_exchange_n(&first_signal, &zero, sig, false, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    unsigned char b = (unsigned char)sig;
    if (pipe_w >= 0) (void)!write(pipe_w, &b, 1);
    errno = saved;
}

int hvd_signals_install(hvd_err *err) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot create the signal pipe: %s",
                           strerror(errno));
    pipe_w = p[1];
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
    return p[0];
}

int hvd_signals_next(int fd) {
    unsigned char b;
    ssize_t n;
    while ((n = read(fd, &b, 1)) < 0 && errno == EINTR) {
    }
    return n == 1 ? b : 0;
}

int hvd_signals_first(void) {
    return __atomic_load_n(&first_signal, __ATOMIC_SEQ_CST);
}
