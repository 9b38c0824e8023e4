/* The blocking RPC client (include/hvd/rpc.h): parallel address probing, the client side of
 * the handshake, sealed calls with timeouts, streams and failover. */
#include "hvd/rpc.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "envelope.h"
#include "frame.h"
#include "handshake.h"
#include "common/sock.h"

#include <openssl/crypto.h>

struct hvd_client {
    hvd_client_config cfg;
    char *service;
    hvd_addr *addrs;
    size_t naddrs;
    size_t cur; /* index of the connected address */
    int fd;     /* -1 when not connected */
    hvd_seal rx, tx;
    hvd_buf in;
    hvd_buf out;
    msgpack_sbuffer sb;
    size_t sealed_len; /* of the frame being read; 0 while reading its header */
    uint64_t next_id;
    bool confirm_due; /* the service's confirmation has not been read yet (see connect_any) */
};

static void disconnect(hvd_client *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    hvd_seal_free(&c->rx);
    hvd_seal_free(&c->tx);
    hvd_buf_free(&c->in);
    hvd_buf_free(&c->out);
    c->sealed_len = 0;
    c->confirm_due = false;
}

/* ---- Blocking I/O with deadlines ---------------------------------------------------------- */

static int send_all(int fd, const uint8_t *p, size_t n, int64_t deadline, hvd_err *err) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = hvd_wait_fd(fd, POLLOUT, hvd_ms_left(deadline));
            if (r == 0) return hvd_err_set(err, HVD_E_TIMEOUT, "timed out sending");
            if (r < 0) return hvd_err_set(err, HVD_E_IO, "poll: %s", strerror(errno));
            continue;
        }
        return hvd_err_set(err, HVD_E_IO, "send: %s", strerror(errno));
    }
    return 0;
}

/* Reads until `in` holds at least n unconsumed bytes. Waits in poll() before each read: a
 * reply is rarely there the moment it is wanted, so this saves the read that would fail. */
static int recv_at_least(int fd, hvd_buf *in, size_t n, int64_t deadline, hvd_err *err) {
    while (hvd_buf_pending(in) < n) {
        int w = hvd_wait_fd(fd, POLLIN, hvd_ms_left(deadline));
        if (w == 0) return hvd_err_set(err, HVD_E_TIMEOUT, "timed out waiting for the service");
        if (w < 0) return hvd_err_set(err, HVD_E_IO, "poll: %s", strerror(errno));
        size_t want = n - hvd_buf_pending(in);
        if (hvd_buf_reserve(in, want < 16384 ? 16384 : want) != 0)
            return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        ssize_t r = recv(fd, in->data + in->len, in->cap - in->len, 0);
        if (r > 0) {
            in->len += (size_t)r;
            continue;
        }
        if (r == 0) return hvd_err_set(err, HVD_E_IO, "connection closed by the service");
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return hvd_err_set(err, HVD_E_IO, "recv: %s", strerror(errno));
    }
    return 0;
}

/* Reads the service's confirmation of the handshake (an empty sealed frame), which comes
 * before the reply to the first request sent right after the proof. Returns 0, or -1 with
 * err. */
static int read_confirm(hvd_client *c, int64_t deadline, hvd_err *err) {
    size_t sealed, plen;
    if (recv_at_least(c->fd, &c->in, HVD_FRAME_HDR + HVD_TAG_LEN, deadline, err) != 0) {
        if (err && err->code == HVD_E_IO)
            hvd_err_set(err, HVD_E_AUTH,
                        "the service rejected our proof of the job secret: is the secret "
                        "(" HVD_SECRET_ENV ") the same on both sides?");
        return -1;
    }
    uint8_t *frame = c->in.data + c->in.off;
    if (hvd_frame_header(frame, c->cfg.max_frame, &sealed, err) != 0 || sealed != HVD_TAG_LEN ||
        hvd_frame_open(&c->rx, frame, sealed, &plen, err) != 0)
        return hvd_err_set(err, HVD_E_AUTH, "the service's confirmation did not authenticate");
    hvd_buf_consume(&c->in, HVD_FRAME_HDR + HVD_TAG_LEN);
    c->confirm_due = false;
    return 0;
}

/* Reads and opens the next frame. On success the payload is at *payload (inside c->in) and
 * must be consumed with hvd_buf_consume(&c->in, *frame_len) when done. */
