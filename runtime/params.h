/* What the ranks negotiate about: the collective types, the parameters every rank must agree
 * on for one named collective, and the requests and responses that carry them. */
#ifndef HVD_RUNTIME_PARAMS_H
#define HVD_RUNTIME_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum rt_optype {
    RT_ALLREDUCE = 0,
    RT_ALLGATHER = 1,
    RT_BROADCAST = 2,
    RT_ALLTOALL = 3,
    RT_REDUCESCATTER = 4,
    RT_BARRIER = 5,
    RT_JOIN = 6, /* hvd_join: root is 1 in a request from a rank that gave a CUDA device, and
                    the last rank to join in the response */
    RT_NUM_OPTYPES = 7
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

/* Appends a response (copying name and error; p may be NULL for errors). Returns 0, or -1 on
 * out of memory (the list is unchanged). */
int rt_responses_push(rt_response_list *l, const char *name, const rt_params *p, const char *error,
                      int code);
void rt_responses_clear(rt_response_list *l);
void rt_responses_free(rt_response_list *l);

#endif
