/* The argv form of the allreduce example: run it under mpirun (or as hvd-exec's command).
 * Prints this rank's result line; exits 0 on success, 1 with the reason on stderr, 2 on
 * arguments (it takes none but --help). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allreduce.h"

/* The first of hvd-exec's, Open MPI's and MPICH's (Hydra's) names for a number that is set. */
static int env_int(const char *hvd, const char *ompi, const char *mpich) {
    const char *s = getenv(hvd);
    if (!s) s = getenv(ompi);
    if (!s) s = getenv(mpich);
    return s ? atoi(s) : -1;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs("usage: hvd-example-allreduce\n\n"
              "Sums [1, 2, 3, 4] times (rank + 1) over all ranks and prints this rank's result.\n"
              "Run it under mpirun or hvd-driver, e.g.\n"
              "  hvd-driver run -np 3 -- hvd-example-allreduce\n",
              stdout);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr,
                "hvd-example-allreduce: unexpected argument %s (it takes none; see --help)\n",
                argv[1]);
        return 2;
    }
    /* What hvd-exec would pass: the launcher's view of the rank, if there is one. */
    hvd_entry_ctx ctx = {.abi_version = HVD_ENTRY_ABI_VERSION,
                         .rank = env_int("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
                         .size = env_int("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
                         .local_rank = env_int("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                               "MPI_LOCALRANKID"),
                         .local_size = env_int("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                               "MPI_LOCALNRANKS"),
                         .task_index = -1,
                         .arg = (const uint8_t *)"",
                         .arg_len = 0};
    hvd_entry_result res = {0};
    int rc = hvd_example_allreduce(&ctx, &res);
    if (rc == 0)
        fwrite(res.data, 1, res.len, stdout);
    else
        fprintf(stderr, "hvd-example-allreduce: %s\n", res.error);
    free(res.data);
    return rc;
}