static int read_frame(hvd_client *c, int64_t deadline, uint8_t **payload, size_t *plen,
                      size_t *frame_len, hvd_err *err) {
    if (recv_at_least(c->fd, &c->in, HVD_FRAME_HDR, deadline, err) != 0) return -1;
    size_t sealed;
    if (hvd_frame_header(c->in.data + c->in.off, c->cfg.max_frame, &sealed, err) != 0) return -1;
    if (recv_at_least(c->fd, &c->in, HVD_FRAME_HDR + sealed, deadline, err) != 0) return -1;
    uint8_t *frame = c->in.data + c->in.off;
    if (hvd_frame_open(&c->rx, frame, sealed, plen, err) != 0) return -1;
    *payload = frame + HVD_FRAME_HDR;
    *frame_len = HVD_FRAME_HDR + sealed;
    return 0;
}

/* ---- Connecting --------------------------------------------------------------------------- */

/* One address being probed: a non-blocking connect, then the client side of the handshake,
 * driven by poll() alongside the other addresses so that a peer that accepts but never answers
 * cannot hold up the others. */
typedef enum { PR_CONNECTING, PR_CHALLENGE, PR_CONFIRM, PR_DONE, PR_FAILED } probe_state;

typedef struct probe {
    int fd;
    size_t idx; /* into c->addrs */
    probe_state state;
    int64_t connected_ms; /* when the TCP connect completed (the service's handshake clock) */
    uint8_t nc[HVD_NONCE_LEN];
    hvd_buf in;
    hvd_seal rx, tx;
    int fail_code;
    char why[HVD_ERR_MAX];
} probe;

static void probe_fail(probe *p, int code, const char *why) {
    p->state = PR_FAILED;
    p->fail_code = code;
    snprintf(p->why, sizeof p->why, "%s", why);
}

/* Sends a handshake message whole; it is tiny, so it always fits in an empty socket buffer. */
static int probe_send(probe *p, const uint8_t *msg, size_t len) {
    ssize_t n = send(p->fd, msg, len, MSG_NOSIGNAL);
    if (n == (ssize_t)len) return 0;
    probe_fail(p, HVD_E_IO, n < 0 ? strerror(errno) : "short send during the handshake");
    return -1;
}

