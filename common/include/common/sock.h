/* TCP socket helpers (in the spirit of Redis's anet.c): each takes an hvd_err so the caller
 * can say precisely what failed. Every socket is non-blocking and close-on-exec. */
#ifndef HVD_COMMON_SOCK_H
#define HVD_COMMON_SOCK_H

#include <stdint.h>
#include <sys/socket.h>

#include "hvd/error.h"
#include "hvd/net.h"

/* Creates a listening socket on host (numeric; NULL: all interfaces, IPv6 dual-stack when the
 * machine has IPv6, else IPv4) and port (0: ephemeral). Returns the fd with the bound port in
 * *bound, or -1 with err. */
int hvd_listen_tcp(const char *host, uint16_t port, uint16_t *bound, hvd_err *err);

/* TCP_NODELAY, keepalive and TCP_USER_TIMEOUT (net_timeout_ms; <= 0: 30 s) so that a dead,
 * half-open or cut-off peer is noticed even on a connection that only waits: keepalive idle
 * ut/3, interval ut/6 (at least 1 s each; 30 s: 10 s and 5 s), and the connection fails with
 * ETIMEDOUT about ut after the last thing the peer sent. */
void hvd_sock_tune(int fd, int net_timeout_ms);

/* Numeric host of a socket address; IPv4-mapped IPv6 addresses are shown as IPv4. */
void hvd_sockaddr_host(const struct sockaddr_storage *ss, char *out, size_t len);

/* Starts a non-blocking connect to a. Returns the fd (connecting or connected), or -1 with
 * err. */
int hvd_connect_start(const hvd_addr *a, hvd_err *err);

/* Waits up to timeout_ms for fd to become readable (events = POLLIN) or writable (POLLOUT).
 * Returns 1 when ready, 0 on timeout, -1 on error. timeout_ms < 0 waits without limit. */
int hvd_wait_fd(int fd, short events, int timeout_ms);

#endif
