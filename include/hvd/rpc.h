/* Authenticated RPC: an event-driven server and a blocking client.
 *
 * Wire format, handshake and sealing are specified in docs/protocol.md; the threat model is
 * docs/security.md. In short: every connection starts with a mutual HMAC-SHA256 challenge-
 * response over the job secret bound to the target service's name and both nonces, then every
 * frame is sealed with AES-256-GCM under per-direction keys (HKDF) and counter nonces.
 *
 * Server model: each server runs on an event loop of its own (common/loop.h), whose one
 * thread runs everything: accepting, handshakes, decoding, handlers, and whatever else the
 * service puts on the loop (timers, watched descriptors). Handlers run on the loop thread and
 * must not block. A handler answers its call at once, or keeps it and answers later (a
 * long-poll that holds no thread). Code on other threads reaches the loop by posting to it.
 *
 * Client model: one blocking connection per hvd_client, one call at a time, with a timeout on
 * every operation. Not thread-safe: use one client per thread. */
#ifndef HVD_RPC_H
#define HVD_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/error.h"
#include "hvd/message.h"
#include "hvd/net.h"

/* Protocol version carried in the handshake and in every message envelope. */
#define HVD_PROTOCOL_VERSION 1
/* Default largest frame payload (plaintext) accepted: 64 MiB. */
#define HVD_DEFAULT_MAX_FRAME (64u * 1024u * 1024u)
/* Largest max_frame that can be configured (the length field is 31-bit). */
#define HVD_MAX_FRAME_LIMIT (0x7fffffffu - 32u)
/* Longest service name. */
#define HVD_SERVICE_NAME_LEN_MAX 255

/* Message types 1..99 belong to the RPC layer itself. */
enum {
    HVD_MSG_PING = 1, /* request: no fields; reply: hvd_pong */
    HVD_MSG_PONG = 2,
    HVD_MSG_ACK = 3,  /* generic empty reply */
    HVD_MSG_ERROR = 4 /* error reply body: hvd_error_body */
};

/* Reply to PING: lets a client check it reached the service it meant to, and learn the
 * address the server saw it coming from (used to match interfaces). */
typedef struct hvd_pong {
    char *service;    /* the server's service name */
    char *peer_host;  /* the client's address as the server saw it */
    uint32_t version; /* HVD_PROTOCOL_VERSION of the server */
} hvd_pong;

typedef struct hvd_error_body {
    uint32_t code; /* hvd_status */
    char *message; /* one sentence */
} hvd_error_body;

extern const hvd_msg_desc hvd_ping_desc;
extern const hvd_msg_desc hvd_pong_desc;
extern const hvd_msg_desc hvd_ack_desc;
extern const hvd_msg_desc hvd_error_desc;

/* ---- Server --------------------------------------------------------------------------- */

typedef struct hvd_server hvd_server;
/* One received request. It is answered exactly once (reply or fail), or cancelled when its
 * connection goes away first. Only touched on the loop thread. */
typedef struct hvd_call hvd_call;

/* Handles a request of a registered type. body is the undecoded message body, valid only
 * while the handler runs; decode it with hvd_msg_unpack. The handler must answer the call now
 * or keep it (with hvd_call_on_cancel) and answer later. */
typedef void (*hvd_handler_fn)(hvd_call *call, const msgpack_object *body, void *user);

/* Loop-thread callback for a call's cancellation and writability. */
typedef void (*hvd_call_fn)(void *arg);

/* A server's default handshake time limit: a client whose connection closes this late into the
 * handshake was cut off by it (an overloaded machine), not refused for a wrong secret. */
#define HVD_HANDSHAKE_TIMEOUT_DEFAULT_MS 5000

/* Handshakes one source address may have under way at once (hvd_server_config): above the
 * 1024 task services one machine starts in the scale tests, a sixteenth of the default
 * connection limit. */
#define HVD_HANDSHAKES_PER_SOURCE_DEFAULT 1024