/* Reads what is there without blocking; returns -1 (and fails the probe) on EOF or error. */
static int probe_recv(probe *p) {
    if (hvd_buf_reserve(&p->in, 256) != 0) {
        probe_fail(p, HVD_E_INTERNAL, "out of memory");
        return -1;
    }
    ssize_t n = recv(p->fd, p->in.data + p->in.len, p->in.cap - p->in.len, 0);
    if (n > 0) {
        p->in.len += (size_t)n;
        return 0;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    int64_t into = hvd_now_ms() - p->connected_ms;
    if (p->state == PR_CONFIRM && into >= HVD_HANDSHAKE_TIMEOUT_DEFAULT_MS - 500) {
        char why[160];
        snprintf(why, sizeof why,
                 "the service closed the connection %lld ms into the handshake, past its time "
                 "limit: is the machine overloaded?",
                 (long long)into);
        probe_fail(p, HVD_E_TIMEOUT, why);
    } else if (p->state == PR_CONFIRM) {
        probe_fail(
            p, HVD_E_AUTH,
            "the service rejected our proof of the job secret: is the secret (" HVD_SECRET_ENV
            ") the same on both sides?");
    } else
        probe_fail(p, HVD_E_IO, n == 0 ? "closed during the handshake" : strerror(errno));
    return -1;
}

/* Advances one probe after poll() reported an event on it. */
static void probe_step(hvd_client *c, probe *p) {
    if (p->state == PR_CONNECTING) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr != 0) {
            probe_fail(p, HVD_E_IO, strerror(soerr));
            return;
        }
        hvd_sock_tune(p->fd, c->cfg.io_timeout_ms);
        uint8_t hello[HVD_HELLO_LEN];
        if (hvd_hs_nonce(p->nc) != 0) {
            probe_fail(p, HVD_E_INTERNAL, "no random nonce");
            return;
        }
        hvd_hs_hello(p->nc, hello);
        p->connected_ms = hvd_now_ms();
        if (probe_send(p, hello, sizeof hello) == 0) p->state = PR_CHALLENGE;
        return;
    }
    if (probe_recv(p) != 0) return;
    if (p->state == PR_CHALLENGE) {
        if (hvd_buf_pending(&p->in) < HVD_CHALLENGE_LEN) return;
        const uint8_t *ch = p->in.data + p->in.off;
        if (memcmp(ch, "HVDB", 4) != 0) {
            probe_fail(p, HVD_E_PROTOCOL, "the peer does not speak the hvd-bridge protocol");
            return;
        }
        if (ch[5] == HVD_HS_BAD_VERSION || ch[4] != HVD_PROTOCOL_VERSION) {
            char why[96];
            snprintf(why, sizeof why, "the service speaks protocol version %u, we speak %u", ch[4],
                     HVD_PROTOCOL_VERSION);
            probe_fail(p, HVD_E_PROTOCOL, why);
            return;
        }
        if (ch[5] != HVD_HS_OK) {
            char why[64];
            snprintf(why, sizeof why, "the service refused the handshake (status %u)", ch[5]);
            probe_fail(p, HVD_E_PROTOCOL, why);
            return;
        }
        const uint8_t *ns = ch + 8, *ps = ch + 8 + HVD_NONCE_LEN;
        uint8_t want[HVD_MAC_LEN], proof[HVD_PROOF_LEN], c2s[HVD_KEY_LEN], s2c[HVD_KEY_LEN];
        int rc = hvd_hs_proof(&c->cfg.secret, c->service, 1, p->nc, ns, want) ||
                 hvd_hs_proof(&c->cfg.secret, c->service, 0, p->nc, ns, proof) ||
                 hvd_hs_keys(&c->cfg.secret, c->service, p->nc, ns, c2s, s2c);
        if (rc == 0 && !hvd_ct_equal(want, ps, HVD_MAC_LEN)) {
            char why[160];
            snprintf(why, sizeof why,
                     "the service could not prove it holds the job secret for '%s': is the "
                     "secret (%s) the same on both sides, and is this the right service?",
                     c->service, HVD_SECRET_ENV);
            probe_fail(p, HVD_E_AUTH, why);
        } else if (rc != 0 || hvd_seal_init(&p->rx, s2c, 0) != 0 ||
                   hvd_seal_init(&p->tx, c2s, 1) != 0) {
            probe_fail(p, HVD_E_INTERNAL, "key setup failed");
        } else {
            hvd_buf_consume(&p->in, HVD_CHALLENGE_LEN);
            if (probe_send(p, proof, sizeof proof) == 0) p->state = PR_CONFIRM;
        }
        OPENSSL_cleanse(c2s, sizeof c2s);
        OPENSSL_cleanse(s2c, sizeof s2c);
        return;
    }
    if (p->state == PR_CONFIRM) {
        /* The service confirms with an empty sealed frame, or hangs up on a wrong proof. */
        if (hvd_buf_pending(&p->in) < HVD_FRAME_HDR + HVD_TAG_LEN) return;
        size_t sealed, plen;
        hvd_err ferr;
        uint8_t *frame = p->in.data + p->in.off;
        if (hvd_frame_header(frame, c->cfg.max_frame, &sealed, &ferr) != 0 ||
            sealed != HVD_TAG_LEN || hvd_frame_open(&p->rx, frame, sealed, &plen, &ferr) != 0) {
            probe_fail(p, HVD_E_AUTH, "the service's confirmation did not authenticate");
            return;
        }
        hvd_buf_consume(&p->in, HVD_FRAME_HDR + HVD_TAG_LEN);
        p->state = PR_DONE;
    }
}

static void probe_free(probe *p) {
    if (p->fd >= 0) close(p->fd);
    hvd_buf_free(&p->in);
    hvd_seal_free(&p->rx);
    hvd_seal_free(&p->tx);
}

/* What happened at a probe's address, in words. */
static const char *probe_outcome(const probe *p) {
    if (p->state == PR_FAILED) return p->why;
    return p->state == PR_CONNECTING ? "no answer within the probe timeout"
                                     : "the handshake did not finish in time";
}

/* Appends to buf (size len, *used bytes in it), cutting at the end. */
static void append(char *buf, size_t len, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (w > 0) *used = *used + (size_t)w < len ? *used + (size_t)w : len - 1;
}

/* "host:port, host:port and 3 more: what happened; host:port: ..." into buf: the addresses
 * grouped by what happened there, each reason said once (a wrong secret fails alike at every
 * address of the service). */
