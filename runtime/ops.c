/* The backends' shared context (ops.h). */
#include "ops.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int rt_exec_init(rt_exec *x, MPI_Comm comm, int rank, int size, hvd_err *err) {
    memset(x, 0, sizeof *x);
    x->comm = comm;
    x->rank = rank;
    x->size = size;
    size_t n = (size_t)size;
    x->counts = malloc(n * sizeof *x->counts);
    x->displs = malloc(n * sizeof *x->displs);
    x->rcounts = malloc(n * sizeof *x->rcounts);
    x->rdispls = malloc(n * sizeof *x->rdispls);
    x->rows = malloc(n * sizeof *x->rows);
    if (!x->counts || !x->displs || !x->rcounts || !x->rdispls || !x->rows) {
        rt_exec_free(x);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory for the collectives' scratch");
    }
    return 0;
}

void rt_exec_free(rt_exec *x) {
    free(x->counts);
    free(x->displs);
    free(x->rcounts);
    free(x->rdispls);
    free(x->rows);
    x->counts = x->displs = x->rcounts = x->rdispls = NULL;
    x->rows = NULL;
    rt_fusion_buffer_free(&x->fusion);
}

void rt_ops_activity(rt_exec *x, const rt_group *g, const char *what) {
    if (!x->tl) return;
    for (size_t i = 0; i < g->n; i++) {
        if (what)
            rt_timeline_start(x->tl, g->entries[i]->name, what);
        else
            rt_timeline_end(x->tl, g->entries[i]->name);
    }
}

int rt_ops_agree(rt_exec *x, bool alloc_ok, int *failed_rank, bool *checks_ok) {
    int mine[2] = {alloc_ok ? INT_MAX : x->rank, !checks_ok || *checks_ok};
    int all[2] = {INT_MAX, 1};
    int rc = MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, x->comm);
    *failed_rank = all[0] == INT_MAX ? -1 : all[0];
    if (checks_ok) *checks_ok = all[1] != 0;
    return rc;
}
