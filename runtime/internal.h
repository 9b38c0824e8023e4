/* Private interfaces between the files of the collective runtime.
 *
 * engine.c          public API, handles, the background loop (one cycle = drain queue,
 *                   negotiate, fuse, execute, complete)
 * controller.c      negotiation over MPI: the cache bit vector, gathering requests at the
 *                   coordinator (rank 0), matching them, broadcasting the response list
 * response_cache.c  name -> agreed parameters, with slots numbered identically on all ranks
 * message.c         the byte encoding of requests and responses sent over MPI
 * fusion.c          grouping of ready allreduces and the host fusion buffer
 * ops_mpi.c         collectives on host buffers with MPI
 * ops_nccl.c        collectives on device buffers with NCCL (only when HVD_HAVE_NCCL)
 * timeline.c        Chrome-trace JSON writer (HOROVOD_TIMELINE)
 * stall.c           stall inspector: names the ranks that have not submitted a tensor
 * types.c           element types, f16/bf16 conversion, host reduction and scaling kernels
 * strmap.c          string-keyed hash map used by the above
 *
 * Threading: everything below runs on the background thread, except the few engine.c
 * functions that user threads call under the engine mutex. */
#ifndef HVD_RUNTIME_INTERNAL_H
#define HVD_RUNTIME_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hvd/runtime.h"

/* ---- small helpers (engine.c) -------------------------------------------------------- */