static void report(char *buf, size_t len, const hvd_client *c, const probe *ps, size_t n) {
    enum { NAMED = 3 }; /* addresses named per reason */
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < n; k++) {
        const char *why = probe_outcome(&ps[k]);
        bool seen = false;
        for (size_t j = 0; j < k && !seen; j++)
            seen = strcmp(probe_outcome(&ps[j]), why) == 0;
        if (seen) continue;
        size_t same = 0;
        for (size_t j = k; j < n; j++) {
            if (strcmp(probe_outcome(&ps[j]), why) != 0) continue;
            char as[HVD_HOST_MAX + 16];
            if (same++ < NAMED)
                append(buf, len, &used, "%s%s",
                       same > 1 ? ", "
                       : used   ? "; "
                                : "",
                       hvd_addr_str(&c->addrs[ps[j].idx], as, sizeof as));
        }
        if (same > NAMED) append(buf, len, &used, " and %zu more", same - NAMED);
        append(buf, len, &used, ": %s", why);
    }
}

/* Starts the TCP connect of probe k (address (first + k) % n). */
static void probe_start(hvd_client *c, probe *p, size_t first, size_t k) {
    hvd_err e;
    p->idx = (first + k) % c->naddrs;
    p->fd = hvd_connect_start(&c->addrs[p->idx], &e);
    if (p->fd < 0) probe_fail(p, e.code, e.msg);
}

/* Probes the addresses, starting with `first`, and keeps the first that completes a
 * handshake. Without a stagger every address starts at once; with one, the next address
 * starts when every started one has failed, when none has connected within the stagger, or
 * when one connected but has not finished its handshake within ten staggers (a peer that
 * accepts and never answers must not hold up the others). So a service that answers on its
 * first address does one handshake, not one per address. */
static int connect_any(hvd_client *c, size_t first, hvd_err *err) {
    size_t n = c->naddrs;
    probe *ps = calloc(n, sizeof *ps);
    struct pollfd *pfds = calloc(n, sizeof *pfds);
    size_t *live = calloc(n, sizeof *live);
    char rep[HVD_ERR_MAX] = "";
    int auth_failed = 0, timed_out = 0, rc = -1;
    if (!ps || !pfds || !live) {
        free(ps);
        free(pfds);
        free(live);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    int64_t deadline = hvd_now_ms() + c->cfg.probe_timeout_ms;
    int stagger = c->cfg.stagger_ms > 0 ? c->cfg.stagger_ms : 0;
    size_t started = stagger ? 1 : n;
    for (size_t k = 0; k < started; k++)
        probe_start(c, &ps[k], first, k);
    int64_t next_at = hvd_now_ms() + stagger; /* when the next address starts */
    probe *winner = NULL;
    while (!winner) {
        size_t nl = 0;
        bool connected = false; /* a started address got past its TCP connect */
        for (size_t k = 0; k < started; k++) {
            if (ps[k].state == PR_FAILED || ps[k].state == PR_DONE) continue;
            pfds[nl] = (struct pollfd){.fd = ps[k].fd,
                                       .events = ps[k].state == PR_CONNECTING ? POLLOUT : POLLIN};
            connected |= ps[k].state != PR_CONNECTING;
            live[nl++] = k;
        }
        bool more = started < n && hvd_now_ms() < deadline;
        int64_t at = connected ? next_at + 9 * (int64_t)stagger : next_at;
        if (more && (nl == 0 || hvd_now_ms() >= at)) {
            probe_start(c, &ps[started], first, started);
            started++;
            next_at = hvd_now_ms() + stagger;
            continue;
        }
        if (nl == 0) break;
        int wait = hvd_ms_left(deadline);
        if (more && hvd_ms_left(at) < wait) wait = hvd_ms_left(at);
        int pr = poll(pfds, nl, wait);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0 || (pr == 0 && hvd_now_ms() >= deadline)) break;
        /* In address order, so that when several answer at once the preferred one wins. */
        for (size_t j = 0; j < nl && !winner; j++) {
            if (!pfds[j].revents) continue;
            probe *p = &ps[live[j]];
            probe_step(c, p);
            /* Once our proof is sent the service has proven itself (its challenge carried
             * its proof): requests may follow the proof at once, saving a round trip, and
             * the confirmation is read before the first reply. */
            if (p->state == PR_DONE || p->state == PR_CONFIRM) winner = p;
        }
    }
    if (winner) {
        c->confirm_due = winner->state == PR_CONFIRM;
        c->fd = winner->fd;
        c->cur = winner->idx;
        c->rx = winner->rx;
        c->tx = winner->tx;
        c->in = winner->in; /* anything sent right after the confirmation */
        winner->fd = -1;
        memset(&winner->rx, 0, sizeof winner->rx);
        memset(&winner->tx, 0, sizeof winner->tx);
        memset(&winner->in, 0, sizeof winner->in);
        rc = 0;
    } else {
        for (size_t k = 0; k < started; k++) {
            if (ps[k].state != PR_FAILED)
                timed_out = 1;
            else if (ps[k].fail_code == HVD_E_AUTH)
                auth_failed = 1;
        }
        report(rep, sizeof rep, c, ps, started);
        if (started < n) {
            size_t used = strlen(rep);
            append(rep, sizeof rep, &used, "; %zu more not tried in time", n - started);
        }
        hvd_err_set(err,
                    auth_failed ? HVD_E_AUTH
                    : timed_out ? HVD_E_TIMEOUT
                                : HVD_E_IO,
                    "cannot connect to %s at %s", c->service, rep);
    }
    for (size_t k = 0; k < started; k++)
        probe_free(&ps[k]);
    free(ps);
    free(pfds);
    free(live);
    return rc;
}

