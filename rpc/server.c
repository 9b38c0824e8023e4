/* The event-driven RPC server (include/hvd/rpc.h), on an event loop of its own
 * (common/loop.h) whose thread runs everything about connections: accept, handshake, frame
 * opening, dispatch to handlers, replies and streams. Other threads reach it through the
 * loop's posts and read counters. A connection closed while the loop's current batch may
 * still point at it is unlinked at once and freed after the batch. */
#include "hvd/rpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/loop.h"
#include "common/sock.h"
#include "envelope.h"
#include "frame.h"
#include "handshake.h"

#define SWEEP_MS          250       /* how often timeouts are checked */
#define READ_BUDGET       (1 << 20) /* bytes read from one connection per wake-up, for fairness */
#define STOP_FLUSH_MS     1000      /* how long stop lets pending output drain */
#define ACCEPT_BACKOFF_MS 100       /* pause in accepting after EMFILE and the like */

typedef enum { CS_HELLO, CS_PROOF, CS_OPEN, CS_DEAD } conn_state;

typedef struct conn {
    hvd_server *srv;
    int fd;
    hvd_watch *watch; /* the loop's watch of fd */
    conn_state state;
    char peer[HVD_HOST_MAX];
    uint8_t nc[HVD_NONCE_LEN], ns[HVD_NONCE_LEN];
    hvd_seal rx, tx;
    hvd_buf in, out;
    size_t sealed_len;  /* length of the frame being read; 0 while reading its header */
    int64_t created_ms; /* for the handshake timeout */
    int64_t last_rx_ms; /* for the idle timeout */
    int64_t stall_ms;   /* when pending output last made progress (0: nothing pending) */
    int err;            /* the errno that broke the connection (0: none, or end of file) */
    uint32_t events;    /* epoll events armed now */
    size_t accounted;   /* pending output counted in stats.output_queued */
    bool paused;        /* not reading: output is over max_output (resumes below half) */
    hvd_call *calls;    /* unanswered calls of this connection */
    struct conn *prev, *next;
} conn;

struct hvd_call {
    conn *c; /* NULL once the connection is gone */
    hvd_server *srv;
    uint64_t id;
    uint32_t type;
    bool in_handler; /* the handler is running: answering must not free the call yet */
    bool answered;
    int close_err; /* its connection's err, set when the connection went away */
    hvd_call_fn cancel_fn;
    void *cancel_arg;
    hvd_call_fn writable_fn;
    void *writable_arg;
    struct hvd_call *prev, *next;
};

typedef struct handler {
    uint32_t type;
    hvd_handler_fn fn;
    void *user;
} handler;

typedef struct counters {
    atomic_uint_fast64_t accepted, refused, handshake_failed, frames_rejected, malformed,
        unknown_type, requests, timeouts, open_conns, output_queued;
} counters;

struct hvd_server {
    hvd_server_config cfg;
    char *name;
    int listen_fd;
    uint16_t port;
    hvd_loop *loop;          /* the loop everything runs on (owned) */
    hvd_watch *listen_watch; /* NULL once stopping */

    handler *handlers;
    size_t nhandlers;

    bool started;    /* the loop thread was started */
    bool stopped;    /* hvd_server_stop finished */
    bool draining;   /* stopping: only pending output is still written */
    char *bind_host; /* the numeric address bound, or NULL for all interfaces */

    conn *conns;        /* open connections */
    conn *dead;         /* closed this batch, freed after it */
    size_t handshaking; /* connections in CS_HELLO or CS_PROOF (loop thread) */

    msgpack_sbuffer sb; /* scratch for encoding on the loop thread */
    counters st;
};

#define COUNT(s, field) atomic_fetch_add_explicit(&(s)->st.field, 1, memory_order_relaxed)

/* ---- Connections ------------------------------------------------------------------------ */

static void conn_close(conn *c);
static void conn_flush(conn *c);

static void call_unlink(hvd_call *call) {
    conn *c = call->c;
    if (!c) return;
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next) call->next->prev = call->prev;
    call->prev = call->next = NULL;
    call->c = NULL;
}

