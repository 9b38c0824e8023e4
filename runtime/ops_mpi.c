/* Collectives on host buffers with MPI (ops_mpi.h). Every function here is entered by all
 * ranks for the same group in the same order (the cycle guarantees it), and every decision
 * that could make one rank skip a call is taken from agreed data only, so a rank never waits
 * in a collective the others do not enter. That includes running out of memory: the fused
 * allreduce's buffer is reserved before the cycle's agreement (cycle.c), and the outputs of
 * allgather and alltoall are allocated before their data moves, with the outcome agreed. */
#include "ops_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "types.h"

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
    rt_mpi_types *t = calloc(1, sizeof *t);
    if (!t) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory creating the MPI datatypes");
        return NULL;
    }
    if (MPI_Type_contiguous(2, MPI_BYTE, &t->f16) != MPI_SUCCESS ||
        MPI_Type_commit(&t->f16) != MPI_SUCCESS ||
        MPI_Type_contiguous(2, MPI_BYTE, &t->bf16) != MPI_SUCCESS ||
        MPI_Type_commit(&t->bf16) != MPI_SUCCESS) {
        free(t);
        hvd_err_set(err, HVD_E_INTERNAL, "cannot create the MPI datatypes for float16/bfloat16");
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
    return hvd_err_set(err, HVD_E_INTERNAL, "%s for tensor '%s' failed: %s", what, name, msg);
}

/* The error for an output some rank could not allocate (the same sentence on every rank). */
static int output_fail(hvd_err *err, const char *op, const char *name, int rank) {
    return hvd_err_set(err, HVD_E_INTERNAL,
                       "%s of tensor '%s' failed: rank %d ran out of memory for its result", op,
                       name, rank);
}

/* Memory for a collective's output: NULL when out of memory (or when the test hook says so);
 * bytes == 0 gives NULL with *ok untouched. */