/* True if the service has closed our connection (say, after its idle timeout): then a request
 * must go on a new connection rather than be lost on this one. */
static bool peer_closed(hvd_client *c) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    uint8_t b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

/* Makes sure there is a live connection, reconnecting (preferred address first) if needed. */
static int ensure_connected(hvd_client *c, hvd_err *err) {
    if (c->fd >= 0 && !peer_closed(c)) return 0;
    disconnect(c);
    return connect_any(c, c->cur, err);
}

hvd_client *hvd_client_connect(const hvd_client_config *cfg, hvd_err *err) {
    if (!cfg->service || !*cfg->service || strlen(cfg->service) > HVD_SERVICE_NAME_LEN_MAX ||
        cfg->naddrs == 0) {
        hvd_err_set(err, HVD_E_INVALID, "a client needs a service name and at least one address");
        return NULL;
    }
    hvd_client *c = calloc(1, sizeof *c);
    if (!c) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (!c->cfg.probe_timeout_ms) c->cfg.probe_timeout_ms = 3000;
    if (!c->cfg.io_timeout_ms) c->cfg.io_timeout_ms = 30000;
    hvd_client_set_max_frame(c, c->cfg.max_frame);
    c->fd = -1;
    c->service = strdup(cfg->service);
    c->addrs = malloc(cfg->naddrs * sizeof *c->addrs);
    c->naddrs = cfg->naddrs;
    msgpack_sbuffer_init(&c->sb);
    c->cfg.service = NULL;
    c->cfg.addrs = NULL;
    if (!c->service || !c->addrs) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        hvd_client_close(c);
        return NULL;
    }
    memcpy(c->addrs, cfg->addrs, cfg->naddrs * sizeof *c->addrs);
    if (connect_any(c, 0, err) != 0) {
        hvd_client_close(c);
        return NULL;
    }
    return c;
}

void hvd_client_set_max_frame(hvd_client *c, size_t max_frame) {
    if (!max_frame) max_frame = HVD_DEFAULT_MAX_FRAME;
    c->cfg.max_frame = max_frame > HVD_MAX_FRAME_LIMIT ? HVD_MAX_FRAME_LIMIT : max_frame;
}

void hvd_client_close(hvd_client *c) {
    if (!c) return;
    disconnect(c);
    msgpack_sbuffer_destroy(&c->sb);
    hvd_secret_wipe(&c->cfg.secret);
    free(c->service);
    free(c->addrs);
    free(c);
}

const hvd_addr *hvd_client_addr(const hvd_client *c) {
    return &c->addrs[c->cur];
}

/* ---- Calls -------------------------------------------------------------------------------- */

static int send_request(hvd_client *c, uint64_t id, const hvd_msg_desc *desc, const void *msg,
                        int64_t deadline, hvd_err *err) {
    if (hvd_envelope_pack(&c->sb, HVD_KIND_REQUEST, desc->type, id, desc, msg) != 0)
        return hvd_err_set(err, HVD_E_INVALID, "request %s could not be encoded", desc->name);
    if (c->sb.size > c->cfg.max_frame)
        return hvd_err_set(err, HVD_E_INVALID, "request %s is %zu bytes, over the %zu-byte limit",
                           desc->name, c->sb.size, c->cfg.max_frame);
    c->out.off = c->out.len = 0;
    if (hvd_frame_seal(&c->tx, (const uint8_t *)c->sb.data, c->sb.size, &c->out) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "sealing failed");
    return send_all(c->fd, c->out.data, c->out.len, deadline, err);
}