static void call_release(hvd_call *call) {
    call_unlink(call);
    free(call);
}

static bool wants_writable(const conn *c) {
    for (const hvd_call *call = c->calls; call; call = call->next)
        if (call->writable_fn) return true;
    return false;
}

/* Arms the epoll events the connection needs now: input unless reading is paused (a peer that
 * sends requests without reading replies must not grow our output without bound) or the
 * server is draining; output while anything is pending or a call waits for room. */
static void update_interest(conn *c) {
    if (c->state == CS_DEAD) return;
    size_t pending = hvd_buf_pending(&c->out), max = c->srv->cfg.max_output;
    if (!c->paused && pending > max)
        c->paused = true;
    else if (c->paused && pending < max / 2)
        c->paused = false;
    uint32_t ev = (c->paused || c->srv->draining ? 0 : EPOLLIN) |
                  (pending > 0 || wants_writable(c) ? EPOLLOUT : 0);
    if (ev == c->events) return;
    if (hvd_loop_watch_events(c->srv->loop, c->watch, ev, NULL) == 0) c->events = ev;
}

/* Runs the writable callbacks once output is below half the bound. Called only from the
 * EPOLLOUT path, never from inside a send, so callbacks may send freely. */
static void fire_writable(conn *c) {
    size_t half = c->srv->cfg.max_output / 2;
    /* Callbacks may answer calls (unlinking them) or queue more output: re-check both after
     * each one. */
    while (c->state != CS_DEAD && hvd_buf_pending(&c->out) < half) {
        hvd_call *call = c->calls;
        while (call && !call->writable_fn)
            call = call->next;
        if (!call) break;
        hvd_call_fn fn = call->writable_fn;
        call->writable_fn = NULL;
        fn(call->writable_arg);
    }
    update_interest(c);
}

/* Keeps stats.output_queued equal to the sum of the connections' pending output. */
static void account_output(conn *c) {
    size_t now = c->state == CS_DEAD ? 0 : hvd_buf_pending(&c->out);
    if (now >= c->accounted)
        atomic_fetch_add_explicit(&c->srv->st.output_queued, now - c->accounted,
                                  memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&c->srv->st.output_queued, c->accounted - now,
                                  memory_order_relaxed);
    c->accounted = now;
}

