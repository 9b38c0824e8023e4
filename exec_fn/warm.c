/* hvd-exec's side of a task service's warm interpreter: a request on a SOCK_SEQPACKET Unix
 * socket with the rank's descriptors attached, then text answers (warm.h). */
#include "warm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/env.h"

#define WARM_MAGIC      "hvd-warm 1"
#define WARM_MAX_FDS    8
#define WARM_ANSWER_MAX 512

static int add_field(hvd_buf *b, const char *s) {
    return hvd_buf_append(b, s, strlen(s) + 1);
}

static int add_count(hvd_buf *b, size_t n) {
    char num[24];
    snprintf(num, sizeof num, "%zu", n);
    return add_field(b, num);
}

/* The request's bytes: magic, cwd, argc, argv..., envc, env..., each NUL-terminated. */
static int build_request(hvd_buf *b, char *const *argv, char *const *envp) {
    char *cwd = getcwd(NULL, 0);
    size_t argc = 0, envc = 0;
    while (argv[argc])
        argc++;
    while (envp[envc])
        envc++;
    int rc = cwd ? add_field(b, WARM_MAGIC) | add_field(b, cwd) | add_count(b, argc) : -1;
    for (size_t i = 0; rc == 0 && i < argc; i++)
        rc = add_field(b, argv[i]);
    if (rc == 0) rc = add_count(b, envc);
    for (size_t i = 0; rc == 0 && i < envc; i++)
        rc = add_field(b, envp[i]);
    free(cwd);
    return rc;
}

static int send_request(int fd, const hvd_buf *b, const int *all, int n) {
    union { /* aligned for cmsghdr */
        char buf[CMSG_SPACE(sizeof(int) * WARM_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = b->data, .iov_len = b->len};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(c), all, sizeof(int) * (size_t)n);
    ssize_t sent;
    do
        sent = sendmsg(fd, &m, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)b->len ? 0 : -1;
}

/* prog as exec would find it (through envp's PATH), resolved to its real file; NULL if none. */
static char *real_program(const char *prog, char *const *envp) {
    if (strchr(prog, '/')) return realpath(prog, NULL);
    const char *path = hvd_env_get(envp, "PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char cand[4096];
        if (snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? p : ".", prog) < (int)sizeof cand &&
            access(cand, X_OK) == 0)
            return realpath(cand, NULL);
        p = end ? end + 1 : NULL;
    }
    return NULL;
}

bool warm_may_run(const char *python, char *const *argv, char *const *envp) {
    char *a = real_program(argv[0], envp), *b = realpath(python, NULL);
    bool same = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    return same;
}

int warm_request(const char *path, char *const *argv, char *const *envp, int stdout_fd,
                 int stderr_fd, const int *fds, int nfds, char *why, size_t cap) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (nfds < 0 || nfds > WARM_MAX_FDS - 2 || strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, cap, "cannot use the warm interpreter at %s", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(why, cap, "cannot reach the warm interpreter at %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    int all[WARM_MAX_FDS] = {stdout_fd, stderr_fd};
    for (int i = 0; i < nfds; i++)
        all[2 + i] = fds[i];
    hvd_buf b = {0};
    int rc = build_request(&b, argv, envp);
    if (rc == 0) rc = send_request(fd, &b, all, nfds + 2);
    hvd_buf_free(&b);
    if (rc != 0) {
        snprintf(why, cap, "cannot send the rank to the warm interpreter at %s: %s", path,
                 strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* One answer message, NUL-terminated; its length, 0 when the interpreter closed, -1 on error. */
static ssize_t read_answer(int conn, char *buf, size_t cap) {
    ssize_t n;
    do
        n = recv(conn, buf, cap - 1, 0);
    while (n < 0 && errno == EINTR);
    buf[n > 0 ? n : 0] = '\0';
    return n;
}

int warm_answer(int conn, pid_t *pid, char *why, size_t cap) {
    char a[WARM_ANSWER_MAX];
    ssize_t n = read_answer(conn, a, sizeof a);
    int p;
    if (n > 0 && sscanf(a, "started %d", &p) == 1 && p > 0) {
        *pid = p;
        return 1;
    }
    if (n > 0 && strncmp(a, "cold ", 5) == 0) {
        snprintf(why, cap, "%s", a + 5);
        return 0;
    }
    snprintf(why, cap, "the warm interpreter %s", n > 0 ? "answered nonsense" : "went away");
    return -1;
}

int warm_wait(int conn, int *status, char *why, size_t cap) {
    char a[WARM_ANSWER_MAX];
    ssize_t n = read_answer(conn, a, sizeof a);
    if (n > 0 && sscanf(a, "exit %d", status) == 1) return 0;
    snprintf(why, cap, "the warm interpreter that ran the rank went away");
    return -1;
}

void warm_stop(int conn) {
    (void)shutdown(conn, SHUT_WR);
}
