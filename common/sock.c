#include "common/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int bind_listen(int family, const struct sockaddr *sa, socklen_t sl, uint16_t *bound,
                       hvd_err *err) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return hvd_err_set(err, HVD_E_IO, "socket: %s", strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, sa, sl) != 0 || listen(fd, 4096) != 0) {
        int e = errno;
        close(fd);
        return hvd_err_set(err, HVD_E_IO, "cannot listen: %s", strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int hvd_listen_tcp(const char *host, uint16_t port, uint16_t *bound, hvd_err *err) {
    if (!host) {
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
        a6.sin6_addr = in6addr_any;
        hvd_err e6;
        int fd = bind_listen(AF_INET6, (struct sockaddr *)&a6, sizeof a6, bound, &e6);
        if (fd >= 0) return fd;
        struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(port)};
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        return bind_listen(AF_INET, (struct sockaddr *)&a4, sizeof a4, bound, err);
    }
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char pstr[8];
    snprintf(pstr, sizeof pstr, "%u", port);
    int rc = getaddrinfo(host, pstr, &hints, &ai);
    if (rc != 0)
        return hvd_err_set(err, HVD_E_INVALID, "bind address '%s' is not a numeric IP: %s", host,
                           gai_strerror(rc));
    int fd = bind_listen(ai->ai_family, ai->ai_addr, ai->ai_addrlen, bound, err);
    freeaddrinfo(ai);
    if (fd < 0) hvd_err_prefix(err, "%s:%u: ", host, port);
    return fd;
}

void hvd_sock_tune(int fd, int net_timeout_ms) {
    unsigned ut = net_timeout_ms > 0 ? (unsigned)net_timeout_ms : 30000;
    /* Keepalive probes start after a third of the user timeout without traffic; an answered
     * probe restarts that wait, an unanswered one is repeated every fifteenth of it (15 s: 5 s,
     * then every 1 s). With TCP_USER_TIMEOUT set, Linux drops the connection at the first
     * probe that finds nothing received for ut, so a peer cut off without a reset is noticed
     * between 2/3 ut and 16/15 ut after the cut, and a healthy idle connection costs one probe
     * per third of ut. */
    int one = 1, idle = (int)(ut / 3000), intvl = (int)(ut / 15000), cnt = 3;
    if (idle < 1) idle = 1;
    if (intvl < 1) intvl = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

void hvd_sockaddr_host(const struct sockaddr_storage *ss, char *out, size_t len) {
    out[0] = '\0';
    if (ss->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, out, (socklen_t)len);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr))
            inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], out, (socklen_t)len);
        else
            inet_ntop(AF_INET6, &a6->sin6_addr, out, (socklen_t)len);
    }
}

int hvd_connect_start(const hvd_addr *a, hvd_err *err) {
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char pstr[8];
    snprintf(pstr, sizeof pstr, "%u", a->port);
    int rc = getaddrinfo(a->host, pstr, &hints, &ai);
    if (rc != 0)
        return hvd_err_set(err, HVD_E_INVALID, "'%s' is not a numeric address: %s", a->host,
                           gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return hvd_err_set(err, HVD_E_IO, "socket: %s", strerror(errno));
    }
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return hvd_err_set(err, HVD_E_IO, "connect: %s", strerror(e));
    }
    return fd;
}

int hvd_wait_fd(int fd, short events, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int rc = poll(&p, 1, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        return rc > 0 ? 1 : 0;
    }
}