static void conn_flush(conn *c) {
    account_output(c);
    while (hvd_buf_pending(&c->out) > 0 && c->state != CS_DEAD) {
        ssize_t n = send(c->fd, c->out.data + c->out.off, hvd_buf_pending(&c->out), MSG_NOSIGNAL);
        if (n > 0) {
            hvd_buf_consume(&c->out, (size_t)n);
            account_output(c);
            c->stall_ms = hvd_now_ms();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->err = n < 0 ? errno : 0;
        conn_close(c);
        return;
    }
    if (c->state == CS_DEAD) return;
    if (hvd_buf_pending(&c->out) == 0) c->stall_ms = 0;
    update_interest(c);
}

/* The encoding scratch kept between replies; a larger one is freed after its reply. */
#define SCRATCH_KEEP (4u << 20)

/* Seals and queues one envelope. Returns 0, or -1 (connection closed). */
static int conn_send(conn *c, uint32_t kind, uint32_t type, uint64_t id, const hvd_msg_desc *desc,
                     const void *msg) {
    hvd_server *s = c->srv;
    if (c->state != CS_OPEN) return -1;
    if (hvd_envelope_pack(&s->sb, kind, type, id, desc, msg) != 0) return -2;
    int sealed = hvd_frame_seal(&c->tx, (const uint8_t *)s->sb.data, s->sb.size, &c->out);
    if (s->sb.alloc > SCRATCH_KEEP) { /* a large reply (a payload): not kept for good */
        msgpack_sbuffer_destroy(&s->sb);
        msgpack_sbuffer_init(&s->sb);
    }
    if (sealed != 0) {
        conn_close(c);
        return -1;
    }
    if (c->stall_ms == 0) c->stall_ms = hvd_now_ms();
    conn_flush(c);
    return c->state == CS_DEAD ? -1 : 0;
}

static void conn_close(conn *c) {
    if (c->state == CS_DEAD) return;
    hvd_server *s = c->srv;
    if (c->state != CS_OPEN) s->handshaking--;
    c->state = CS_DEAD;
    account_output(c);
    hvd_loop_unwatch(s->loop, c->watch);
    c->watch = NULL;
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = NULL;
    c->next = s->dead;
    s->dead = c;
    atomic_fetch_sub_explicit(&s->st.open_conns, 1, memory_order_relaxed);
    /* Cancel what is still held; calls inside their handler are detached and freed when the
     * handler returns. */
    while (c->calls) {
        hvd_call *call = c->calls;
        call_unlink(call);
        if (call->in_handler) continue;
        call->close_err = c->err;
        if (call->cancel_fn) call->cancel_fn(call->cancel_arg);
        free(call);
    }
}

static void conn_free(conn *c) {
    hvd_seal_free(&c->rx);
    hvd_seal_free(&c->tx);
    hvd_buf_free(&c->in);
    hvd_buf_free(&c->out);
    free(c);
}

/* The loop's after-batch hook: frees the connections closed during the batch. */
static void bury_dead(void *arg) {
    hvd_server *s = arg;
    while (s->dead) {
        conn *c = s->dead;
        s->dead = c->next;
        conn_free(c);
    }
}

/* ---- Dispatch ---------------------------------------------------------------------------- */

static const handler *find_handler(hvd_server *s, uint32_t type) {
    for (size_t i = 0; i < s->nhandlers; i++)
        if (s->handlers[i].type == type) return &s->handlers[i];
    return NULL;
}

static void send_error(conn *c, uint64_t id, int code, const char *msg) {
    hvd_error_body e = {.code = (uint32_t)code, .message = (char *)msg};
    conn_send(c, HVD_KIND_REPLY, HVD_MSG_ERROR, id, &hvd_error_desc, &e);
}

static void dispatch(conn *c, const hvd_envelope *env) {
    hvd_server *s = c->srv;
    if (env->kind != HVD_KIND_REQUEST) {
        COUNT(s, malformed);
        send_error(c, env->id, HVD_E_PROTOCOL, "servers accept only requests");
        return;
    }
    if (env->type == HVD_MSG_PING) {
        COUNT(s, requests);
        hvd_pong pong = {.service = s->name, .peer_host = c->peer, .version = HVD_PROTOCOL_VERSION};
        conn_send(c, HVD_KIND_REPLY, HVD_MSG_PONG, env->id, &hvd_pong_desc, &pong);
        return;
    }
    const handler *h = find_handler(s, env->type);
    if (!h) {
        COUNT(s, unknown_type);
        char msg[HVD_SERVICE_NAME_LEN_MAX + 64];
        snprintf(msg, sizeof msg, "%s does not serve message type %u", s->name, env->type);
        send_error(c, env->id, HVD_E_UNKNOWN_TYPE, msg);
        return;
    }
    COUNT(s, requests);
    hvd_call *call = calloc(1, sizeof *call);
    if (!call) {
        send_error(c, env->id, HVD_E_INTERNAL, "out of memory");
        return;
    }
    call->c = c;
    call->srv = s;
    call->id = env->id;
    call->type = env->type;
    call->next = c->calls;
    if (c->calls) c->calls->prev = call;
    c->calls = call;
    call->in_handler = true;
    h->fn(call, env->body, h->user);
    call->in_handler = false;
    if (call->answered) {
        call_release(call);
    } else if (!call->c) { /* connection died during the handler */
        if (call->cancel_fn) call->cancel_fn(call->cancel_arg);
        free(call);
    } else if (!call->cancel_fn) {
        hvd_call_fail(call, HVD_E_INTERNAL,
                      "%s kept request type %u without a cancel callback (a bug in the service)",
                      s->name, env->type);
    }
}

/* ---- Reading ----------------------------------------------------------------------------- */

static void handshake_fail(conn *c) {
    COUNT(c->srv, handshake_failed);
    conn_close(c);
}

static void on_hello(conn *c) {
    hvd_server *s = c->srv;
    int bad_version = 0;
    uint8_t ps[HVD_MAC_LEN] = {0}, msg[HVD_CHALLENGE_LEN];
    hvd_err err;
    if (hvd_hs_parse_hello(c->in.data + c->in.off, c->nc, &bad_version, &err) != 0) {
        if (bad_version) { /* tell the peer why before hanging up */
            hvd_hs_challenge(HVD_HS_BAD_VERSION, c->ns, ps, msg);
            (void)!send(c->fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        handshake_fail(c);
        return;
    }
    hvd_buf_consume(&c->in, HVD_HELLO_LEN);
    if (hvd_hs_nonce(c->ns) != 0 ||
        hvd_hs_proof(&s->cfg.secret, s->name, 1, c->nc, c->ns, ps) != 0) {
        conn_close(c);
        return;
    }
    hvd_hs_challenge(HVD_HS_OK, c->ns, ps, msg);
    if (hvd_buf_append(&c->out, msg, sizeof msg) != 0) {
        conn_close(c);
        return;
    }
    c->state = CS_PROOF;
    conn_flush(c);
}

static void on_proof(conn *c) {
    hvd_server *s = c->srv;
    uint8_t want[HVD_MAC_LEN], c2s[HVD_KEY_LEN], s2c[HVD_KEY_LEN];
    if (hvd_hs_proof(&s->cfg.secret, s->name, 0, c->nc, c->ns, want) != 0) {
        conn_close(c);
        return;
    }
    if (!hvd_ct_equal(want, c->in.data + c->in.off, HVD_MAC_LEN)) {
        handshake_fail(c); /* wrong secret or wrong service name: drop without a word */
        return;
    }
    hvd_buf_consume(&c->in, HVD_PROOF_LEN);
    int rc = hvd_hs_keys(&s->cfg.secret, s->name, c->nc, c->ns, c2s, s2c);
    if (rc == 0) rc = hvd_seal_init(&c->rx, c2s, 0);
    if (rc == 0) rc = hvd_seal_init(&c->tx, s2c, 1);
    OPENSSL_cleanse(c2s, sizeof c2s);
    OPENSSL_cleanse(s2c, sizeof s2c);
    if (rc != 0) {
        conn_close(c);
        return;
    }
    c->state = CS_OPEN;
    c->srv->handshaking--;
    /* The confirmation: an empty sealed frame the client must open with the s2c key. */
    if (hvd_frame_seal(&c->tx, NULL, 0, &c->out) != 0) {
        conn_close(c);
        return;
    }
    conn_flush(c);
}

/* Consumes whatever complete handshake messages or frames the input holds. */
static void process_input(conn *c) {
    hvd_server *s = c->srv;
    while (c->state != CS_DEAD && !c->paused) {
        size_t have = hvd_buf_pending(&c->in);
        if (c->state == CS_HELLO) {
            if (have < HVD_HELLO_LEN) return;
            on_hello(c);
            continue;
        }
        if (c->state == CS_PROOF) {
            if (have < HVD_PROOF_LEN) return;
            on_proof(c);
            continue;
        }
        if (c->sealed_len == 0) {
            if (have < HVD_FRAME_HDR) return;
            hvd_err err;
            if (hvd_frame_header(c->in.data + c->in.off, s->cfg.max_frame, &c->sealed_len, &err) !=
                0) {
                COUNT(s, frames_rejected);
                conn_close(c);
                return;
            }
        }
        if (have < HVD_FRAME_HDR + c->sealed_len) {
            /* Reserve the whole frame now that its length is known to be within bounds. */
            if (hvd_buf_reserve(&c->in, HVD_FRAME_HDR + c->sealed_len - have) != 0) conn_close(c);
            return;
        }
        size_t plen;
        hvd_err err;
        uint8_t *frame = c->in.data + c->in.off;
        size_t sealed = c->sealed_len;
        c->sealed_len = 0;
        if (hvd_frame_open(&c->rx, frame, sealed, &plen, &err) != 0) {
            COUNT(s, frames_rejected);
            conn_close(c);
            return;
        }
        c->last_rx_ms = hvd_now_ms();
        hvd_envelope env;
        if (hvd_envelope_unpack(frame + HVD_FRAME_HDR, plen, &env, &err) != 0) {
            COUNT(s, malformed);
            send_error(c, env.has_id ? env.id : 0, HVD_E_PROTOCOL, err.msg);
        } else {
            dispatch(c, &env);
            hvd_envelope_free(&env);
        }
        hvd_buf_consume(&c->in, HVD_FRAME_HDR + sealed);
    }
}

static void on_readable(conn *c) {
    size_t budget = READ_BUDGET;
    while (c->state != CS_DEAD && budget > 0) {
        if (hvd_buf_reserve(&c->in, 16384) != 0) {
            conn_close(c);
            return;
        }
        size_t room = c->in.cap - c->in.len;
        ssize_t n = recv(c->fd, c->in.data + c->in.len, room, 0);
        if (n > 0) {
            c->in.len += (size_t)n;
            budget = (size_t)n >= budget ? 0 : budget - (size_t)n;
            process_input(c);
            /* A short read drained the socket: skip the recv that would say EAGAIN (epoll is
             * level-triggered, so anything arriving later is reported again). */
            if ((size_t)n < room) return;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (c->state == CS_HELLO || c->state == CS_PROOF) COUNT(c->srv, handshake_failed);
        c->err = n < 0 ? errno : 0;
        conn_close(c); /* EOF or error */
        return;
    }
}

/* The loop's callback for a connection's descriptor. */
static void conn_event(int fd, uint32_t e, void *arg) {
    (void)fd;
    conn *c = arg;
    if (c->state == CS_DEAD) return;
    if (e & EPOLLOUT) {
        bool was_paused = c->paused;
        conn_flush(c);
        /* Frames that arrived while reading was paused are handled now. */
        if (was_paused && !c->paused) process_input(c);
        fire_writable(c);
    }
    if (c->state != CS_DEAD && (e & (EPOLLIN | EPOLLERR | EPOLLHUP))) on_readable(c);
}

/* ---- Accepting ---------------------------------------------------------------------------- */

static void rearm_listen(void *arg) {
    hvd_server *s = arg;
    if (s->listen_watch) hvd_loop_watch_events(s->loop, s->listen_watch, EPOLLIN, NULL);
}

static void conn_add(hvd_server *s, int fd, const struct sockaddr_storage *ss) {
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->state = CS_HELLO;
    c->created_ms = c->last_rx_ms = hvd_now_ms();
    hvd_sockaddr_host(ss, c->peer, sizeof c->peer);
    hvd_sock_tune(fd, s->cfg.net_timeout_ms);
    c->events = EPOLLIN;
    c->watch = hvd_loop_watch(s->loop, fd, EPOLLIN, conn_event, c, NULL);
    if (!c->watch) {
        close(fd);
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->handshaking++;
    COUNT(s, accepted);
    atomic_fetch_add_explicit(&s->st.open_conns, 1, memory_order_relaxed);
}

/* Whether the peer at ss already holds the most handshakes one source may (so that one source
 * cannot take every connection slot with handshakes it never finishes). Walks the connections
 * only when that many handshakes are under way at all. */
static bool source_full(hvd_server *s, const struct sockaddr_storage *ss) {
    size_t max = s->cfg.max_handshakes_per_source;
    if (s->handshaking < max) return false;
    char peer[HVD_HOST_MAX];
    hvd_sockaddr_host(ss, peer, sizeof peer);
    size_t n = 0;
    for (conn *c = s->conns; c && n < max; c = c->next)
        if (c->state != CS_OPEN && strcmp(c->peer, peer) == 0) n++;
    return n >= max;
}

static void on_accept(int lfd, uint32_t events, void *arg) {
    (void)events;
    hvd_server *s = arg;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors or memory: the pending connection stays queued and the
                 * socket stays readable, so stop listening for a moment instead of spinning. */
                hvd_loop_watch_events(s->loop, s->listen_watch, 0, NULL);
                hvd_loop_timer(s->loop, ACCEPT_BACKOFF_MS, rearm_listen, s);
            }
            return;
        }
        if (atomic_load(&s->st.open_conns) >= s->cfg.max_conns || source_full(s, &ss)) {
            COUNT(s, refused);
            close(fd);
            continue;
        }
        conn_add(s, fd, &ss);
    }
}

/* ---- Timeouts ------------------------------------------------------------------------------ */

/* Closes connections past their handshake, write or idle timeout; runs every SWEEP_MS. */
static void sweep(void *arg) {
    hvd_server *s = arg;
    int64_t now = hvd_now_ms();
    const hvd_server_config *cfg = &s->cfg;
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        bool expired = false;
        if (c->state != CS_OPEN)
            expired = now - c->created_ms > cfg->handshake_timeout_ms;
        else if (c->stall_ms && now - c->stall_ms > cfg->net_timeout_ms) {
            expired = true;
            c->err = ETIMEDOUT;
        } else if (!c->calls && hvd_buf_pending(&c->out) == 0)
            expired = now - c->last_rx_ms > cfg->idle_timeout_ms;
        if (expired) {
            COUNT(s, timeouts);
            if (c->state != CS_OPEN) COUNT(s, handshake_failed);
            conn_close(c);
        }
    }
    hvd_loop_timer(s->loop, SWEEP_MS, sweep, s);
}

/* ---- Stopping ---------------------------------------------------------------------------- */

/* After the loop stopped: lets replies already queued drain for up to STOP_FLUSH_MS, on the
 * calling thread, writing only (no new connections, requests, timers or other watches). */
static void drain_output(hvd_server *s) {
    s->draining = true;
    int64_t deadline = hvd_now_ms() + STOP_FLUSH_MS;
    for (;;) {
        size_t n = 0;
        for (conn *c = s->conns; c; c = c->next)
            if (hvd_buf_pending(&c->out) > 0) n++;
        int left = hvd_ms_left(deadline);
        if (n == 0 || left <= 0) return;
        struct pollfd *pf = calloc(n, sizeof *pf);
        conn **cs = calloc(n, sizeof *cs);
        if (!pf || !cs) {
            free(pf);
            free(cs);
            return;
        }
        size_t k = 0;
        for (conn *c = s->conns; c && k < n; c = c->next)
            if (hvd_buf_pending(&c->out) > 0) {
                cs[k] = c;
                pf[k++] = (struct pollfd){.fd = c->fd, .events = POLLOUT};
            }
        if (poll(pf, k, left > 50 ? 50 : left) > 0)
            for (size_t i = 0; i < k; i++)
                if (pf[i].revents) conn_flush(cs[i]);
        free(pf);
        free(cs);
        bury_dead(s);
    }
}

/* ---- Public API ------------------------------------------------------------------------- */

hvd_server *hvd_server_create(const hvd_server_config *cfg, hvd_err *err) {
    if (!cfg->name || !*cfg->name || strlen(cfg->name) > HVD_SERVICE_NAME_LEN_MAX) {
        hvd_err_set(err, HVD_E_INVALID, "a service needs a name of 1 to %d characters",
                    HVD_SERVICE_NAME_LEN_MAX);
        return NULL;
    }
    hvd_server *s = calloc(1, sizeof *s);
    if (!s) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    if (!s->cfg.max_frame) s->cfg.max_frame = HVD_DEFAULT_MAX_FRAME;
    if (s->cfg.max_frame > HVD_MAX_FRAME_LIMIT) s->cfg.max_frame = HVD_MAX_FRAME_LIMIT;
    if (!s->cfg.handshake_timeout_ms)
        s->cfg.handshake_timeout_ms = HVD_HANDSHAKE_TIMEOUT_DEFAULT_MS;
    if (!s->cfg.idle_timeout_ms) s->cfg.idle_timeout_ms = 60000;
    if (!s->cfg.net_timeout_ms) s->cfg.net_timeout_ms = 30000;
    if (!s->cfg.max_conns) s->cfg.max_conns = 16384;
    if (!s->cfg.max_handshakes_per_source)
        s->cfg.max_handshakes_per_source = HVD_HANDSHAKES_PER_SOURCE_DEFAULT;
    if (!s->cfg.max_output) s->cfg.max_output = 4u << 20;
    s->cfg.bind_host = NULL; /* kept in s->bind_host */
    s->name = strdup(cfg->name);
    s->listen_fd = -1;
    msgpack_sbuffer_init(&s->sb);
    char bind[HVD_HOST_MAX];
    if (hvd_bind_resolve(cfg->bind_host, bind, sizeof bind, err) != 0) {
        hvd_err_prefix(err, "%s: ", cfg->name);
        goto fail;
    }
    if (bind[0]) s->bind_host = strdup(bind);
    if (!s->name || (bind[0] && !s->bind_host)) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto fail;
    }
    s->listen_fd = hvd_listen_tcp(s->bind_host, cfg->port, &s->port, err);
    if (s->listen_fd < 0 || !(s->loop = hvd_loop_create(err)) ||
        !(s->listen_watch = hvd_loop_watch(s->loop, s->listen_fd, EPOLLIN, on_accept, s, err))) {
        hvd_err_prefix(err, "%s: ", cfg->name);
        goto fail;
    }
    hvd_loop_set_after_batch(s->loop, bury_dead, s);
    return s;
fail:
    hvd_server_destroy(s);
    return NULL;
}