typedef struct hvd_server_config {
    const char *name;         /* service name bound into the handshake: "driver", "task 3" */
    hvd_secret secret;        /* the job secret */
    const char *bind_host;    /* where to listen (hvd_bind_resolve: a numeric address or an
                                 interface name); NULL: all interfaces */
    uint16_t port;            /* 0: an ephemeral port */
    size_t max_frame;         /* largest frame payload accepted; 0: HVD_DEFAULT_MAX_FRAME */
    int handshake_timeout_ms; /* time allowed for a peer to finish the handshake; 0:
                                 HVD_HANDSHAKE_TIMEOUT_DEFAULT_MS */
    int idle_timeout_ms;      /* a connection with no call pending and nothing to send is
                                 closed after this long without a frame; 0: 60000 */
    int net_timeout_ms;       /* a peer that takes none of its pending output for this long is
                                   dropped; also the TCP_USER_TIMEOUT of its connections, whose
                                   keepalive probes start after a third of it without traffic
                                   (so a silent dead peer goes in about this long); 0: 30000 */
    size_t max_conns;         /* connections beyond this are refused; 0: 16384 */
    size_t max_handshakes_per_source; /* a connection from an address that already has this
                                         many handshakes under way is refused; 0:
                                         HVD_HANDSHAKES_PER_SOURCE_DEFAULT */
    size_t max_output; /* per-connection output bound: streams wait for room below it,
                          and a connection over it is not read until its output drops
                          below half; 0: 4 MiB (one reply may exceed it) */
} hvd_server_config;

typedef struct hvd_server_stats {
    uint64_t accepted;         /* connections accepted */
    uint64_t refused;          /* connections refused (over max_conns or
                                  max_handshakes_per_source) */
    uint64_t handshake_failed; /* handshakes that failed (wrong secret, wrong name, garbage) */
    uint64_t frames_rejected;  /* frames that failed to open (tampered, replayed, too long) */
    uint64_t malformed;        /* frames whose message could not be decoded */
    uint64_t unknown_type;     /* requests of a type with no handler */
    uint64_t requests;         /* requests dispatched to handlers */
    uint64_t timeouts;         /* connections closed by the idle, handshake or write timeout */
    uint64_t open_conns;       /* connections open now */
    uint64_t output_queued;    /* bytes waiting in connection output buffers now */
} hvd_server_stats;

/* Creates a server and binds its listening socket (not yet serving). Returns NULL with err.
 * The config's strings are copied. */
hvd_server *hvd_server_create(const hvd_server_config *cfg, hvd_err *err);

/* Registers the handler for a request type (before hvd_server_start). Types below 100 belong to
 * the RPC layer. Returns 0, or -1 if the type is below 100 or taken. */
int hvd_server_handle(hvd_server *s, uint32_t type, hvd_handler_fn fn, void *user);

/* Starts the loop thread. Returns 0, or -1 with err. */
int hvd_server_start(hvd_server *s, hvd_err *err);

/* Stops serving: stops the loop thread after its current batch (work posted to the loop before
 * runs on the calling thread), stops accepting, gives pending output up to one second to
 * drain, cancels held calls (their cancel callbacks run on the calling thread) and closes
 * every connection. Idle or half-open connections never
 * delay it. Safe to call twice. Must not be called from the loop thread. */
void hvd_server_stop(hvd_server *s);

/* Stops if needed and frees everything. */
void hvd_server_destroy(hvd_server *s);

/* The port the server listens on. */
uint16_t hvd_server_port(const hvd_server *s);

/* The service name. */
const char *hvd_server_name(const hvd_server *s);

/* Lists the addresses this server can be reached at: every local interface address (see
 * hvd_local_addrs) with the server's port, filtered by `only` as for hvd_local_addrs; or, if
 * bind_host was given, just that address (named after its interface, `only` ignored).
 * Returns 0 with a malloc'd array, or -1 with err. */
int hvd_server_addrs(const hvd_server *s, const char *const *only, hvd_addr **out, size_t *n,
                     hvd_err *err);

/* Copies the counters (any thread). */
void hvd_server_get_stats(hvd_server *s, hvd_server_stats *out);

/* The event loop the server runs on (common/loop.h): services put their timers, watched
 * descriptors and cross-thread posts there. Valid until hvd_server_destroy. */
struct hvd_loop *hvd_server_loop(hvd_server *s);

/* ---- Calls (loop thread only) ---- */

uint32_t hvd_call_type(const hvd_call *c);
/* The peer's address as seen by this server (numeric host). */
const char *hvd_call_peer_host(const hvd_call *c);
/* In a cancel callback: the errno that broke the call's connection (ETIMEDOUT: the peer
 * stopped answering, TCP keepalive or TCP_USER_TIMEOUT, or took no output for
 * net_timeout_ms), 0 for an orderly close, a server stop or while the connection is up. */
int hvd_call_close_error(const hvd_call *c);
hvd_server *hvd_call_server(const hvd_call *c);

/* Answers the call with a message of type desc->type and frees the call. If its connection
 * already went away the answer is dropped. Returns 0, or -1 if encoding failed (the call is
 * then failed with HVD_E_INTERNAL). */
int hvd_call_reply(hvd_call *c, const hvd_msg_desc *desc, const void *msg);

