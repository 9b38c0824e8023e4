/* The ssh transport (libssh2, non-blocking); see ssh/transport.h. */
#include "ssh/transport.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libssh2.h>

#include "common/clock.h"
#include "common/io.h"
#include "ssh/known_hosts.h"

/* libssh2 1.11 added libssh2_channel_signal_ex(); 1.10 (Debian 12) cannot send signals. */
#if defined(LIBSSH2_VERSION_NUM) && LIBSSH2_VERSION_NUM >= 0x010b00
#define HAVE_CHANNEL_SIGNAL 1
#else
#define HAVE_CHANNEL_SIGNAL 0
#endif

#define IO_CHUNK         32768 /* bytes read from the channel at a time */
#define POLL_CAP_MS      1000  /* longest single poll(); deadlines are re-checked after it */
#define CLOSE_TIMEOUT_MS 2000  /* for the polite goodbye (channel close, disconnect) */
#define KILL_EXEC_MS     3000  /* deadline of the interrupt_kill_exec side channel */
#define MAX_FILES        (HVD_SSH_ARGS_LIST_MAX + 4) /* known_hosts / identity files per run */

/* Everything one run needs; lives on hvd_ssh_run's stack. */
typedef struct ssh_conn {
    const hvd_ssh_options *opt;
    const char *host;         /* opt->host */
    int port;                 /* resolved default */
    char user[256];           /* login name */
    char where[512];          /* "user@host:port", for messages */
    int timeout_ms;           /* deadline of each setup step */
    int interrupt_fd;         /* caller's self-pipe, or -1 */
    bool interrupted;         /* interrupt_fd fired (it is not polled any more) */
    bool handshake_done;      /* the session may send messages (disconnect) */
    int log_fd;               /* debug and warning lines */
    int sock;                 /* TCP socket, or -1 */
    LIBSSH2_SESSION *session; /* or NULL */
    LIBSSH2_CHANNEL *channel; /* the command's channel, or NULL */
    hvd_err *err;             /* caller's, may be NULL */
} ssh_conn;

/* Internal results besides 0: FAIL (err set) and INTR (interrupt_fd fired). */
#define FAIL (-1)
#define INTR (-2)

static void logline(ssh_conn *c, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logline(ssh_conn *c, const char *prefix, const char *fmt, ...) {
    char line[1024];
    int n = snprintf(line, sizeof(line), "%s", prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    (void)hvd_write_all(c->log_fd, line, len);
}

#define debug(c, ...)                                                                              \
    do {                                                                                           \
        if ((c)->opt->verbose > 0) logline((c), "hvd-rsh: debug1: ", __VA_ARGS__);                 \
    } while (0)
#define warn(c, ...)                                                                               \
    do {                                                                                           \
        if (!(c)->opt->quiet) logline((c), "", __VA_ARGS__);                                       \
    } while (0)

/* Appends formatted text to a NUL-terminated buffer, truncating. */
static void appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t len, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Names the connection and the step in front of the caller's error. Returns FAIL. */
static int prefix_step(ssh_conn *c, const char *step) {
    hvd_err_prefix(c->err, "ssh %s: %s: ", c->where, step);
    return FAIL;
}

/* Sets the caller's err (which may be NULL) to "ssh user@host:port: step: " and the
 * printf-style detail. Evaluates to FAIL. */
#define fail(c, code, step, ...)                                                                   \
    (hvd_err_set((c)->err, (code), __VA_ARGS__), prefix_step((c), (step)))

static int interrupted(ssh_conn *c, const char *step) {
    c->interrupted = true;
    fail(c, HVD_E_SHUTDOWN, step, "interrupted before the command started");
    return INTR;
}

static const char *ssh_errmsg(ssh_conn *c) {
    char *m = NULL;
    if (c->session) libssh2_session_last_error(c->session, &m, NULL, 0);
    return m && *m ? m : "unknown libssh2 error";
}

/* Waits (poll) until fd has `events`, interrupt_fd fires, or the deadline passes; a single
 * wait is capped at POLL_CAP_MS so that callers re-check their state. Returns 0 (ready or
 * time to re-check), INTR, or FAIL on timeout (err names step). */
static int wait_fd(ssh_conn *c, int fd, short events, int64_t deadline, const char *step) {
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = c->interrupt_fd, .events = POLLIN}};
    nfds_t n = (c->interrupt_fd >= 0 && !c->interrupted) ? 2 : 1;
    int left = hvd_ms_left(deadline);
    if (left == 0) return fail(c, HVD_E_TIMEOUT, step, "timed out after %d ms", c->timeout_ms);
    if (poll(p, n, left > POLL_CAP_MS ? POLL_CAP_MS : left) < 0 && errno != EINTR)
        return fail(c, HVD_E_IO, step, "poll: %s", strerror(errno));
    if (n == 2 && p[1].revents) return interrupted(c, step);
    return 0;
}

/* Waits until the libssh2 session can make progress in the direction it is blocked on. */
static int wait_session(ssh_conn *c, int64_t deadline, const char *step) {
    int dir = libssh2_session_block_directions(c->session);
    short ev = 0;
    if (dir & LIBSSH2_SESSION_BLOCK_INBOUND) ev |= POLLIN;
    if (dir & LIBSSH2_SESSION_BLOCK_OUTBOUND) ev |= POLLOUT;
    return wait_fd(c, c->sock, ev ? ev : POLLIN, deadline, step);
}

/* Runs a libssh2 call returning int until it stops saying EAGAIN; `out` gets its result.
 * Leaves the enclosing function with the wait's result on timeout or interrupt. */
#define RETRY(c, deadline, step, out, call)                                                        \
    do {                                                                                           \
        while (((out) = (call)) == LIBSSH2_ERROR_EAGAIN) {                                         \
            int w_ = wait_session((c), (deadline), (step));                                        \
            if (w_ < 0) return w_;                                                                 \
        }                                                                                          \
    } while (0)

/* ---- paths and names ---------------------------------------------------------------------- */

/* $HOME, else the passwd entry's home, into out. */
static void home_dir(char *out, size_t outlen) {
    const char *h = getenv("HOME");
    struct passwd pw, *res = NULL;
    char buf[4096];
    if ((!h || !*h) && getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &res) == 0 && res)
        h = pw.pw_dir;
    snprintf(out, outlen, "%s", h && *h ? h : "/");
}