int hvd_server_handle(hvd_server *s, uint32_t type, hvd_handler_fn fn, void *user) {
    if (type < 100 || s->started || find_handler(s, type)) return -1;
    handler *h = realloc(s->handlers, (s->nhandlers + 1) * sizeof *h);
    if (!h) return -1;
    s->handlers = h;
    s->handlers[s->nhandlers++] = (handler){type, fn, user};
    return 0;
}

int hvd_server_start(hvd_server *s, hvd_err *err) {
    if (s->started) return hvd_err_set(err, HVD_E_STATE, "%s is already started", s->name);
    if (!hvd_loop_timer(s->loop, SWEEP_MS, sweep, s))
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    if (hvd_loop_start(s->loop, err) != 0) return hvd_err_prefix(err, "%s: ", s->name);
    s->started = true;
    return 0;
}

void hvd_server_stop(hvd_server *s) {
    if (!s || s->stopped) return;
    /* The loop thread ends after its current batch, and what was posted runs here (so posted
     * work, such as answers queued by other threads, is never silently lost). This thread
     * now owns everything: no new connections; queued output drains; then closing the
     * connections cancels the calls still held. */
    hvd_loop_stop(s->loop);
    hvd_loop_unwatch(s->loop, s->listen_watch);
    s->listen_watch = NULL;
    for (conn *c = s->conns; c; c = c->next)
        update_interest(c);
    drain_output(s);
    while (s->conns)
        conn_close(s->conns);
    bury_dead(s);
    s->stopped = true;
}

