/* A rank for the ssh-mode mpirun test: an MPI_Allreduce across the fake hosts, then one line
 * saying where the rank ran ("rank R size N sum S host H"; H = $HVD_FAKE_HOST, which each
 * fake host's sshd sets). The sum is only right if MPI traffic crossed the hosts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    const char *host = getenv("HVD_FAKE_HOST");
    printf("rank %d size %d sum %ld host %s\n", rank, size, sum, host ? host : "?");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
