/* A minimal entry point: every rank contributes (rank + 1) * [1, 2, 3, 4] and gets the sum
 * over all ranks, size * (size + 1) / 2 * [1, 2, 3, 4]. */
#include "allreduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/runtime.h"

__attribute__((visibility("default"))) int hvd_example_allreduce(const hvd_entry_ctx *ctx,
                                                                 hvd_entry_result *out) {
    hvd_err err = {0};
    if (hvd_init(&err) != 0) {
        snprintf(out->error, sizeof out->error, "hvd_init failed: %s", err.msg);
        return 1;
    }
    int rank = hvd_rank(), size = hvd_size();
    /* hvd-exec and MPI must agree on who this rank is. */
    if (ctx && ctx->rank >= 0 && (ctx->rank != rank || ctx->size != size)) {
        snprintf(out->error, sizeof out->error,
                 "the launcher says rank %d of %d, MPI says rank %d of %d", ctx->rank, ctx->size,
                 rank, size);
        hvd_shutdown();
        return 1;
    }
    double in[4], sum[4];
    for (int i = 0; i < 4; i++)
        in[i] = (rank + 1.0) * (i + 1);
    int rc = hvd_allreduce("example.allreduce", in, sum, 4, HVD_FLOAT64, HVD_OP_SUM, HVD_DEVICE_CPU,
                           &err);
    if (rc == 0) {
        double expect = size * (size + 1) / 2.0;
        for (int i = 0; i < 4; i++)
            if (sum[i] != expect * (i + 1)) {
                snprintf(out->error, sizeof out->error, "rank %d: element %d is %g, expected %g",
                         rank, i, sum[i], expect * (i + 1));
                rc = -1;
                break;
            }
    } else {
        snprintf(out->error, sizeof out->error, "allreduce failed: %s", err.msg);
    }
    if (rc == 0) {
        char line[256];
        int n = snprintf(line, sizeof line,
                         "rank %d/%d (local %d/%d, %s): allreduce sum = [%g, %g, %g, %g]\n", rank,
                         size, hvd_local_rank(), hvd_local_size(), hvd_mpi_built_for(), sum[0],
                         sum[1], sum[2], sum[3]);
        out->data = malloc((size_t)n);
        if (out->data) {
            memcpy(out->data, line, (size_t)n);
            out->len = (size_t)n;
        }
    }
    hvd_shutdown();
    return rc == 0 ? 0 : 1;
}
