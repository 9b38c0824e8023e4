/* A program entry point for the end-to-end tests: messages over Open MPI's TCP eager limit
 * (64 KiB) between ranks on different (fake) hosts, the way the collective runtime sends them:
 * MPI_THREAD_MULTIPLE, a duplicated communicator, MPI_Bcast and MPI_Allreduce of 1 MiB. Prints
 * "big messages ok" when every value arrived; a wrong value exits 3. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define BIG_N (256 * 1024) /* ints: 1 MiB */

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int *v = malloc(BIG_N * sizeof *v), *sum = malloc(BIG_N * sizeof *sum);
    if (!v || !sum) return 2;
    for (int i = 0; i < BIG_N; i++)
        v[i] = rank == 0 ? i : -1;
    MPI_Bcast(v, BIG_N, MPI_INT, 0, comm);
    MPI_Allreduce(v, sum, BIG_N, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < BIG_N; i++)
        if (v[i] != i || sum[i] != i * size) {
            fprintf(stderr, "big_messages: rank %d: element %d is %d / %d\n", rank, i, v[i],
                    sum[i]);
            return 3;
        }
    printf("big messages ok (rank %d of %d)\n", rank, size);
    free(v);
    free(sum);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
