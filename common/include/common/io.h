/* File descriptor helpers shared by every part. None of them allocates, so they are safe
 * after fork in a multithreaded process (hvd_write_all, hvd_close_fd). */
#ifndef HVD_COMMON_IO_H
#define HVD_COMMON_IO_H

#include <stddef.h>

/* Writes all n bytes, retrying after EINTR and short writes. Returns 0, or -1 with errno (a
 * non-blocking fd that would block gives EAGAIN with part of the data written). */
int hvd_write_all(int fd, const void *buf, size_t n);

/* Sets O_NONBLOCK. Returns 0, or -1 with errno. */
int hvd_set_nonblock(int fd);

/* Closes *fd if it is open and sets it to -1. */
void hvd_close_fd(int *fd);

#endif