/* Answers the call with an error reply (code, formatted sentence) and frees the call. */
void hvd_call_fail(hvd_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For held calls: fn(arg) runs if the connection goes away (or the server stops) before the
 * call is answered; the call is freed right after fn returns and must not be used again. */
void hvd_call_on_cancel(hvd_call *c, hvd_call_fn fn, void *arg);

/* Streams: before its final answer a call may push any number of stream chunks to the client.
 * channel is a small number chosen by the service (1 stdout, 2 stderr, ...). Returns 0, or -1
 * if the connection is gone. Chunks are never dropped: check hvd_call_stream_room first. */
int hvd_call_stream(hvd_call *c, uint32_t channel, const void *data, size_t len);

/* Bytes that may still be queued on the call's connection before it reaches max_output;
 * 0 means wait for hvd_call_on_writable. */
size_t hvd_call_stream_room(const hvd_call *c);

/* fn(arg) runs once when the connection's output drops below half of max_output. */
void hvd_call_on_writable(hvd_call *c, hvd_call_fn fn, void *arg);

/* ---- Client --------------------------------------------------------------------------- */

typedef struct hvd_client hvd_client;

typedef struct hvd_client_config {
    const char *service; /* the service name to expect ("driver", "task 3") */
    hvd_secret secret;
    const hvd_addr *addrs; /* every address of the service; probed in parallel */
    size_t naddrs;
    int probe_timeout_ms; /* connect + handshake budget per probe round; 0: 3000 */
    int io_timeout_ms;    /* default per-call timeout; 0: 30000 */
    size_t max_frame;     /* 0: HVD_DEFAULT_MAX_FRAME */
    int stagger_ms;       /* > 0: start the next address only when the started ones failed,
                             none connected within this long, or none finished the
                             handshake within ten times as long (0: all at once) */
} hvd_client_config;

/* Connects: starts TCP connects to all addresses at once (or one after the other, stagger_ms
 * apart, as long as none has connected), runs the handshake on the first that connects, and
 * falls back to the next on failure. Returns NULL with err: code
 * HVD_E_AUTH when a service answered but the handshake failed (wrong secret or wrong
 * service), HVD_E_TIMEOUT or HVD_E_IO otherwise; the message lists what each address did. */
hvd_client *hvd_client_connect(const hvd_client_config *cfg, hvd_err *err);

void hvd_client_close(hvd_client *c);

/* Changes the largest reply frame c accepts from now on (0: HVD_DEFAULT_MAX_FRAME; at most
 * HVD_MAX_FRAME_LIMIT), e.g. for one call known to answer with a large message. */
void hvd_client_set_max_frame(hvd_client *c, size_t max_frame);

/* The address the client is connected to. */
const hvd_addr *hvd_client_addr(const hvd_client *c);

/* Call flags. */
#define HVD_CALL_RETRY                                                                             \
    1u /* idempotent: on a broken connection reconnect (next address                               \
          first) and send again, once */

/* Sends a request and waits for its reply. timeout_ms: 0 uses io_timeout_ms, -1 waits
 * without limit (long-polls; TCP keepalive still detects a dead peer). resp_desc->type must
 * match the reply's type. Returns 0 with resp filled (free with hvd_msg_free), or -1 with
 * err; an error reply from the service gives its code and message. */
int hvd_client_call(hvd_client *c, const hvd_msg_desc *req_desc, const void *req,
                    const hvd_msg_desc *resp_desc, void *resp, int timeout_ms, unsigned flags,
                    hvd_err *err);

/* Receives stream chunks of a streaming call. Return non-zero to abandon the call. */
typedef int (*hvd_chunk_fn)(uint32_t channel, const uint8_t *data, size_t len, void *user);

/* Like hvd_client_call for a request answered with stream chunks and then one final reply.
 * While waiting, if interrupt_fd >= 0 becomes readable, on_interrupt(user) runs once (it may
 * use hvd_client_send on this client, e.g. to ask the service to abort) and waiting goes on.
 * The timeout applies to silence between frames, not to the whole stream. */
int hvd_client_call_stream(hvd_client *c, const hvd_msg_desc *req_desc, const void *req,
                           hvd_chunk_fn on_chunk, void *user, int interrupt_fd,
                           void (*on_interrupt)(hvd_client *c, void *user),
                           const hvd_msg_desc *resp_desc, void *resp, int timeout_ms, hvd_err *err);

/* Sends a request whose reply will be ignored (for use inside on_interrupt). */
int hvd_client_send(hvd_client *c, const hvd_msg_desc *req_desc, const void *req, hvd_err *err);

/* Pings the service (reconnecting if the connection was lost); returns 0 and the pong (free
 * with hvd_msg_free), or -1 with err. */
int hvd_client_ping(hvd_client *c, hvd_pong *pong, hvd_err *err);

#endif