/* Result of waiting for one frame. */
enum { GOT_REPLY, GOT_CHUNK, GOT_OTHER };

/* Reads one frame for request `id`: a reply (decoded into resp or turned into err), a chunk
 * (handed to on_chunk), or something else (skipped). Returns GOT_* or -1 with err; *remote is
 * set when err carries the service's own error reply. */
static int read_for(hvd_client *c, uint64_t id, int64_t deadline, const hvd_msg_desc *resp_desc,
                    void *resp, hvd_chunk_fn on_chunk, void *user, int *remote, hvd_err *err) {
    uint8_t *payload;
    size_t plen, flen;
    *remote = 0;
    /* The confirmation counts as a frame of its own, so that a caller that waits for data
     * (and for an interrupt) between frames goes back to waiting after it. */
    if (c->confirm_due) return read_confirm(c, deadline, err) == 0 ? GOT_OTHER : -1;
    if (read_frame(c, deadline, &payload, &plen, &flen, err) != 0) return -1;
    hvd_envelope env;
    int rc = GOT_OTHER;
    if (hvd_envelope_unpack(payload, plen, &env, err) != 0) {
        hvd_buf_consume(&c->in, flen);
        return -1;
    }
    if (env.id == 0 && env.kind == HVD_KIND_REPLY && env.type == HVD_MSG_ERROR) {
        /* The service could not read a request well enough to know its id: since calls are
         * one at a time, it was ours. */
        hvd_error_body e;
        if (hvd_msg_unpack(env.body, &hvd_error_desc, &e, err) == 0) {
            hvd_err_set(err, (int)e.code, "the service could not decode our request: %s",
                        e.message ? e.message : "(no message)");
            hvd_msg_free(&hvd_error_desc, &e);
            *remote = 1;
        }
        rc = -1;
    } else if (env.id != id) {
        rc = GOT_OTHER;
    } else if (env.kind == HVD_KIND_STREAM) {
        hvd_chunk ch;
        if (hvd_msg_unpack(env.body, &hvd_chunk_desc, &ch, err) != 0) {
            rc = -1;
        } else {
            rc = GOT_CHUNK;
            if (on_chunk && on_chunk(ch.channel, ch.data.data, ch.data.len, user) != 0) {
                hvd_err_set(err, HVD_E_IO, "stream abandoned by the receiver");
                rc = -1;
            }
            hvd_msg_free(&hvd_chunk_desc, &ch);
        }
    } else if (env.kind != HVD_KIND_REPLY) {
        rc = hvd_err_set(err, HVD_E_PROTOCOL, "the service sent a request to a client");
    } else if (env.type == HVD_MSG_ERROR) {
        hvd_error_body e;
        if (hvd_msg_unpack(env.body, &hvd_error_desc, &e, err) == 0) {
            hvd_err_set(err, (int)e.code, "%s", e.message ? e.message : "(no message)");
            hvd_msg_free(&hvd_error_desc, &e);
            *remote = 1;
        }
        rc = -1;
    } else if (env.type != resp_desc->type) {
        rc = hvd_err_set(err, HVD_E_PROTOCOL, "expected a %s reply, got message type %u",
                         resp_desc->name, env.type);
    } else {
        rc = hvd_msg_unpack(env.body, resp_desc, resp, err) == 0 ? GOT_REPLY : -1;
    }
    hvd_envelope_free(&env);
    hvd_buf_consume(&c->in, flen);
    return rc;
}

/* Prefixes err with the service and the address the call went to. */
static void name_err(hvd_client *c, hvd_err *err) {
    char as[HVD_HOST_MAX + 16];
    hvd_err_prefix(err, "%s at %s: ", c->service, hvd_addr_str(&c->addrs[c->cur], as, sizeof as));
}

