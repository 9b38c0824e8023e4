/* File descriptor helpers (common/io.h). */
#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int hvd_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int hvd_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void hvd_close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}
