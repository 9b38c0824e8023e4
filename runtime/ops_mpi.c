/* Collectives on host buffers with MPI, on the runtime's own communicator. Every function
 * here is entered by all ranks for the same group in the same order (the engine guarantees
 * it), and every decision that could make one rank skip a call is taken from agreed data
 * only, so a rank never waits in a collective the others do not enter. */
#include "internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct rt_mpi_types {
    MPI_Datatype f16, bf16;              /* 2-byte types: MPI has no 16-bit floats */
    MPI_Op half_ops[HVD_NUM_REDUCE_OPS]; /* reductions for them */
};

/* MPI user functions get no context pointer, so they tell f16 from bf16 by comparing the
 * datatype with these (written once at init, before any reduction). */
static MPI_Datatype s_f16 = MPI_DATATYPE_NULL, s_bf16 = MPI_DATATYPE_NULL;

#define HALF_OP(fn, op)                                                                            \
    static void fn(void *in, void *inout, int *len, MPI_Datatype *dt) {                            \
        rt_reduce(inout, in, *len, *dt == s_bf16 ? HVD_BFLOAT16 : HVD_FLOAT16, op);                \
    }
HALF_OP(half_sum, HVD_OP_SUM)
HALF_OP(half_min, HVD_OP_MIN)
HALF_OP(half_max, HVD_OP_MAX)
HALF_OP(half_prod, HVD_OP_PRODUCT)

rt_mpi_types *rt_mpi_types_create(hvd_err *err) {
    rt_mpi_types *t = rt_xcalloc(1, sizeof *t);
    if (MPI_Type_contiguous(2, MPI_BYTE, &t->f16) != MPI_SUCCESS ||
        MPI_Type_commit(&t->f16) != MPI_SUCCESS ||
        MPI_Type_contiguous(2, MPI_BYTE, &t->bf16) != MPI_SUCCESS ||
        MPI_Type_commit(&t->bf16) != MPI_SUCCESS) {
        free(t);
        rt_err(err, HVD_E_INTERNAL, "cannot create the MPI datatypes for float16/bfloat16");
        return NULL;
    }
    s_f16 = t->f16;
    s_bf16 = t->bf16;
    MPI_Op_create(half_sum, 1, &t->half_ops[HVD_OP_SUM]);
    t->half_ops[HVD_OP_AVERAGE] = t->half_ops[HVD_OP_SUM];
    MPI_Op_create(half_min, 1, &t->half_ops[HVD_OP_MIN]);
    MPI_Op_create(half_max, 1, &t->half_ops[HVD_OP_MAX]);
    MPI_Op_create(half_prod, 1, &t->half_ops[HVD_OP_PRODUCT]);
    return t;
}

void rt_mpi_types_free(rt_mpi_types *t) {
    if (!t) return;
    MPI_Op_free(&t->half_ops[HVD_OP_SUM]);
    MPI_Op_free(&t->half_ops[HVD_OP_MIN]);
    MPI_Op_free(&t->half_ops[HVD_OP_MAX]);
    MPI_Op_free(&t->half_ops[HVD_OP_PRODUCT]);
    MPI_Type_free(&t->f16);
    MPI_Type_free(&t->bf16);
    free(t);
}