static void *alloc_output(size_t bytes, bool *ok) {
    if (bytes == 0) return NULL;
    void *p = rt_fault_hit(RT_FAULT_OUTPUT) ? NULL : malloc(bytes);
    if (!p) *ok = false;
    return p;
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
        rt_ops_activity(x, g, "MPI_ALLREDUCE");
        if (pre == 1.0) {
            rc = allreduce_chunked(e->in == e->out ? MPI_IN_PLACE : e->in, e->out, e->p.count, es,
                                   dt, mop, x->comm);
        } else {
            if (e->in != e->out) memcpy(e->out, e->in, (size_t)e->p.count * es);
            rt_scale(e->out, e->p.count, t, pre);
            rc = allreduce_chunked(MPI_IN_PLACE, e->out, e->p.count, es, dt, mop, x->comm);
        }
        if (rc == MPI_SUCCESS) rt_finish_reduction(e->out, e->p.count, t, op, x->size, post);
        rt_ops_activity(x, g, NULL);
        return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Allreduce", e->name);
    }

    /* The cycle reserved the buffer for every group it can form before the ranks agreed on
     * this cycle's work, and planned without fusion on every rank if any rank could not; so
     * the buffer is always big enough here, and no rank has to back out of this collective
     * alone. */
    char *buf = x->fusion.data;
    if (!buf || x->fusion.cap < (size_t)g->total_elems * es)
        return hvd_err_set(err, HVD_E_INTERNAL,
                           "internal error: the fusion buffer was not reserved for tensor '%s'",
                           g->entries[0]->name);
    rt_ops_activity(x, g, "MEMCPY_IN_FUSION_BUFFER");
    size_t off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t bytes = (size_t)g->entries[i]->p.count * es;
        if (bytes) memcpy(buf + off, g->entries[i]->in, bytes);
        off += bytes;
    }
    rt_scale(buf, g->total_elems, t, pre);
    rt_ops_activity(x, g, NULL);
    rt_ops_activity(x, g, "MPI_ALLREDUCE");
    int rc = allreduce_chunked(MPI_IN_PLACE, buf, g->total_elems, es, dt, mop, x->comm);
    rt_ops_activity(x, g, NULL);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "fused MPI_Allreduce", g->entries[0]->name);
    rt_ops_activity(x, g, "MEMCPY_OUT_FUSION_BUFFER");
    rt_finish_reduction(buf, g->total_elems, t, op, x->size, post);
    off = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t bytes = (size_t)g->entries[i]->p.count * es;
        if (bytes) memcpy(g->entries[i]->out, buf + off, bytes);
        off += bytes;
    }
    rt_ops_activity(x, g, NULL);
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
    /* The output's row counts; without memory for them this rank still takes part, counting
     * in scratch, and the agreement below fails the tensor on every rank. */
    bool alloc_ok = true;
    int64_t *rank_rows =
        rt_fault_hit(RT_FAULT_OUTPUT) ? NULL : calloc((size_t)size, sizeof *rank_rows);
    if (!rank_rows) alloc_ok = false;
    int64_t *rows = rank_rows ? rank_rows : x->rows;
    rt_ops_activity(x, g, "MPI_ALLGATHER");
    int rc = MPI_Allgather(&e->rows, 1, MPI_INT64_T, rows, 1, MPI_INT64_T, x->comm);
    if (rc != MPI_SUCCESS) {
        free(rank_rows);
        rt_ops_activity(x, g, NULL);
        return mpi_fail(err, rc, "MPI_Allgather of first dimensions", e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += rows[r];
    MPI_Datatype rt = MPI_DATATYPE_NULL;
    bool fits =
        to_int_counts(rows, size, x->counts, x->displs) == 0 && row_type(row_bytes, &rt) == 0;
    void *data = fits ? alloc_output((size_t)(total * row_bytes), &alloc_ok) : NULL;
    int failed_rank = -1, ret = 0;
    rc = rt_ops_agree(x, alloc_ok, &failed_rank, &fits);
    if (rc != MPI_SUCCESS) {
        ret = mpi_fail(err, rc, "MPI_Allreduce of allgather checks", e->name);
    } else if (!fits) {
        ret = hvd_err_set(err, HVD_E_INVALID,
                          "allgather of tensor '%s' is too large for MPI's int counts (%lld rows "
                          "of %lld bytes)",
                          e->name, (long long)total, (long long)row_bytes);
    } else if (failed_rank >= 0) {
        ret = output_fail(err, "allgather", e->name, failed_rank);
    } else if (total > 0 && row_bytes > 0) {
        rc = MPI_Allgatherv(e->in, (int)e->rows, rt, data, x->counts, x->displs, rt, x->comm);
        if (rc != MPI_SUCCESS) ret = mpi_fail(err, rc, "MPI_Allgatherv", e->name);
    }
    if (rt != MPI_DATATYPE_NULL) MPI_Type_free(&rt);
    rt_ops_activity(x, g, NULL);
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
    rt_ops_activity(x, g, "MPI_BCAST");
    int rc = MPI_SUCCESS;
    for (int64_t off = 0; off < bytes && rc == MPI_SUCCESS; off += INT_MAX / 2) {
        int n = (int)(bytes - off < INT_MAX / 2 ? bytes - off : INT_MAX / 2);
        rc = MPI_Bcast((char *)e->out + off, n, MPI_BYTE, e->p.root, x->comm);
    }
    rt_ops_activity(x, g, NULL);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Bcast", e->name);
}

static int exec_alltoall(rt_exec *x, rt_group *g, hvd_err *err) {
    rt_entry *e = g->entries[0];
    int size = x->size;
    int64_t row_bytes = e->p.row_elems * (int64_t)rt_dtype_size(e->p.dtype);
    bool alloc_ok = true;
    int64_t *recv_rows =
        rt_fault_hit(RT_FAULT_OUTPUT) ? NULL : calloc((size_t)size, sizeof *recv_rows);
    if (!recv_rows) alloc_ok = false;
    int64_t *rows = recv_rows ? recv_rows : x->rows;
    rt_ops_activity(x, g, "MPI_ALLTOALL");
    int rc = MPI_Alltoall(e->splits, 1, MPI_INT64_T, rows, 1, MPI_INT64_T, x->comm);
    if (rc != MPI_SUCCESS) {
        free(recv_rows);
        rt_ops_activity(x, g, NULL);
        return mpi_fail(err, rc, "MPI_Alltoall of split sizes", e->name);
    }
    int64_t total = 0;
    for (int r = 0; r < size; r++)
        total += rows[r];
    MPI_Datatype rt = MPI_DATATYPE_NULL;
    /* The int check and the allocation are local to each rank's counts; a rank failing either
     * alone would leave the others in MPI_Alltoallv, so agree on the outcome first. */
    bool fits = to_int_counts(e->splits, size, x->counts, x->displs) == 0 &&
                to_int_counts(rows, size, x->rcounts, x->rdispls) == 0 &&
                row_type(row_bytes, &rt) == 0;
    void *data =
        fits && row_bytes > 0 ? alloc_output((size_t)(total * row_bytes), &alloc_ok) : NULL;
    int failed_rank = -1, ret = 0;
    rc = rt_ops_agree(x, alloc_ok, &failed_rank, &fits);
    if (rc != MPI_SUCCESS) {
        ret = mpi_fail(err, rc, "MPI_Allreduce of alltoall checks", e->name);
    } else if (!fits) {
        ret = hvd_err_set(err, HVD_E_INVALID,
                          "alltoall of tensor '%s' is too large for MPI's int counts on some rank",
                          e->name);
    } else if (failed_rank >= 0) {
        ret = output_fail(err, "alltoall", e->name, failed_rank);
    } else if (row_bytes > 0) {
        rc = MPI_Alltoallv(e->in, x->counts, x->displs, rt, data, x->rcounts, x->rdispls, rt,
                           x->comm);
        if (rc != MPI_SUCCESS) ret = mpi_fail(err, rc, "MPI_Alltoallv", e->name);
    }
    if (rt != MPI_DATATYPE_NULL) MPI_Type_free(&rt);
    rt_ops_activity(x, g, NULL);
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
    int *counts = x->counts;
    bool fits = true;
    for (int r = 0; r < size; r++) {
        int64_t c = hvd_reducescatter_rows(first_dim, r, size) * e->p.row_elems;
        if (c > INT_MAX) fits = false;
        counts[r] = (int)(c > INT_MAX ? 0 : c);
    }
    if (!fits) {
        return hvd_err_set(err, HVD_E_INVALID,
                           "reducescatter of tensor '%s' is too large for MPI's int counts",
                           e->name);
    }
    int rc = MPI_SUCCESS;
    if (e->p.count > 0) {
        rt_ops_activity(x, g, "MPI_REDUCESCATTER");
        rc = MPI_Reduce_scatter(e->in, e->out, counts, mpi_dtype(x->mpi, t),
                                mpi_op(x->mpi, t, e->p.op), x->comm);
        rt_ops_activity(x, g, NULL);
        if (rc == MPI_SUCCESS)
            rt_finish_reduction(e->out, counts[x->rank], t, e->p.op, size, e->p.postscale);
    }
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
        rt_ops_activity(x, g, "MPI_BARRIER");
        int rc = MPI_Barrier(x->comm);
        rt_ops_activity(x, g, NULL);
        return rc == MPI_SUCCESS ? 0 : mpi_fail(err, rc, "MPI_Barrier", g->entries[0]->name);
    }
    }
    return hvd_err_set(err, HVD_E_INTERNAL, "unknown collective type %d", g->p.optype);
}