void hvd_server_destroy(hvd_server *s) {
    if (!s) return;
    hvd_server_stop(s);
    hvd_loop_free(s->loop);
    if (s->listen_fd >= 0) close(s->listen_fd);
    msgpack_sbuffer_destroy(&s->sb);
    hvd_secret_wipe(&s->cfg.secret);
    free(s->handlers);
    free(s->name);
    free(s->bind_host);
    free(s);
}

uint16_t hvd_server_port(const hvd_server *s) {
    return s->port;
}

const char *hvd_server_name(const hvd_server *s) {
    return s->name;
}

struct hvd_loop *hvd_server_loop(hvd_server *s) {
    return s->loop;
}

int hvd_server_addrs(const hvd_server *s, const char *const *only, hvd_addr **out, size_t *n,
                     hvd_err *err) {
    if (!s->bind_host) return hvd_local_addrs(out, n, s->port, only, err);
    /* Bound to one address: that one, named after its interface when it has one. */
    hvd_addr *all = NULL, *one = calloc(1, sizeof *one);
    size_t nall = 0;
    if (!one) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    snprintf(one->host, sizeof one->host, "%s", s->bind_host);
    one->port = s->port;
    if (hvd_local_addrs(&all, &nall, s->port, NULL, NULL) == 0) {
        for (size_t i = 0; i < nall; i++)
            if (strcmp(all[i].host, s->bind_host) == 0) {
                memcpy(one->ifname, all[i].ifname, sizeof one->ifname);
                break;
            }
        free(all);
    }
    *out = one;
    *n = 1;
    return 0;
}