int hvd_client_call(hvd_client *c, const hvd_msg_desc *req_desc, const void *req,
                    const hvd_msg_desc *resp_desc, void *resp, int timeout_ms, unsigned flags,
                    hvd_err *err) {
    int tries = (flags & HVD_CALL_RETRY) ? 2 : 1;
    if (resp && resp_desc->size) memset(resp, 0, resp_desc->size);
    for (int t = 0; t < tries; t++) {
        if (t == 0 ? ensure_connected(c, err) != 0
                   : connect_any(c, (c->cur + 1) % c->naddrs, err) != 0)
            return -1;
        int to = timeout_ms == 0 ? c->cfg.io_timeout_ms : timeout_ms;
        int64_t deadline = to < 0 ? -1 : hvd_now_ms() + to;
        uint64_t id = ++c->next_id;
        int remote = 0;
        int rc = send_request(c, id, req_desc, req, deadline, err);
        while (rc == 0) {
            rc = read_for(c, id, deadline, resp_desc, resp, NULL, NULL, &remote, err);
            if (rc == GOT_REPLY) return 0;
            if (rc >= 0) rc = 0; /* skip other frames */
        }
        if (remote) { /* the service answered with an error: the connection is fine */
            name_err(c, err);
            return -1;
        }
        int code = err ? err->code : HVD_E_IO;
        disconnect(c);
        if (code == HVD_E_TIMEOUT || code == HVD_E_INVALID || t + 1 == tries) {
            name_err(c, err);
            return -1;
        }
    }
    return -1;
}

int hvd_client_send(hvd_client *c, const hvd_msg_desc *req_desc, const void *req, hvd_err *err) {
    if (c->fd < 0) return hvd_err_set(err, HVD_E_IO, "not connected");
    int64_t deadline = hvd_now_ms() + c->cfg.io_timeout_ms;
    if (send_request(c, ++c->next_id, req_desc, req, deadline, err) != 0) {
        name_err(c, err);
        return -1;
    }
    return 0;
}

int hvd_client_call_stream(hvd_client *c, const hvd_msg_desc *req_desc, const void *req,
                           hvd_chunk_fn on_chunk, void *user, int interrupt_fd,
                           void (*on_interrupt)(hvd_client *c, void *user),
                           const hvd_msg_desc *resp_desc, void *resp, int timeout_ms,
                           hvd_err *err) {
    if (resp && resp_desc->size) memset(resp, 0, resp_desc->size);
    if (ensure_connected(c, err) != 0) return -1;
    int to = timeout_ms == 0 ? c->cfg.io_timeout_ms : timeout_ms;
    uint64_t id = ++c->next_id;
    int remote = 0;
    int64_t deadline = to < 0 ? -1 : hvd_now_ms() + to;
    int rc = send_request(c, id, req_desc, req, deadline, err);
    bool interrupted = false;
    while (rc == 0) {
        /* An interrupt is noticed between frames even while data keeps arriving. */
        if (interrupt_fd >= 0 && !interrupted && hvd_wait_fd(interrupt_fd, POLLIN, 0) == 1) {
            interrupted = true;
            if (on_interrupt) on_interrupt(c, user);
            if (c->fd < 0) {
                rc = hvd_err_set(err, HVD_E_IO, "connection lost while interrupting");
                break;
            }
        }
        /* Wait for data, or for the interrupt descriptor. */
        if (hvd_buf_pending(&c->in) == 0) {
            struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN},
                                  {.fd = interrupt_fd, .events = POLLIN}};
            int np = (interrupt_fd >= 0 && !interrupted) ? 2 : 1;
            int pr = poll(p, (nfds_t)np, hvd_ms_left(deadline));
            if (pr < 0 && errno == EINTR) continue;
            if (pr == 0) {
                rc = hvd_err_set(err, HVD_E_TIMEOUT, "no data from the service for %d ms", to);
                break;
            }
            if (np == 2 && p[1].revents) {
                interrupted = true;
                if (on_interrupt) on_interrupt(c, user);
                if (c->fd < 0) {
                    rc = hvd_err_set(err, HVD_E_IO, "connection lost while interrupting");
                    break;
                }
                continue;
            }
        }
        rc = read_for(c, id, deadline, resp_desc, resp, on_chunk, user, &remote, err);
        if (rc == GOT_REPLY) return 0;
        if (rc >= 0) {
            rc = 0;
            deadline = to < 0 ? -1 : hvd_now_ms() + to; /* the timeout is for silence */
        }
    }
    if (!remote) disconnect(c);
    name_err(c, err);
    return -1;
}

int hvd_client_ping(hvd_client *c, hvd_pong *pong, hvd_err *err) {
    return hvd_client_call(c, &hvd_ping_desc, NULL, &hvd_pong_desc, pong, 0, HVD_CALL_RETRY, err);
}