/* Sets err (may be NULL) and returns -1, like hvd_err_set, without linking libhvd_rpc. */
int rt_err(hvd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Monotonic nanoseconds. */
int64_t rt_now_ns(void);
/* Prints one line "[hvd rank N] ..." to stderr. */
void rt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* malloc/realloc/strdup that never return NULL for a non-zero size: the runtime cannot
 * recover from running out of memory in the middle of a collective agreed with other ranks,
 * so it reports it and aborts (the only place the library ends the process). */
void *rt_xmalloc(size_t n);
void *rt_xcalloc(size_t n, size_t size);
void *rt_xrealloc(void *p, size_t n);
char *rt_xstrdup(const char *s);

/* ---- types.c ------------------------------------------------------------------------- */

bool rt_dtype_valid(int dtype);
bool rt_dtype_is_float(hvd_dtype t);
size_t rt_dtype_size(hvd_dtype t);
/* inout[i] = inout[i] op in[i] for SUM, MIN, MAX, PRODUCT (AVERAGE reduces as SUM). */
void rt_reduce(void *inout, const void *in, int64_t n, hvd_dtype t, hvd_reduce_op op);
/* buf[i] *= factor (integers: computed in double, truncated toward zero, saturated). */
void rt_scale(void *buf, int64_t n, hvd_dtype t, double factor);
/* buf[i] /= divisor for integer types (truncating), used by AVERAGE. */
void rt_int_divide(void *buf, int64_t n, hvd_dtype t, int64_t divisor);
/* Applies what follows an AVERAGE/SUM reduction with scaling on host data: division by size
 * (AVERAGE) and postscale. */
void rt_finish_reduction(void *buf, int64_t n, hvd_dtype t, hvd_reduce_op op, int size,
                         double postscale);

/* ---- strmap.c ------------------------------------------------------------------------ */

/* Open-addressing map from NUL-terminated strings to pointers. Keys are copied. */
typedef struct rt_strmap {
    struct rt_strmap_slot *slots; /* capacity entries; key NULL = empty */
    size_t capacity;              /* power of two, or 0 before the first insert */
    size_t count;                 /* live entries */
} rt_strmap;

void rt_strmap_init(rt_strmap *m);
void rt_strmap_free(rt_strmap *m);
/* The value stored under key, or NULL. */
void *rt_strmap_get(const rt_strmap *m, const char *key);
/* Inserts or replaces. */
void rt_strmap_put(rt_strmap *m, const char *key, void *value);
/* Removes key; returns its value or NULL if absent. */
void *rt_strmap_del(rt_strmap *m, const char *key);
/* Iteration: returns the next live slot index >= *pos and advances *pos, or -1 at the end. */
long rt_strmap_next(const rt_strmap *m, size_t *pos, const char **key, void **value);

/* ---- what is negotiated -------------------------------------------------------------- */

typedef enum rt_optype {
    RT_ALLREDUCE = 0,
    RT_ALLGATHER = 1,
    RT_BROADCAST = 2,
    RT_ALLTOALL = 3,
    RT_REDUCESCATTER = 4,
    RT_BARRIER = 5,
    RT_NUM_OPTYPES = 6
} rt_optype;

const char *rt_optype_name(int optype);       /* "allreduce" */
const char *rt_optype_upper_name(int optype); /* "ALLREDUCE", for the timeline */

/* Everything about one named collective that every rank must agree on. */
typedef struct rt_params {
    uint8_t optype;    /* rt_optype */
    uint8_t dtype;     /* hvd_dtype */
    uint8_t op;        /* hvd_reduce_op (allreduce, reducescatter), else 0 */
    uint8_t on_device; /* 1 for CUDA buffers (the ordinal itself may differ per rank) */
    int32_t root;      /* broadcast root, else 0 */
    int64_t count;     /* elements (allreduce, broadcast, reducescatter), else 0 */
    int64_t row_elems; /* elements per row (allgather, alltoall, reducescatter), else 1 */
    double prescale;   /* allreduce scaling, else 1 */
    double postscale;
} rt_params;

bool rt_params_equal(const rt_params *a, const rt_params *b);

/* A rank's request for one name, as sent to the coordinator. */
typedef struct rt_request {
    const char *name; /* borrowed (from the entry, or from the decoded message) */
    rt_params p;
} rt_request;

/* One agreed collective for one name, or an error for that name. */
typedef struct rt_response {
    char *name;  /* owned */
    rt_params p; /* agreed parameters (unused for errors) */
    char *error; /* owned; non-NULL makes this an error response */
    int code;    /* hvd_status of the error */
} rt_response;

typedef struct rt_response_list {
    rt_response *v;
    size_t n, cap;
} rt_response_list;

void rt_responses_push(rt_response_list *l, const char *name, const rt_params *p, const char *error,
                       int code);
void rt_responses_clear(rt_response_list *l);
void rt_responses_free(rt_response_list *l);

/* ---- message.c: byte encoding (docs/runtime.md "Negotiation messages") --------------- */

typedef struct rt_buf {
    uint8_t *data;
    size_t len, cap;
} rt_buf;

void rt_buf_free(rt_buf *b);
/* Encodes one rank's cycle message: flags and requests. */
void rt_encode_requests(rt_buf *b, uint32_t flags, const rt_request *reqs, size_t n);
/* Decodes it; request names point into data. Returns 0, or -1 on malformed input. reqs is
 * malloc'd (free it). */
int rt_decode_requests(const uint8_t *data, size_t len, uint32_t *flags, rt_request **reqs,
                       size_t *n, hvd_err *err);
void rt_encode_responses(rt_buf *b, const rt_response_list *l);
/* Appends the decoded responses to l. Returns 0, or -1 on malformed input. */
int rt_decode_responses(const uint8_t *data, size_t len, rt_response_list *l, hvd_err *err);

/* ---- response_cache.c ---------------------------------------------------------------- */

/* Slot-numbered cache of agreed single-tensor parameters. Every change is driven by the
 * globally agreed response order, so slot numbers (and so the bit vector) match on all
 * ranks. LRU eviction. */
typedef struct rt_cache {
    int capacity;
    struct rt_cache_slot *slots;
    rt_strmap by_name; /* name -> slot index + 1 (as intptr_t) */
    int lru_head;      /* most recently used, -1 if empty */
    int lru_tail;      /* least recently used */
    int free_head;     /* free slot list */
} rt_cache;

void rt_cache_init(rt_cache *c, int capacity);
void rt_cache_free(rt_cache *c);
/* Slot of name, or -1. */
int rt_cache_lookup(const rt_cache *c, const char *name);
const rt_params *rt_cache_params(const rt_cache *c, int slot);
const char *rt_cache_name(const rt_cache *c, int slot);
/* Marks slot as most recently used. */
void rt_cache_touch(rt_cache *c, int slot);
/* Inserts (or refreshes) name; returns its slot. If the least recently used slot had to be
 * evicted to make room, *evicted_user is that slot's user pointer (else NULL). Capacity 0:
 * returns -1 and does nothing. */
int rt_cache_put(rt_cache *c, const char *name, const rt_params *p, void **evicted_user);
void rt_cache_erase(rt_cache *c, int slot);
/* Opaque per-slot pointer for the engine (its pending entry waiting on that slot). */
void rt_cache_set_user(rt_cache *c, int slot, void *user);
void *rt_cache_user(const rt_cache *c, int slot);

/* ---- timeline.c ---------------------------------------------------------------------- */

typedef struct rt_timeline rt_timeline;

/* Opens path for writing a Chrome-trace JSON array. Returns NULL with err on failure. */
rt_timeline *rt_timeline_open(const char *path, hvd_err *err);
/* Writes the closing bracket and closes the file. NULL is fine. */
void rt_timeline_close(rt_timeline *tl);
/* Negotiation of a tensor: starts once (later calls are ignored while it is open). */
void rt_timeline_negotiate_start(rt_timeline *tl, const char *name, int optype);
/* A rank's request arrived at the coordinator (instant event named after the rank). */
void rt_timeline_negotiate_rank(rt_timeline *tl, const char *name, int rank);
void rt_timeline_negotiate_end(rt_timeline *tl, const char *name);
/* Nested activity spans on the tensor's row ("ALLREDUCE", "QUEUE", "MPI_ALLREDUCE", ...). */
void rt_timeline_start(rt_timeline *tl, const char *name, const char *activity);
void rt_timeline_end(rt_timeline *tl, const char *name);
/* An instant event on the tensor's row (e.g. an error). */
void rt_timeline_mark(rt_timeline *tl, const char *name, const char *what);
/* Flushes buffered events to the file. */
void rt_timeline_flush(rt_timeline *tl);

/* ---- stall.c ------------------------------------------------------------------------- */

/* What the coordinator knows about a name it has requests for. */
typedef struct rt_table_entry {
    char *name;
    rt_params *params; /* size entries, valid where present[r] */
    uint8_t *present;  /* size entries */
    int nranks;        /* ranks present */
    int64_t first_ns;  /* when the first request arrived */
} rt_table_entry;

typedef struct rt_stall {
    int64_t warn_ns;     /* report names waiting longer than this; 0 = never */
    int64_t shutdown_ns; /* fail names waiting longer than this; 0 = never */
    int64_t last_check_ns;
    int64_t last_warn_ns;
    uint64_t warnings; /* reports printed */
} rt_stall;

/* Checks the coordinator's table (name -> rt_table_entry*) at most once per warn period and
 * prints which ranks are missing which tensors. Names older than shutdown_ns are appended to
 * *expired (malloc'd array of borrowed entry pointers) for the caller to fail. */
void rt_stall_check(rt_stall *st, const rt_strmap *table, int size, int64_t now,
                    rt_table_entry ***expired, size_t *nexpired);

/* ---- controller.c -------------------------------------------------------------------- */

/* Flags carried in the bit vector and the request message. */
enum {
    RT_FLAG_SHUTDOWN = 1u << 0,  /* this rank called hvd_shutdown */
    RT_FLAG_UNCACHED = 1u << 1,  /* this rank has requests the coordinator has not seen */
    RT_FLAG_COORD_WORK = 1u << 2 /* the coordinator has responses to send (stall errors) */
};

typedef struct rt_controller {
    MPI_Comm comm;
    int rank, size;
    rt_timeline *tl; /* rank 0 only, may be NULL */
    rt_stall stall;
    /* coordinator state (rank 0) */
    rt_strmap table;          /* name -> rt_table_entry* */
    rt_response_list backlog; /* stall errors waiting for the next full negotiation */
    /* scratch */
    uint64_t *bits;
    size_t nbits_words;
    rt_buf sendbuf;
    uint8_t *recvbuf;
    size_t recvcap;
} rt_controller;

void rt_controller_init(rt_controller *c, MPI_Comm comm, int rank, int size, rt_timeline *tl);
void rt_controller_free(rt_controller *c);

/* Result of the bit-vector agreement. Vectors have `words` 64-bit words. */
typedef struct rt_bits_result {
    uint32_t flags_or;       /* RT_FLAG_* set on any rank */
    const uint64_t *and_hit; /* cache slots pending (and matching) on every rank */
    const uint64_t *or_hit;  /* ... on at least one rank */
    const uint64_t *or_bad;  /* slots some rank asks to invalidate */
    size_t words;
} rt_bits_result;

/* One allreduce(BAND) over [~flags, hit, ~hit, ~bad]. hit/bad have `words` words each.
 * Returns 0, or -1 on an MPI error. */
int rt_controller_sync_bits(rt_controller *c, uint32_t flags, const uint64_t *hit,
                            const uint64_t *bad, size_t words, rt_bits_result *out, hvd_err *err);

/* Full negotiation: gathers every rank's new requests at the coordinator, which matches them
 * by name, checks that all ranks agree, and broadcasts the responses for names now ready on
 * every rank (in one order) plus error responses. On shutdown (flag set on any rank, given
 * as any_shutdown) every name left pending fails. Appends to out. Returns 0 or -1. */
int rt_controller_negotiate(rt_controller *c, uint32_t my_flags, const rt_request *reqs, size_t n,
                            rt_response_list *out, hvd_err *err);

/* Coordinator housekeeping every cycle: the stall inspector, which may queue error responses
 * for names that waited past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS. No-op on other ranks. */
void rt_controller_tick(rt_controller *c, int64_t now);

/* True on the coordinator if it holds responses for the next full negotiation. */
bool rt_controller_has_backlog(const rt_controller *c);

/* Waits for an MPI request without hogging the core: tests, yields, then sleeps briefly. */
int rt_mpi_wait(MPI_Request *req);

/* ---- the engine's view of one submitted tensor -------------------------------------- */

enum rt_entry_state {
    RT_E_NEW = 0, /* just drained from the queue */
    RT_E_CACHED,  /* waiting on a response cache slot (bit vector) */
    RT_E_UNSENT,  /* must be sent to the coordinator in the next full negotiation */
    RT_E_SENT,    /* the coordinator has it */
};

typedef struct rt_entry {
    char *name;
    rt_params p;
    const void *in;     /* send buffer */
    void *out;          /* receive buffer (allreduce, reducescatter), buf (broadcast) */
    int device;         /* HVD_DEVICE_CPU or CUDA ordinal */
    int64_t rows;       /* allgather/alltoall: this rank's first dim */
    int64_t *splits;    /* alltoall: rows sent to each rank (size entries, owned) */
    hvd_output *result; /* allgather/alltoall */
    int64_t handle;
    int state;                /* rt_entry_state */
    int cache_slot;           /* when RT_E_CACHED */
    int64_t partial_since_ns; /* first cycle its cache slot was pending on only some ranks */
    struct rt_entry *next;    /* submission queue link */
    /* result */
    int status; /* 0 ok, else hvd_status */
    char *error;
} rt_entry;

/* Queues e (with its parameters and buffers filled in) under name, or a generated
 * "<op>.noname.<n>" when name is NULL. Returns 0 with *handle set, or -1 (e is freed). */
int rt_submit(rt_entry *e, const char *name, hvd_handle *handle, hvd_err *err);
void rt_entry_free(rt_entry *e);
/* hvd_size() while running, else -1. */
int rt_current_size(void);

/* A unit of execution: one collective call for one or more (fused) entries. */
typedef struct rt_group {
    rt_params p; /* agreed parameters (count is per entry; see counts) */
    rt_entry **entries;
    size_t n, cap;
    int64_t total_elems; /* sum of the entries' counts (allreduce) */
} rt_group;

/* ---- fusion.c ------------------------------------------------------------------------ */

typedef struct rt_group_list {
    rt_group *v;
    size_t n, cap;
} rt_group_list;

/* Turns an agreed list of entries (same order on all ranks) into execution groups: ready
 * allreduces with the same type, op, scaling and device kind are packed together up to
 * threshold bytes; everything else runs alone. Deterministic, so all ranks form the same
 * groups. */
void rt_fusion_plan(rt_entry **entries, size_t n, int64_t threshold, rt_group_list *out);
void rt_group_list_free(rt_group_list *l);

/* A growable, 64-byte aligned host buffer. */
typedef struct rt_fusion_buffer {
    void *data;
    size_t cap;
} rt_fusion_buffer;

/* Returns a buffer of at least n bytes (reallocating as needed), or NULL if out of memory. */
void *rt_fusion_buffer_get(rt_fusion_buffer *fb, size_t n);
void rt_fusion_buffer_free(rt_fusion_buffer *fb);

/* ---- ops ----------------------------------------------------------------------------- */

/* What an op needs from the engine. */
typedef struct rt_exec {
    MPI_Comm comm;
    int rank, size;
    rt_timeline *tl;
    rt_fusion_buffer *fusion;
    struct rt_mpi_types *mpi;
    struct rt_nccl *nccl; /* NULL without NCCL */
} rt_exec;

typedef struct rt_mpi_types rt_mpi_types;

/* Creates the MPI datatypes and ops for f16/bf16. Returns NULL with err on failure. */
rt_mpi_types *rt_mpi_types_create(hvd_err *err);
void rt_mpi_types_free(rt_mpi_types *t);

/* Runs one group on host buffers. Returns 0, or -1 with err (every entry of the group fails
 * with it). */
int rt_mpi_execute(rt_exec *x, rt_group *g, hvd_err *err);

#ifdef HVD_HAVE_NCCL
typedef struct rt_nccl rt_nccl;
rt_nccl *rt_nccl_create(void);
void rt_nccl_free(rt_nccl *n);
/* Runs one group on device buffers (communicator created on first use, its id broadcast
 * over x->comm). Returns 0, or -1 with err. */
int rt_nccl_execute(rt_exec *x, rt_group *g, hvd_err *err);
/* NULL if the CUDA runtime and NCCL could be loaded, else why not. */
const char *rt_cuda_unavailable(void);
/* Number of CUDA devices, or 0 if CUDA is unusable. */
int rt_cuda_device_count(void);
/* cudaFree. */
void rt_cuda_free(void *p);
#endif

#endif