void hvd_server_get_stats(hvd_server *s, hvd_server_stats *o) {
    o->accepted = atomic_load(&s->st.accepted);
    o->refused = atomic_load(&s->st.refused);
    o->handshake_failed = atomic_load(&s->st.handshake_failed);
    o->frames_rejected = atomic_load(&s->st.frames_rejected);
    o->malformed = atomic_load(&s->st.malformed);
    o->unknown_type = atomic_load(&s->st.unknown_type);
    o->requests = atomic_load(&s->st.requests);
    o->timeouts = atomic_load(&s->st.timeouts);
    o->open_conns = atomic_load(&s->st.open_conns);
    o->output_queued = atomic_load(&s->st.output_queued);
}

/* ---- Calls ------------------------------------------------------------------------------- */

uint32_t hvd_call_type(const hvd_call *c) {
    return c->type;
}

const char *hvd_call_peer_host(const hvd_call *c) {
    return c->c ? c->c->peer : "";
}

int hvd_call_close_error(const hvd_call *c) {
    return c->close_err;
}

hvd_server *hvd_call_server(const hvd_call *c) {
    return c->srv;
}

static void call_done(hvd_call *call) {
    call->answered = true;
    call->cancel_fn = NULL;
    call->writable_fn = NULL;
    if (!call->in_handler) call_release(call);
}