static MPI_Datatype mpi_dtype(const rt_mpi_types *t, hvd_dtype d) {
    switch (d) {
    case HVD_UINT8:
        return MPI_UINT8_T;
    case HVD_INT8:
        return MPI_INT8_T;
    case HVD_INT32:
        return MPI_INT32_T;
    case HVD_INT64:
        return MPI_INT64_T;
    case HVD_FLOAT16:
        return t->f16;
    case HVD_BFLOAT16:
        return t->bf16;
    case HVD_FLOAT32:
        return MPI_FLOAT;
    case HVD_FLOAT64:
        return MPI_DOUBLE;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(const rt_mpi_types *t, hvd_dtype d, hvd_reduce_op op) {
    if (d == HVD_FLOAT16 || d == HVD_BFLOAT16) return t->half_ops[op];
    switch (op) {
    case HVD_OP_MIN:
        return MPI_MIN;
    case HVD_OP_MAX:
        return MPI_MAX;
    case HVD_OP_PRODUCT:
        return MPI_PROD;
    default:
        return MPI_SUM;
    }
}

static int mpi_fail(hvd_err *err, int rc, const char *what, const char *name) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return rt_err(err, HVD_E_INTERNAL, "%s for tensor '%s' failed: %s", what, name, msg);
}

/* Timeline activity on every tensor of the group. */
static void activity(rt_exec *x, rt_group *g, const char *what) {
    if (!x->tl) return;
    for (size_t i = 0; i < g->n; i++) {
        if (what)
            rt_timeline_start(x->tl, g->entries[i]->name, what);
        else
            rt_timeline_end(x->tl, g->entries[i]->name);
    }
}

/* MPI counts are int: split a long reduction into chunks that fit. */
static int allreduce_chunked(const void *send, void *recv, int64_t count, size_t esize,
                             MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    const int64_t chunk = INT_MAX / 2; /* elements; keeps chunks well inside int */
    for (int64_t off = 0; off < count; off += chunk) {
        int n = (int)(count - off < chunk ? count - off : chunk);
        const void *s =
            send == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)send + off * (int64_t)esize;
        int rc = MPI_Allreduce(s, (char *)recv + off * (int64_t)esize, n, dt, op, comm);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

static int exec_allreduce(rt_exec *x, rt_group *g, hvd_err *err) {
    hvd_dtype t = g->p.dtype;
    hvd_reduce_op op = g->p.op;
    size_t es = rt_dtype_size(t);
    MPI_Datatype dt = mpi_dtype(x->mpi, t);
    MPI_Op mop = mpi_op(x->mpi, t, op);
    double pre = g->p.prescale, post = g->p.postscale;
    if (g->total_elems == 0) return 0; /* agreed on every rank: nobody calls MPI */

    if (g->n == 1) {
        /* Unfused: reduce straight into the output, with no copy when nothing is scaled. */
        rt_entry *e = g->entries[0];
        int rc;
        activity(x, g, "MPI_ALLREDUCE");
        if (pre == 1.0) {
            rc = allreduce_chunked(e->in == e->out ? MPI_IN_PLACE : e->in, e->out, e->p.count, es,
                                   dt, mop, x->comm);
        } else {
            if (e->in != e->out) memcpy(e->out, e->in, (size_t)e->p.count * es);
            rt_scale(e->out, e->p.count, t, pre);
            rc = allreduce_chunked(MPI_IN_PLACE, e->out, e->p.count, es, dt, mop, x->comm);
        }
        if (rc == MPI_SUCCESS) rt_finish_reduction(e->out, e->p.count, t, op, x->size, post);
        activity(x, g, NULL);
        return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Allreduce", e->name);
    }

    char *buf = rt_fusion_buffer_get(x->fusion, (size_t)g->total_elems * es);
    if (!buf) rt_log("out of memory for a %lld-byte fusion buffer", (long long)g->total_elems);
    if (!buf) abort(); /* other ranks are entering the collective: cannot back out alone */
    activity(x, g, "MEMCPY_IN_FUSION_BUFFER");
    size_t off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t bytes = (size_t)g->entries[i]->p.count * es;
        if (bytes) memcpy(buf + off, g->entries[i]->in, bytes);
        off += bytes;
    }
    rt_scale(buf, g->total_elems, t, pre);
    activity(x, g, NULL);
    activity(x, g, "MPI_ALLREDUCE");
    int rc = allreduce_chunked(MPI_IN_PLACE, buf, g->total_elems, es, dt, mop, x->comm);
    activity(x, g, NULL);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "fused MPI_Allreduce", g->entries[0]->name);
    activity(x, g, "MEMCPY_OUT_FUSION_BUFFER");
    rt_finish_reduction(buf, g->total_elems, t, op, x->size, post);
    off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t bytes = (size_t)g->entries[i]->p.count * es;
        if (bytes) memcpy(g->entries[i]->out, buf + off, bytes);
        off += bytes;
    }
    activity(x, g, NULL);
    return 0;
}

/* Row counts and displacements for the v-collectives, in rows of a contiguous row type.
 * Fails (identically on every rank, since the inputs are agreed) when they exceed int. */