/* Expands a leading "~/" (OpenSSH's tilde_expand for the current user). Returns 0 or -1. */
static int expand_path(const char *in, char *out, size_t outlen) {
    char home[PATH_MAX];
    if (in[0] == '~' && (in[1] == '/' || in[1] == '\0')) home_dir(home, sizeof(home));
    int n = (in[0] == '~' && (in[1] == '/' || in[1] == '\0'))
                ? snprintf(out, outlen, "%s%s", home, in + 1)
                : snprintf(out, outlen, "%s", in);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

static int current_user(char *out, size_t outlen) {
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &res) == 0 && res) {
        snprintf(out, outlen, "%s", pw.pw_name);
        return 0;
    }
    const char *u = getenv("USER");
    if (!u || !*u) u = getenv("LOGNAME");
    if (!u || !*u) return -1;
    snprintf(out, outlen, "%s", u);
    return 0;
}

/* A list of expanded file names. */
typedef struct file_list {
    char path[MAX_FILES][PATH_MAX];
    const char *ptr[MAX_FILES]; /* path[i], for APIs taking const char *const * */
    size_t n;
} file_list;

static void list_add(file_list *l, const char *p) {
    if (l->n >= MAX_FILES || !strcmp(p, "none")) return;
    if (expand_path(p, l->path[l->n], sizeof(l->path[0])) < 0) return;
    l->ptr[l->n] = l->path[l->n];
    l->n++;
}

static void list_fill(file_list *l, const char *const *given, size_t ngiven,
                      const char *const *defaults, size_t ndefaults) {
    if (!given || ngiven == 0) {
        given = defaults;
        ngiven = ndefaults;
    }
    for (size_t i = 0; i < ngiven; i++)
        if (given[i]) list_add(l, given[i]);
}

/* Signal name ("TERM", "SIGTERM") to number, or 0. */
static int signal_number(const char *name, size_t len) {
    static const struct {
        const char *name;
        int num;
    } sigs[] = {{"HUP", SIGHUP},       {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"ILL", SIGILL},
                {"TRAP", SIGTRAP},     {"ABRT", SIGABRT}, {"BUS", SIGBUS},     {"FPE", SIGFPE},
                {"KILL", SIGKILL},     {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},   {"USR2", SIGUSR2},
                {"PIPE", SIGPIPE},     {"ALRM", SIGALRM}, {"TERM", SIGTERM},   {"CHLD", SIGCHLD},
                {"CONT", SIGCONT},     {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},   {"TTIN", SIGTTIN},
                {"TTOU", SIGTTOU},     {"URG", SIGURG},   {"XCPU", SIGXCPU},   {"XFSZ", SIGXFSZ},
                {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"SYS", SIGSYS}};
    if (len > 3 && !strncmp(name, "SIG", 3)) {
        name += 3;
        len -= 3;
    }
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (strlen(sigs[i].name) == len && !strncmp(sigs[i].name, name, len)) return sigs[i].num;
    return 0;
}

/* ---- resolve ------------------------------------------------------------------------------ */

/* A getaddrinfo() run on its own thread so that it can be abandoned at the deadline (the
 * resolver's own timeouts can add up to many seconds). Freed by whoever lets go last. */
typedef struct resolve_job {
    pthread_mutex_t mu;
    int refs;              /* 2 while both the caller and the thread hold it */
    int efd;               /* eventfd, signalled when done */
    char host[NI_MAXHOST]; /* what to resolve */
    char port[8];
    struct addrinfo *res; /* the answer, taken by the caller */
    int rc;               /* getaddrinfo's return value */
} resolve_job;

static void job_release(resolve_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    if (j->res) freeaddrinfo(j->res);
    close(j->efd);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *resolve_thread(void *arg) {
    resolve_job *j = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(j->host, j->port, &hints, &res);
    pthread_mutex_lock(&j->mu);
    j->res = res;
    j->rc = rc;
    pthread_mutex_unlock(&j->mu);
    uint64_t one = 1;
    (void)!write(j->efd, &one, sizeof(one));
    job_release(j);
    return NULL;
}

static int resolve(ssh_conn *c, struct addrinfo **out) {
    const char *step = "resolve";
    char port[8];
    snprintf(port, sizeof(port), "%d", c->port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    if (getaddrinfo(c->host, port, &hints, out) == 0) return 0; /* an address: no lookup */

    if (strlen(c->host) >= NI_MAXHOST) return fail(c, HVD_E_INVALID, step, "host name too long");
    resolve_job *j = calloc(1, sizeof(*j));
    if (!j) return fail(c, HVD_E_INTERNAL, step, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 2;
    snprintf(j->host, sizeof(j->host), "%s", c->host);
    snprintf(j->port, sizeof(j->port), "%s", port);
    if ((j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        pthread_mutex_destroy(&j->mu);
        free(j);
        return fail(c, HVD_E_INTERNAL, step, "eventfd: %s", strerror(errno));
    }
    /* The thread must not take the caller's signals (its handlers expect the main thread). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&t, &attr, resolve_thread, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (prc != 0) {
        j->refs = 1;
        job_release(j);
        return fail(c, HVD_E_INTERNAL, step, "cannot start a thread: %s", strerror(prc));
    }
    debug(c, "resolving %s", c->host);
    int64_t deadline = hvd_now_ms() + c->timeout_ms;
    int rc = 0, w;
    for (;;) {
        uint64_t v;
        if (read(j->efd, &v, sizeof(v)) == (ssize_t)sizeof(v)) break;
        if ((w = wait_fd(c, j->efd, POLLIN, deadline, step)) < 0) {
            job_release(j); /* the thread finishes on its own and frees the job */
            return w;
        }
    }
    pthread_mutex_lock(&j->mu);
    *out = j->res;
    j->res = NULL;
    rc = j->rc;
    pthread_mutex_unlock(&j->mu);
    job_release(j);
    if (rc != 0)
        return fail(c, HVD_E_IO, step, "cannot resolve host name '%s': %s", c->host,
                    rc == EAI_SYSTEM ? "system error" : gai_strerror(rc));
    return 0;
}

/* ---- connect ------------------------------------------------------------------------------ */

static int connect_addr(ssh_conn *c, const struct addrinfo *ai, char *why, size_t whylen) {
    char addr[NI_MAXHOST] = "?";
    getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, sizeof(addr), NULL, 0, NI_NUMERICHOST);
    debug(c, "connecting to %s port %d", addr, c->port);
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return FAIL;
    }
    int64_t deadline = hvd_now_ms() + c->timeout_ms;
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        e = errno;
        while (e == EINPROGRESS || e == EINTR) {
            int w = wait_fd(c, fd, POLLOUT, deadline, "connect");
            if (w == INTR) {
                close(fd);
                return INTR;
            }
            if (w < 0) {
                e = ETIMEDOUT;
                break;
            }
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 0) == 1) {
                socklen_t len = sizeof(e);
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
            }
        }
    }
    if (e != 0) {
        if (e == ETIMEDOUT)
            snprintf(why, whylen, "connection to %s port %d timed out after %d ms", addr, c->port,
                     c->timeout_ms);
        else
            snprintf(why, whylen, "connection to %s port %d failed: %s", addr, c->port,
                     strerror(e));
        close(fd);
        return FAIL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)); /* ssh's TCPKeepAlive=yes */
    c->sock = fd;
    return 0;
}