int hvd_call_reply(hvd_call *call, const hvd_msg_desc *desc, const void *msg) {
    if (call->answered) return -1;
    int rc = 0;
    /* A failed send closes the connection, which frees the calls it cancels: keep this one
     * alive through the send as if its handler were running. */
    bool was = call->in_handler;
    call->in_handler = true;
    if (call->c) {
        rc = conn_send(call->c, HVD_KIND_REPLY, desc->type, call->id, desc, msg);
        if (rc == -2) {
            send_error(call->c, call->id, HVD_E_INTERNAL, "reply could not be encoded");
            rc = -1;
        } else {
            rc = 0;
        }
    }
    call->in_handler = was;
    call_done(call);
    return rc;
}

void hvd_call_fail(hvd_call *call, int code, const char *fmt, ...) {
    if (call->answered) return;
    if (code == HVD_E_PROTOCOL) COUNT(call->srv, malformed);
    bool was = call->in_handler;
    call->in_handler = true; /* see hvd_call_reply */
    if (call->c) {
        char msg[HVD_ERR_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        send_error(call->c, call->id, code, msg);
    }
    call->in_handler = was;
    call_done(call);
}

void hvd_call_on_cancel(hvd_call *call, hvd_call_fn fn, void *arg) {
    call->cancel_fn = fn;
    call->cancel_arg = arg;
}

int hvd_call_stream(hvd_call *call, uint32_t channel, const void *data, size_t len) {
    if (!call->c || call->answered) return -1;
    hvd_chunk ch = {.channel = channel, .data = {(uint8_t *)data, len}};
    return conn_send(call->c, HVD_KIND_STREAM, 0, call->id, &hvd_chunk_desc, &ch) == 0 ? 0 : -1;
}

size_t hvd_call_stream_room(const hvd_call *call) {
    if (!call->c) return 0;
    size_t pending = hvd_buf_pending(&call->c->out);
    size_t max = call->srv->cfg.max_output;
    return pending >= max ? 0 : max - pending;
}

void hvd_call_on_writable(hvd_call *call, hvd_call_fn fn, void *arg) {
    call->writable_fn = fn;
    call->writable_arg = arg;
    /* Arm EPOLLOUT even if nothing is pending, so the callback runs on the next loop pass. */
    if (call->c) update_interest(call->c);
}