static int to_int_counts(const int64_t *rows, int size, int *counts, int *displs) {
    int64_t off = 0;
    for (int r = 0; r < size; r++) {
        if (rows[r] < 0 || rows[r] > INT_MAX || off > INT_MAX) return -1;
        counts[r] = (int)rows[r];
        displs[r] = (int)off;
        off += rows[r];
    }
    return 0;
}

static int row_type(int64_t row_bytes, MPI_Datatype *t) {
    if (row_bytes > INT_MAX) return -1;
    if (MPI_Type_contiguous((int)row_bytes, MPI_BYTE, t) != MPI_SUCCESS) return -1;
    return MPI_Type_commit(t) == MPI_SUCCESS ? 0 : -1;
}

static int exec_allgather(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    int64_t row_bytes = e->p.row_elems * (int64_t)rt_dtype_size(e->p.dtype);
    int64_t *rank_rows = rt_xcalloc((size_t)size, sizeof *rank_rows);
    activity(x, g, "MPI_ALLGATHER");
    int rc = MPI_Allgather(&e->rows, 1, MPI_INT64_T, rank_rows, 1, MPI_INT64_T, x->comm);
    if (rc != MPI_SUCCESS) {
        free(rank_rows);
        activity(x, g, NULL);
        return mpi_fail(err, rc, "MPI_Allgather of first dimensions", e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += rank_rows[r];
    int *counts = rt_xmalloc((size_t)size * sizeof *counts);
    int *displs = rt_xmalloc((size_t)size * sizeof *displs);
    void *data = NULL;
    int ret = 0;
    MPI_Datatype rt = MPI_DATATYPE_NULL;
    if (to_int_counts(rank_rows, size, counts, displs) != 0 || row_type(row_bytes, &rt) != 0) {
        ret = rt_err(err, HVD_E_INVALID,
                     "allgather of tensor '%s' is too large for MPI's int counts (%lld rows "
                     "of %lld bytes)",
                     e->name, (long long)total, (long long)row_bytes);
    } else if (total > 0 && row_bytes > 0) {
        data = rt_xmalloc((size_t)(total * row_bytes));
        rc = MPI_Allgatherv(e->in, (int)e->rows, rt, data, counts, displs, rt, x->comm);
        if (rc != MPI_SUCCESS) ret = mpi_fail(err, rc, "MPI_Allgatherv", e->name);
    }
    if (rt != MPI_DATATYPE_NULL) MPI_Type_free(&rt);
    activity(x, g, NULL);
    free(counts);
    free(displs);
    if (ret != 0) {
        free(data);
        free(rank_rows);
        return ret;
    }
    e->result->data = data;
    e->result->first_dim = total;
    e->result->rank_rows = rank_rows;
    e->result->bytes = (size_t)(total * row_bytes);
    e->result->device = HVD_DEVICE_CPU;
    return 0;
}

static int exec_broadcast(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int64_t bytes = e->p.count * (int64_t)rt_dtype_size(e->p.dtype);
    activity(x, g, "MPI_BCAST");
    int rc = MPI_SUCCESS;
    for (int64_t off = 0; off < bytes && rc == MPI_SUCCESS; off += INT_MAX / 2) {
        int n = (int)(bytes - off < INT_MAX / 2 ? bytes - off : INT_MAX / 2);
        rc = MPI_Bcast((char *)e->out + off, n, MPI_BYTE, e->p.root, x->comm);
    }
    activity(x, g, NULL);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Bcast", e->name);
}

static int exec_alltoall(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    int64_t row_bytes = e->p.row_elems * (int64_t)rt_dtype_size(e->p.dtype);
    int64_t *recv_rows = rt_xcalloc((size_t)size, sizeof *recv_rows);
    activity(x, g, "MPI_ALLTOALL");
    int rc = MPI_Alltoall(e->splits, 1, MPI_INT64_T, recv_rows, 1, MPI_INT64_T, x->comm);
    if (rc != MPI_SUCCESS) {
        free(recv_rows);
        activity(x, g, NULL);
        return mpi_fail(err, rc, "MPI_Alltoall of split sizes", e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += recv_rows[r];
    int *sc = rt_xmalloc((size_t)size * sizeof *sc), *sd = rt_xmalloc((size_t)size * sizeof *sd);
    int *rc_ = rt_xmalloc((size_t)size * sizeof *rc_), *rd = rt_xmalloc((size_t)size * sizeof *rd);
    void *data = NULL;
    int ret = 0;
    MPI_Datatype rt = MPI_DATATYPE_NULL;
    /* The int check is local to each rank's counts; a rank failing it alone would leave the
     * others in MPI_Alltoallv, so agree on the outcome first. */
    int ok = to_int_counts(e->splits, size, sc, sd) == 0 &&
             to_int_counts(recv_rows, size, rc_, rd) == 0 && row_type(row_bytes, &rt) == 0;
    int all_ok = 0;
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, x->comm);
    if (rc != MPI_SUCCESS) {
        ret = mpi_fail(err, rc, "MPI_Allreduce of alltoall checks", e->name);
    } else if (!all_ok) {
        ret = rt_err(err, HVD_E_INVALID,
                     "alltoall of tensor '%s' is too large for MPI's int counts on some rank",
                     e->name);
    } else if (row_bytes > 0) {
        if (total > 0) data = rt_xmalloc((size_t)(total * row_bytes));
        rc = MPI_Alltoallv(e->in, sc, sd, rt, data, rc_, rd, rt, x->comm);
        if (rc != MPI_SUCCESS) ret = mpi_fail(err, rc, "MPI_Alltoallv", e->name);
    }
    if (rt != MPI_DATATYPE_NULL) MPI_Type_free(&rt);
    activity(x, g, NULL);
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    if (ret != 0) {
        free(data);
        free(recv_rows);
        return ret;
    }
    e->result->data = data;
    e->result->first_dim = total;
    e->result->rank_rows = recv_rows;
    e->result->bytes = (size_t)(total * row_bytes);
    e->result->device = HVD_DEVICE_CPU;
    return 0;
}

static int exec_reducescatter(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    hvd_dtype t = e->p.dtype;
    int64_t first_dim = e->p.row_elems ? e->p.count / e->p.row_elems : 0;
    int *counts = rt_xmalloc((size_t)size * sizeof *counts);
    bool fits = true;
    for (int r = 0; r < size; r++) {
        int64_t c = hvd_reducescatter_rows(first_dim, r, size) * e->p.row_elems;
        if (c > INT_MAX) fits = false;
        counts[r] = (int)(c > INT_MAX ? 0 : c);
    }
    if (!fits) {
        free(counts);
        return rt_err(err, HVD_E_INVALID,
                      "reducescatter of tensor '%s' is too large for MPI's int counts", e->name);
    }
    int rc = MPI_SUCCESS;
    if (e->p.count > 0) {
        activity(x, g, "MPI_REDUCESCATTER");
        rc = MPI_Reduce_scatter(e->in, e->out, counts, mpi_dtype(x->mpi, t),
                                mpi_op(x->mpi, t, e->p.op), x->comm);
        activity(x, g, NULL);
        if (rc == MPI_SUCCESS)
            rt_finish_reduction(e->out, counts[x->rank], t, e->p.op, size, e->p.postscale);
    }
    free(counts);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Reduce_scatter", e->name);
}

int rt_mpi_execute(rt_exec *x, rt_group *g, hvd_err *err) {
    switch (g->p.optype) {
    case RT_ALLREDUCE:
        return exec_allreduce(x, g, err);
    case RT_ALLGATHER:
        return exec_allgather(x, g, err);
    case RT_BROADCAST:
        return exec_broadcast(x, g, err);
    case RT_ALLTOALL:
        return exec_alltoall(x, g, err);
    case RT_REDUCESCATTER:
        return exec_reducescatter(x, g, err);
    case RT_BARRIER: {
        activity(x, g, "MPI_BARRIER");
        int rc = MPI_Barrier(x->comm);
        activity(x, g, NULL);
        return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Barrier", g->entries[0]->name);
    }
    }
    return rt_err(err, HVD_E_INTERNAL, "unknown collective type %d", g->p.optype);
}
