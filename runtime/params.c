/* Negotiated parameters, requests and responses (params.h). */
#include "params.h"

#include <stdlib.h>
#include <string.h>

static const char *const optype_names[RT_NUM_OPTYPES] = {
    "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join"};
static const char *const optype_upper[RT_NUM_OPTYPES] = {
    "ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"};

const char *rt_optype_name(int optype) {
    return optype >= 0 && optype < RT_NUM_OPTYPES ? optype_names[optype] : "?";
}

const char *rt_optype_upper_name(int optype) {
    return optype >= 0 && optype < RT_NUM_OPTYPES ? optype_upper[optype] : "?";
}

bool rt_params_equal(const rt_params *a, const rt_params *b) {
    return a->optype == b->optype && a->dtype == b->dtype && a->op == b->op &&
           a->on_device == b->on_device && a->root == b->root && a->count == b->count &&
           a->row_elems == b->row_elems && a->prescale == b->prescale &&
           a->postscale == b->postscale;
}

int rt_responses_push(rt_response_list *l, const char *name, const rt_params *p, const char *error,
                      int code) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        rt_response *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    rt_response x = {.name = strdup(name), .error = error ? strdup(error) : NULL};
    if (!x.name || (error && !x.error)) {
        free(x.name);
        free(x.error);
        return -1;
    }
    if (p) x.p = *p;
    x.code = error ? code : 0;
    l->v[l->n++] = x;
    return 0;
}

void rt_responses_clear(rt_response_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].error);
    }
    l->n = 0;
}

void rt_responses_free(rt_response_list *l) {
    rt_responses_clear(l);
    free(l->v);
    l->v = NULL;
    l->cap = 0;
}