static int connect_host(ssh_conn *c) {
    struct addrinfo *res = NULL;
    int rc = resolve(c, &res);
    if (rc < 0) return rc;
    char why[300] = "no address";
    rc = FAIL;
    for (struct addrinfo *ai = res; ai && rc == FAIL; ai = ai->ai_next)
        rc = connect_addr(c, ai, why, sizeof(why));
    freeaddrinfo(res);
    if (rc == INTR) return interrupted(c, "connect");
    if (rc < 0) {
        bool timeout = strstr(why, "timed out") != NULL;
        return fail(c, timeout ? HVD_E_TIMEOUT : HVD_E_IO, "connect", "%s", why);
    }
    return 0;
}

/* ---- key exchange and host key ------------------------------------------------------------ */

/* The key type a host key algorithm uses ("rsa-sha2-512" signs with "ssh-rsa" keys). */
static const char *alg_key_type(const char *alg) {
    return strncmp(alg, "rsa-sha2-", 9) == 0 ? "ssh-rsa" : alg;
}

/* OpenSSH 8.8+ defaults: no certificates (not supported here), no SHA-1 (ssh-rsa, ssh-dss). */
static bool alg_allowed(const char *alg) {
    return !strstr(alg, "-cert-") && strcmp(alg, "ssh-rsa") != 0 && strcmp(alg, "ssh-dss") != 0;
}

static void pref_add(char *pref, size_t len, const char *alg) {
    size_t used = strlen(pref), al = strlen(alg);
    for (const char *p = pref; (p = strstr(p, alg)) != NULL; p += al)
        if ((p == pref || p[-1] == ',') && (p[al] == ',' || p[al] == '\0')) return;
    snprintf(pref + used, len - used, "%s%s", used ? "," : "", alg);
}

/* Like OpenSSH, ask first for the host key types known_hosts already has for this host, so
 * that a server with several keys shows the one we can check. */
static void set_hostkey_prefs(ssh_conn *c, const file_list *kh) {
    hvd_kh_result known;
    if (hvd_kh_lookup(kh->ptr, kh->n, c->host, c->port, NULL, 0, &known, NULL) < 0)
        known.types[0] = '\0';
    const char **algs = NULL;
    int n = libssh2_session_supported_algs(c->session, LIBSSH2_METHOD_HOSTKEY, &algs);
    if (n <= 0) return;
    char pref[1024] = "";
    char types[HVD_KH_TYPES_MAX];
    snprintf(types, sizeof(types), "%s", known.types);
    for (char *save = NULL, *t = strtok_r(types, ",", &save); t; t = strtok_r(NULL, ",", &save))
        for (int i = 0; i < n; i++)
            if (alg_allowed(algs[i]) && !strcmp(alg_key_type(algs[i]), t))
                pref_add(pref, sizeof(pref), algs[i]);
    /* then OpenSSH's default order (libssh2's own puts ECDSA before Ed25519) */
    static const char *const order[] = {"ssh-ed25519",         "ecdsa-sha2-nistp256",
                                        "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                                        "rsa-sha2-512",        "rsa-sha2-256"};
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
        for (int i = 0; i < n; i++)
            if (!strcmp(algs[i], order[k])) pref_add(pref, sizeof(pref), algs[i]);
    for (int i = 0; i < n; i++)
        if (alg_allowed(algs[i])) pref_add(pref, sizeof(pref), algs[i]);
    libssh2_free(c->session, algs);
    debug(c, "host key algorithms: %s", pref);
    if (pref[0] && libssh2_session_method_pref(c->session, LIBSSH2_METHOD_HOSTKEY, pref) != 0)
        debug(c, "cannot set host key algorithms: %s", ssh_errmsg(c));
}

static int handshake(ssh_conn *c, const file_list *kh) {
    const char *step = "key exchange";
    if (!(c->session = libssh2_session_init()))
        return fail(c, HVD_E_INTERNAL, step, "cannot create a libssh2 session");
    libssh2_session_set_blocking(c->session, 0);
    libssh2_session_set_timeout(c->session, CLOSE_TIMEOUT_MS); /* only used by teardown */
    set_hostkey_prefs(c, kh);
    int64_t deadline = hvd_now_ms() + c->timeout_ms;
    int rc;
    while ((rc = libssh2_session_handshake(c->session, c->sock)) == LIBSSH2_ERROR_EAGAIN) {
        int w = wait_session(c, deadline, step);
        if (w == FAIL && hvd_now_ms() >= deadline)
            fail(c, HVD_E_TIMEOUT, step,
                 "no answer within %d ms (is an ssh server listening there?)", c->timeout_ms);
        if (w < 0) return w;
    }
    if (rc != 0) {
        const char *hint = (rc == LIBSSH2_ERROR_BANNER_RECV || rc == LIBSSH2_ERROR_SOCKET_RECV ||
                            rc == LIBSSH2_ERROR_SOCKET_DISCONNECT)
                               ? " (is an ssh server listening there?)"
                               : "";
        return fail(c, HVD_E_PROTOCOL, step, "%s%s", ssh_errmsg(c), hint);
    }
    c->handshake_done = true;
    debug(c, "key exchange done");
    return 0;
}

/* The server's host key, and how messages name it. */
typedef struct host_key {
    const unsigned char *blob; /* SSH wire encoding, owned by the session */
    size_t len;                /* bytes in blob */
    char type[64];             /* "ssh-ed25519" ... */
    char fp[64];               /* "SHA256:..." */
    char name[1100];           /* the host as known_hosts names it ("[host]:port") */
} host_key;

/* No known_hosts line names the host: refused (StrictHostKeyChecking=yes), or accepted and
 * appended to the first user known_hosts file (accept-new). Returns 0 or FAIL. */
static int unknown_host_key(ssh_conn *c, const host_key *k, const file_list *user_kh,
                            const file_list *all_kh) {
    if (!c->opt->accept_new_host_keys) {
        char files[600] = "";
        for (size_t i = 0; i < all_kh->n; i++)
            appendf(files, sizeof(files), "%s%s", i ? ", " : "", all_kh->ptr[i]);
        return fail(c, HVD_E_AUTH, "host key verification",
                    "no host key is known for %s: add it (ssh-keyscan -p %d %s >> %s) or "
                    "accept new keys (hvd-driver --ssh-accept-new; hvd-rsh -o "
                    "StrictHostKeyChecking=accept-new). The server offered %s %s; looked in %s",
                    k->name, c->port, c->host, user_kh->n ? user_kh->ptr[0] : "~/.ssh/known_hosts",
                    k->type, k->fp, files[0] ? files : "no file");
    }
    if (user_kh->n == 0) {
        warn(c,
             "Warning: accepting %s key %s for '%s' without recording it (no known_hosts "
             "file)",
             k->type, k->fp, k->name);
        return 0;
    }
    hvd_err kerr = {0};
    if (hvd_kh_append(user_kh->ptr[0], c->host, c->port, k->blob, k->len, c->opt->hash_known_hosts,
                      &kerr) < 0) {
        warn(c, "Warning: could not add the host key of '%s' to %s: %s", k->name, user_kh->ptr[0],
             kerr.msg);
        return 0;
    }
    warn(c, "Warning: Permanently added '%s' (%s) to the list of known hosts.", k->name, k->type);
    return 0;
}

static int verify_host_key(ssh_conn *c, const file_list *user_kh, const file_list *all_kh) {
    const char *step = "host key verification";
    host_key k = {0};
    int ktype = 0;
    k.blob = (const unsigned char *)libssh2_session_hostkey(c->session, &k.len, &ktype);
    if (!k.blob || hvd_kh_blob_type(k.blob, k.len, k.type, sizeof(k.type)) < 0 ||
        hvd_kh_fingerprint(k.blob, k.len, k.fp, sizeof(k.fp)) < 0)
        return fail(c, HVD_E_PROTOCOL, step, "the server sent no usable host key");
    hvd_kh_host_name(c->host, c->port, k.name, sizeof(k.name));
    debug(c, "server host key: %s %s", k.type, k.fp);

    hvd_kh_result r;
    hvd_err kerr = {0};
    if (hvd_kh_lookup(all_kh->ptr, all_kh->n, c->host, c->port, k.blob, k.len, &r, &kerr) < 0)
        return fail(c, kerr.code, step, "%s", kerr.msg);
    switch (r.status) {
    case HVD_KH_MATCH:
        debug(c, "host key found in %s line %d", r.file, r.line);
        return 0;
    case HVD_KH_REVOKED:
        return fail(c, HVD_E_AUTH, step,
                    "host key %s %s for %s is marked as revoked (known_hosts file %s line %d); "
                    "refusing to connect",
                    k.type, k.fp, k.name, r.file, r.line);
    case HVD_KH_CHANGED:
        return fail(c, HVD_E_AUTH, step,
                    "host key for %s has changed (known_hosts file %s line %d); refusing to "
                    "connect. If the change is expected, remove the old entry (ssh-keygen -R "
                    "'%s' -f %s). The server now offers %s %s",
                    k.name, r.file, r.line, k.name, r.file, k.type, k.fp);
    case HVD_KH_OTHER_TYPE:
        return fail(c, HVD_E_AUTH, step,
                    "the server offered host key %s %s, but known_hosts has only %s keys "
                    "for %s; refusing to connect (remove the old entries with ssh-keygen -R "
                    "'%s' if the server's keys really changed)",
                    k.type, k.fp, r.types, k.name, k.name);
    case HVD_KH_UNKNOWN:
        break;
    }
    return unknown_host_key(c, &k, user_kh, all_kh);
}

/* ---- authentication ----------------------------------------------------------------------- */

static void note(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *buf, size_t len, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 3 >= len) return;
    if (used) {
        memcpy(buf + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* A libssh2 auth error that means the connection is gone, not just "this key was refused". */
static bool fatal_auth_error(int rc) {
    return rc == LIBSSH2_ERROR_SOCKET_SEND || rc == LIBSSH2_ERROR_SOCKET_RECV ||
           rc == LIBSSH2_ERROR_SOCKET_DISCONNECT || rc == LIBSSH2_ERROR_SOCKET_TIMEOUT ||
           rc == LIBSSH2_ERROR_TIMEOUT || rc == LIBSSH2_ERROR_PROTO ||
           rc == LIBSSH2_ERROR_DECRYPT || rc == LIBSSH2_ERROR_INVALID_MAC;
}

/* libssh2 before 1.11 signs with RSA keys only as "ssh-rsa" (SHA-1), which OpenSSH 8.8+
 * servers refuse by default; say so when such a key is refused. */
#if defined(LIBSSH2_VERSION_NUM) && LIBSSH2_VERSION_NUM >= 0x010b00
#define RSA_SHA1_ONLY 0
#else
#define RSA_SHA1_ONLY 1
#endif
#define RSA_HINT                                                                                   \
    "RSA keys are signed with SHA-1 by libssh2 " LIBSSH2_VERSION ", which OpenSSH 8.8+ refuses"

/* Is the key file an RSA key? Judged from its .pub file (the private key may be encrypted). */
static bool rsa_key_file(const char *path) {
    char pub[PATH_MAX + 8], word[16] = "";
    snprintf(pub, sizeof(pub), "%s.pub", path);
    FILE *f = fopen(pub, "re");
    if (!f) return false;
    bool rsa = fscanf(f, "%15s", word) == 1 && !strcmp(word, "ssh-rsa");
    fclose(f);
    return rsa;
}

/* Tries the keys of ssh-agent. Returns 1 if one was accepted, 0 if none, or FAIL/INTR. */
static int auth_agent(ssh_conn *c, char *tried, size_t tlen) {
    const char *step = "authentication";
    const char *sock = c->opt->agent_socket ? c->opt->agent_socket : getenv("SSH_AUTH_SOCK");
    if (!c->opt->use_agent || !sock || !*sock) return 0;
    LIBSSH2_AGENT *agent = libssh2_agent_init(c->session);
    if (!agent) return 0;
    libssh2_agent_set_identity_path(agent, sock);
    int result = 0, n = 0, n_rsa = 0, rc;
    /* Talking to the agent itself is blocking (a local socket); libssh2 has no other mode. */
    if (libssh2_agent_connect(agent) != 0) {
        note(tried, tlen, "ssh-agent (cannot connect to %s)", sock);
    } else if (libssh2_agent_list_identities(agent) != 0) {
        note(tried, tlen, "ssh-agent (cannot list its keys)");
    } else {
        struct libssh2_agent_publickey *id = NULL, *prev = NULL;
        while (result == 0 && libssh2_agent_get_identity(agent, &id, prev) == 0) {
            n++;
            int64_t deadline = hvd_now_ms() + c->timeout_ms;
            while ((rc = libssh2_agent_userauth(agent, c->user, id)) == LIBSSH2_ERROR_EAGAIN) {
                int w = wait_session(c, deadline, step);
                if (w < 0) {
                    result = w;
                    break;
                }
            }
            if (result < 0) break;
            if (rc == 0) {
                debug(c, "authenticated with ssh-agent key '%s'", id->comment ? id->comment : "");
                result = 1;
            } else if (fatal_auth_error(rc)) {
                result = fail(c, HVD_E_IO, step, "connection lost while trying agent keys: %s",
                              ssh_errmsg(c));
            } else {
                char type[64];
                if (hvd_kh_blob_type(id->blob, id->blob_len, type, sizeof(type)) == 0 &&
                    !strcmp(type, "ssh-rsa"))
                    n_rsa++;
            }
            prev = id;
        }
        if (result == 0)
            note(tried, tlen, "ssh-agent (%d key%s refused%s)", n, n == 1 ? "" : "s",
                 RSA_SHA1_ONLY && n_rsa ? "; " RSA_HINT : "");
    }
    libssh2_agent_disconnect(agent);
    libssh2_agent_free(agent);
    return result;
}

/* Tries the identity files. Returns 1 if one was accepted, 0 if none, or FAIL/INTR. */
static int auth_files(ssh_conn *c, char *tried, size_t tlen) {
    const char *step = "authentication";
    static const char *const defaults[] = {"~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa"};
    bool explicit_files = c->opt->n_identity_files > 0 && c->opt->identity_files;
    file_list *files = calloc(1, sizeof(*files));
    if (!files) return fail(c, HVD_E_INTERNAL, step, "out of memory");
    list_fill(files, c->opt->identity_files, c->opt->n_identity_files, defaults, 3);
    int result = 0, rc;
    for (size_t i = 0; i < files->n && result == 0; i++) {
        const char *path = files->ptr[i];
        if (access(path, R_OK) != 0) {
            if (explicit_files) note(tried, tlen, "%s (%s)", path, strerror(errno));
            continue;
        }
        debug(c, "trying key file %s", path);
        int64_t deadline = hvd_now_ms() + c->timeout_ms;
        while ((rc = libssh2_userauth_publickey_fromfile_ex(c->session, c->user,
                                                            (unsigned)strlen(c->user), NULL, path,
                                                            NULL)) == LIBSSH2_ERROR_EAGAIN) {
            int w = wait_session(c, deadline, step);
            if (w < 0) {
                result = w;
                break;
            }
        }
        if (result < 0) break;
        if (rc == 0) {
            debug(c, "authenticated with %s", path);
            result = 1;
        } else if (fatal_auth_error(rc)) {
            result =
                fail(c, HVD_E_IO, step, "connection lost while trying %s: %s", path, ssh_errmsg(c));
        } else if (rc == LIBSSH2_ERROR_FILE) {
            note(tried, tlen, "%s (unusable: passphrase-protected or unsupported format)", path);
        } else {
            note(tried, tlen, "%s (refused%s)", path,
                 RSA_SHA1_ONLY && rsa_key_file(path) ? "; " RSA_HINT : "");
        }
    }
    free(files);
    return result;
}

static int authenticate(ssh_conn *c) {
    const char *step = "authentication";
    int64_t deadline = hvd_now_ms() + c->timeout_ms;
    char *methods;
    for (;;) {
        methods = libssh2_userauth_list(c->session, c->user, (unsigned)strlen(c->user));
        if (methods) break;
        if (libssh2_userauth_authenticated(c->session)) return 0; /* "none" was accepted */
        if (libssh2_session_last_errno(c->session) != LIBSSH2_ERROR_EAGAIN)
            return fail(c, HVD_E_IO, step, "%s", ssh_errmsg(c));
        int w = wait_session(c, deadline, step);
        if (w < 0) return w;
    }
    debug(c, "server allows authentication by: %s", methods);
    if (!strstr(methods, "publickey"))
        return fail(c, HVD_E_AUTH, step,
                    "the server allows only %s for user %s; hvd-rsh authenticates with public "
                    "keys only",
                    methods, c->user);
    char tried[400] = "";
    int rc = auth_agent(c, tried, sizeof(tried));
    if (rc == 0) rc = auth_files(c, tried, sizeof(tried));
    if (rc == 1) return 0;
    if (rc < 0) return rc;
    return fail(c, HVD_E_AUTH, step, "permission denied (publickey) for user %s; tried: %s",
                c->user, tried[0] ? tried : "no keys (no ssh-agent, no key files found)");
}

/* ---- the command -------------------------------------------------------------------------- */

/* Opens a session channel and runs command on it; then sends `input` (len bytes, may be 0)
 * as the command's stdin, and EOF. */
static int open_exec(ssh_conn *c, const char *command, const void *input, size_t len,
                     LIBSSH2_CHANNEL **out) {
    const char *step = "channel";
    int64_t deadline = hvd_now_ms() + c->timeout_ms;
    LIBSSH2_CHANNEL *ch;
    while (!(ch = libssh2_channel_open_session(c->session))) {
        if (libssh2_session_last_errno(c->session) != LIBSSH2_ERROR_EAGAIN)
            return fail(c, HVD_E_IO, step, "the server refused a session channel: %s",
                        ssh_errmsg(c));
        int w = wait_session(c, deadline, step);
        if (w < 0) return w;
    }
    *out = ch;
    int rc;
    RETRY(c, deadline, step, rc, libssh2_channel_exec(ch, command));
    if (rc != 0)
        return fail(c, HVD_E_IO, step, "the server refused to run the command: %s", ssh_errmsg(c));
    /* The command itself (not the kill channel of kill_exec) is now running. */
    if (c->opt->started && out == &c->channel)
        __atomic_store_n(c->opt->started, 1, __ATOMIC_RELEASE);
    for (size_t sent = 0; sent < len;) {
        ssize_t n;
        while ((n = libssh2_channel_write(ch, (const char *)input + sent, len - sent)) ==
               LIBSSH2_ERROR_EAGAIN) {
            int w = wait_session(c, deadline, step);
            if (w < 0) return w;
        }
        if (n < 0)
            return fail(c, HVD_E_IO, step, "cannot send the command's input: %s", ssh_errmsg(c));
        sent += (size_t)n;
    }
    /* Then EOF on stdin (at once without input, as with `ssh -n`). */
    RETRY(c, deadline, step, rc, libssh2_channel_send_eof(ch));
    if (rc != 0)
        return fail(c, HVD_E_IO, step, "cannot close the command's stdin: %s", ssh_errmsg(c));
    return 0;
}

/* Where one remote stream goes. */
typedef struct sink {
    int fd;           /* caller's fd, or -1 to discard */
    const char *name; /* "stdout" / "stderr" */
    bool broken;      /* a write failed: discard from now on */
} sink;

/* State of the command phase. */
typedef struct run_state {
    bool interrupt_seen;    /* interrupt_fd fired */
    int64_t grace_deadline; /* after an interrupt: when to stop waiting for the exit status */
    int64_t kill_exec_at;   /* when to run the kill side channel (0 = never / done) */
    char action[200];       /* what the interrupt did, for the message */
} run_state;

/* Writes buf to the sink in pieces of at most PIPE_BUF bytes after POLLOUT (the fd may be
 * blocking and shared, so it is never switched to non-blocking). Until an interrupt, waits as
 * long as the reader needs (back-pressure reaches the server through the channel window) but
 * notices the interrupt; after it, never waits: what the reader cannot take at once is
 * dropped, since we are leaving. */
static void forward(ssh_conn *c, run_state *st, sink *s, const char *buf, size_t n) {
    while (n > 0 && s->fd >= 0 && !s->broken) {
        struct pollfd p[2] = {{.fd = s->fd, .events = POLLOUT},
                              {.fd = c->interrupt_fd, .events = POLLIN}};
        nfds_t nfds = (c->interrupt_fd >= 0 && !st->interrupt_seen) ? 2 : 1;
        int r = poll(p, nfds, st->interrupt_seen ? 0 : -1);
        if (r < 0 && errno != EINTR) {
            s->broken = true;
            return;
        }
        if (r == 0) return; /* interrupted and the reader is not ready */
        if (nfds == 2 && p[1].revents) st->interrupt_seen = true;
        if (!(p[0].revents & (POLLOUT | POLLERR | POLLHUP | POLLNVAL))) continue;
        ssize_t w = write(s->fd, buf, n < PIPE_BUF ? n : PIPE_BUF);
        if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (w <= 0) {
            debug(c, "cannot write the command's %s: %s; discarding the rest", s->name,
                  w < 0 ? strerror(errno) : "short write");
            s->broken = true;
            return;
        }
        buf += w;
        n -= (size_t)w;
    }
}

/* interrupt_kill_exec: a second channel that signals the process groups of the other
 * sessions of this connection (that is, of our command): sshd makes each session's shell a
 * session leader, and the shell of every channel is a child of the same sshd process. */
static void kill_exec(ssh_conn *c, run_state *st, const char *signame) {
    char cmd[400];
    /* Exits 0 only if it signalled at least one process group. */
    snprintf(cmd, sizeof(cmd),
             "exec /bin/sh -c 'n=0; for p in $(pgrep -P \"$PPID\"); do [ \"$p\" = \"$$\" ] || "
             "{ kill -s %s -- \"-$p\" && n=$((n+1)); }; done; [ $n -gt 0 ]' "
             "</dev/null >/dev/null 2>&1",
             signame);
    LIBSSH2_CHANNEL *ch = NULL;
    hvd_err *saved = c->err;
    hvd_err scratch;
    c->err = &scratch; /* failures here are reported through st->action only */
    int rc = open_exec(c, cmd, NULL, 0, &ch);
    int64_t deadline = hvd_now_ms() + KILL_EXEC_MS;
    if (rc == 0) {
        char buf[256];
        for (;;) { /* no output expected; drain until the channel closes */
            ssize_t n = libssh2_channel_read(ch, buf, sizeof(buf));
            if (n > 0) continue;
            if (n < 0 && n != LIBSSH2_ERROR_EAGAIN) {
                rc = FAIL;
                break;
            }
            if (libssh2_channel_eof(ch) == 1) {
                int wc = libssh2_channel_wait_closed(ch);
                if (wc == 0) break;
                if (wc != LIBSSH2_ERROR_EAGAIN) {
                    rc = FAIL;
                    break;
                }
            }
            if (wait_session(c, deadline, "kill channel") < 0) {
                rc = FAIL;
                break;
            }
        }
    }
    int status = rc == 0 ? libssh2_channel_get_exit_status(ch) : -1;
    if (ch) {
        /* Best effort: if the close does not finish now, teardown frees the channel with the
         * session. */
        (void)libssh2_channel_close(ch);
        if (libssh2_channel_free(ch) == LIBSSH2_ERROR_EAGAIN) debug(c, "kill channel left open");
    }
    c->err = saved;
    const char *then = st->action[0] ? ", then " : "";
    if (rc == 0 && status == 0)
        appendf(st->action, sizeof(st->action),
                "%sSIG%s to its process group through a second channel", then, signame);
    else
        appendf(st->action, sizeof(st->action), "%sthe kill channel failed (%s)", then,
                rc == 0 ? "pgrep/kill failed on the server" : scratch.msg);
    debug(c, "interrupt: %s", st->action);
}

static void on_interrupt(ssh_conn *c, run_state *st, const char *signame) {
    int64_t now = hvd_now_ms();
    int grace =
        c->opt->interrupt_grace_ms > 0 ? c->opt->interrupt_grace_ms : HVD_SSH_DEFAULT_GRACE_MS;
    c->interrupted = true;
    st->grace_deadline = now + grace;
    debug(c, "interrupted: ending the remote command");
#if HAVE_CHANNEL_SIGNAL
    int rc;
    int64_t deadline = now + CLOSE_TIMEOUT_MS;
    while ((rc = libssh2_channel_signal_ex(c->channel, signame, strlen(signame))) ==
               LIBSSH2_ERROR_EAGAIN &&
           wait_session(c, deadline, "signal") == 0) {
    }
    if (rc == 0)
        appendf(st->action, sizeof(st->action), "sent SIG%s (signal request)", signame);
    else
        appendf(st->action, sizeof(st->action), "could not send a signal request (%s)",
                ssh_errmsg(c));
    if (c->opt->interrupt_kill_exec) st->kill_exec_at = now + (grace / 2 < 1000 ? grace / 2 : 1000);
#else
    (void)signame;
    snprintf(st->action, sizeof(st->action), "no signal request (libssh2 %s cannot send one)",
             LIBSSH2_VERSION);
    if (c->opt->interrupt_kill_exec) {
        st->action[0] = '\0';
        st->kill_exec_at = now;
    }
#endif
}

/* Reads what the channel has on stdout and stderr and forwards it. Returns 1 if anything
 * came, 0 if nothing did, or FAIL. */
static int pump_output(ssh_conn *c, run_state *st, sink sinks[2], char *buf) {
    int progress = 0;
    for (int stream = 0; stream < 2; stream++) {
        ssize_t n = libssh2_channel_read_ex(c->channel, stream, buf, IO_CHUNK);
        if (n > 0) {
            forward(c, st, &sinks[stream], buf, (size_t)n);
            progress = 1;
        } else if (n < 0 && n != LIBSSH2_ERROR_EAGAIN) {
            return fail(c, HVD_E_IO, "channel", "connection lost while the command ran: %s",
                        ssh_errmsg(c));
        }
    }
    return progress;
}

/* Returns 1 once the server has sent EOF and the channel is closed, 0 while not yet, or
 * FAIL. */
static int channel_closed(ssh_conn *c) {
    if (libssh2_channel_eof(c->channel) != 1) return 0;
    int wc = libssh2_channel_wait_closed(c->channel);
    if (wc == 0) return 1;
    if (wc == LIBSSH2_ERROR_EAGAIN) return 0;
    return fail(c, HVD_E_IO, "channel", "connection lost while the command ran: %s", ssh_errmsg(c));
}

/* Waits for the socket, the interrupt, or the next interrupt deadline; not at all after
 * progress. Returns 0 or FAIL. */
static int wait_command(ssh_conn *c, run_state *st, bool progress, int64_t now) {
    int timeout = progress ? 0 : POLL_CAP_MS;
    if (c->interrupted) {
        int64_t next = st->kill_exec_at ? st->kill_exec_at : st->grace_deadline;
        if (next - now < timeout) timeout = next - now < 0 ? 0 : (int)(next - now);
    }
    int dir = libssh2_session_block_directions(c->session);
    struct pollfd p[2] = {
        {.fd = c->sock, .events = POLLIN | ((dir & LIBSSH2_SESSION_BLOCK_OUTBOUND) ? POLLOUT : 0)},
        {.fd = c->interrupt_fd, .events = POLLIN}};
    nfds_t nfds = (c->interrupt_fd >= 0 && !st->interrupt_seen) ? 2 : 1;
    if (poll(p, nfds, timeout) < 0 && errno != EINTR)
        return fail(c, HVD_E_IO, "channel", "poll: %s", strerror(errno));
    if (nfds == 2 && p[1].revents) st->interrupt_seen = true;
    return 0;
}

/* The exit status of the closed channel, 128+N if the command was killed by signal N. */
static int exit_status(ssh_conn *c) {
    char *sig = NULL;
    size_t siglen = 0;
    libssh2_channel_get_exit_signal(c->channel, &sig, &siglen, NULL, NULL, NULL, NULL);
    if (!sig) {
        int status = libssh2_channel_get_exit_status(c->channel);
        debug(c, "remote command exited with status %d", status);
        return status;
    }
    int num = signal_number(sig, siglen);
    debug(c, "remote command killed by signal %.*s", (int)siglen, sig);
    libssh2_free(c->session, sig);
    return num > 0 ? 128 + num : HVD_SSH_EXIT_FAILURE;
}

/* Streams the command's output until its channel closes (or, after an interrupt, until the
 * grace period ends). Returns 0 with *status = exit status (-1 if none arrived), or FAIL. */
static int run_command(ssh_conn *c, int out_fd, int err_fd, run_state *st, int *status) {
    const char *signame = c->opt->interrupt_signal ? c->opt->interrupt_signal : "TERM";
    sink sinks[2] = {{.fd = out_fd, .name = "stdout"}, {.fd = err_fd, .name = "stderr"}};
    char *buf = malloc(IO_CHUNK);
    if (!buf) return fail(c, HVD_E_INTERNAL, "channel", "out of memory");
    int rc = 0;
    *status = -1;
    for (;;) {
        int progress = pump_output(c, st, sinks, buf);
        int closed = progress == 0 ? channel_closed(c) : 0;
        if (progress < 0 || closed < 0) {
            rc = FAIL;
            break;
        }
        if (closed) {
            *status = exit_status(c);
            break;
        }
        if (st->interrupt_seen && !c->interrupted) on_interrupt(c, st, signame);
        int64_t now = hvd_now_ms();
        if (st->kill_exec_at && now >= st->kill_exec_at) {
            st->kill_exec_at = 0;
            kill_exec(c, st, signame);
            continue;
        }
        if (c->interrupted && now >= st->grace_deadline) break;
        if (wait_command(c, st, progress > 0, now) < 0) {
            rc = FAIL;
            break;
        }
    }
    free(buf);
    return rc;
}

/* Says goodbye politely if that is quick, then frees everything without blocking. */
static void teardown(ssh_conn *c) {
    int64_t deadline = hvd_now_ms() + CLOSE_TIMEOUT_MS;
    c->interrupted = true; /* no more interrupt checks */
    hvd_err *saved = c->err;
    c->err = NULL; /* the caller's error stays what it was */
    if (c->session && c->sock >= 0 && c->handshake_done) {
        if (c->channel)
            while (libssh2_channel_close(c->channel) == LIBSSH2_ERROR_EAGAIN &&
                   wait_session(c, deadline, "close") == 0) {
            }
        while (libssh2_session_disconnect(c->session, "hvd-rsh done") == LIBSSH2_ERROR_EAGAIN &&
               wait_session(c, deadline, "disconnect") == 0) {
        }
    }
    if (c->sock >= 0) shutdown(c->sock, SHUT_RDWR); /* from here on nothing can block */
    if (c->session) {
        libssh2_session_set_blocking(c->session, 1);
        if (c->channel) libssh2_channel_free(c->channel);
        libssh2_session_free(c->session);
    }
    if (c->sock >= 0) close(c->sock);
    c->channel = NULL;
    c->session = NULL;
    c->sock = -1;
    c->err = saved;
}

/* ---- public ------------------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_rc;
static void init_libssh2(void) {
    init_rc = libssh2_init(0);
}

void hvd_ssh_options_init(hvd_ssh_options *opt) {
    memset(opt, 0, sizeof(*opt));
    opt->use_agent = true;
}

void hvd_ssh_options_from_args(hvd_ssh_options *opt, const hvd_ssh_args *a) {
    opt->host = a->host;
    if (a->port) opt->port = a->port;
    if (a->user) opt->user = a->user;
    if (a->n_identity_files) {
        opt->identity_files = (const char *const *)a->identity_files;
        opt->n_identity_files = a->n_identity_files;
    }
    if (a->n_user_known_hosts) {
        opt->user_known_hosts = (const char *const *)a->user_known_hosts;
        opt->n_user_known_hosts = a->n_user_known_hosts;
    }
    if (a->n_global_known_hosts) {
        opt->global_known_hosts = (const char *const *)a->global_known_hosts;
        opt->n_global_known_hosts = a->n_global_known_hosts;
    }
    if (a->hostkey_policy != HVD_SSH_HOSTKEY_UNSET)
        opt->accept_new_host_keys = a->hostkey_policy == HVD_SSH_HOSTKEY_ACCEPT_NEW;
    if (a->hash_known_hosts >= 0) opt->hash_known_hosts = a->hash_known_hosts == 1;
    if (a->connect_timeout_ms > 0) opt->connect_timeout_ms = a->connect_timeout_ms;
    opt->verbose += a->verbose;
    opt->quiet = opt->quiet || a->quiet;
}

static bool valid_signame(const char *s) {
    if (!*s || strlen(s) > 16) return false;
    for (; *s; s++)
        if (!isupper((unsigned char)*s) && !isdigit((unsigned char)*s)) return false;
    return true;
}

/* Checks the options and settles who logs in where (c->user, c->where). Returns 0 or FAIL. */
static int check_options(ssh_conn *c, const char *command) {
    const hvd_ssh_options *opt = c->opt;
    snprintf(c->where, sizeof(c->where), "%s", opt->host && *opt->host ? opt->host : "(no host)");
    if (!opt->host || !*opt->host) return fail(c, HVD_E_INVALID, "options", "no host given");
    if (opt->user && *opt->user)
        snprintf(c->user, sizeof(c->user), "%s", opt->user);
    else if (current_user(c->user, sizeof(c->user)) < 0)
        return fail(c, HVD_E_INVALID, "options", "cannot tell the current user name; give one");
    snprintf(c->where, sizeof(c->where), strchr(opt->host, ':') ? "%s@[%s]:%d" : "%s@%s:%d",
             c->user, opt->host, c->port);
    if (!command || !*command)
        return fail(c, HVD_E_INVALID, "options",
                    "no remote command given (interactive sessions are not supported)");
    if (opt->interrupt_signal && !valid_signame(opt->interrupt_signal))
        return fail(c, HVD_E_INVALID, "options", "bad interrupt signal name '%s'",
                    opt->interrupt_signal);
    if (c->port > 65535) return fail(c, HVD_E_INVALID, "options", "bad port %d", c->port);
    return 0;
}

/* The known_hosts files of one run. */
typedef struct kh_files {
    file_list user; /* UserKnownHostsFile (~/.ssh/known_hosts): the first one gets new keys */
    file_list all;  /* the user files, then GlobalKnownHostsFile (/etc/ssh/ssh_known_hosts) */
} kh_files;

/* The known_hosts files opt names, or the defaults; NULL when out of memory. */
static kh_files *known_hosts_files(const hvd_ssh_options *opt) {
    static const char *const user_default[] = {"~/.ssh/known_hosts"};
    static const char *const global_default[] = {"/etc/ssh/ssh_known_hosts"};
    kh_files *kh = calloc(1, sizeof(*kh));
    if (!kh) return NULL;
    list_fill(&kh->user, opt->user_known_hosts, opt->n_user_known_hosts, user_default, 1);
    list_fill(&kh->all, opt->user_known_hosts, opt->n_user_known_hosts, user_default, 1);
    list_fill(&kh->all, opt->global_known_hosts, opt->n_global_known_hosts, global_default, 1);
    return kh;
}

/* Every step from the TCP connection to the command's end. Returns 0 with *status (see
 * run_command), FAIL or INTR. */
static int connect_and_run(ssh_conn *c, const kh_files *kh, const char *command, int out_fd,
                           int err_fd, run_state *st, int *status) {
    int rc = connect_host(c);
    if (rc == 0) rc = handshake(c, &kh->all);
    if (rc == 0) rc = verify_host_key(c, &kh->user, &kh->all);
    if (rc == 0) rc = authenticate(c);
    if (rc == 0) {
        debug(c, "running: %s", command);
        rc = open_exec(c, command, c->opt->stdin_data, c->opt->stdin_len, &c->channel);
    }
    if (rc == 0) rc = run_command(c, out_fd, err_fd, st, status);
    return rc;
}

/* The command ran and was interrupted: says in err what was done. Returns HVD_SSH_INTERRUPTED
 * with *exit_code = the command's status if it arrived in time. */
static int report_interrupt(ssh_conn *c, const run_state *st, int status, int *exit_code) {
    if (status >= 0) {
        *exit_code = status;
        fail(c, HVD_E_SHUTDOWN, "interrupted", "%s; the command ended with exit code %d",
             st->action, status);
    } else {
        fail(c, HVD_E_SHUTDOWN, "interrupted",
             "%s; the command did not end within the grace period, closed its channel (it "
             "gets SIGPIPE at its next write)",
             st->action);
    }
    return HVD_SSH_INTERRUPTED;
}

int hvd_ssh_run(const hvd_ssh_options *opt, const char *command, int out_fd, int err_fd,
                int interrupt_fd, int *exit_code, hvd_err *err) {
    ssh_conn c = {
        .opt = opt,
        .host = opt->host,
        .port = opt->port > 0 ? opt->port : HVD_SSH_DEFAULT_PORT,
        .timeout_ms = opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms
                                                  : HVD_SSH_DEFAULT_CONNECT_TIMEOUT_MS,
        .interrupt_fd = interrupt_fd,
        .log_fd = err_fd >= 0 ? err_fd : STDERR_FILENO,
        .sock = -1,
        .err = err,
    };
    *exit_code = HVD_SSH_EXIT_FAILURE;
    if (check_options(&c, command) < 0) return -1;
    pthread_once(&init_once, init_libssh2);
    if (init_rc != 0) return fail(&c, HVD_E_INTERNAL, "init", "libssh2_init failed");
    kh_files *kh = known_hosts_files(opt);
    if (!kh) return fail(&c, HVD_E_INTERNAL, "init", "out of memory");

    run_state st = {0};
    int status = -1;
    int rc = connect_and_run(&c, kh, command, out_fd, err_fd, &st, &status);
    teardown(&c);
    free(kh);
    if (rc == INTR) return HVD_SSH_INTERRUPTED; /* before the command ran; err is set */
    if (rc < 0) return -1;
    if (st.interrupt_seen) return report_interrupt(&c, &st, status, exit_code);
    *exit_code = status >= 0 ? status : 0;
    return 0;
}
