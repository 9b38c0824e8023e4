/* The argv form of the SGD example, for mpirun (or hvd-exec's command form).
 *
 *   hvd-example-train-sgd [--epochs N] [--batch B] [--samples S] [--lr LR]
 *                         [--out FILE] [--check FILE --tol T] [--max-mse M]
 *
 * Rank 0 prints the final weights, bias and mean squared error. --out writes them to FILE
 * (rank 0); --check compares this run's weights with FILE (say, from a 1-rank run) and fails
 * if any differs by more than T. Also fails if the final mean squared error is above M
 * (default 1e-3: the data's noise alone gives about 3e-5). Exit 0 on success, 1 on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/runtime.h"
#include "train_sgd.h"

#define NW (SGD_FEATURES + 1)

static int read_weights(const char *path, double *w) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    while (n < NW && fscanf(f, "%lf", &w[n]) == 1)
        n++;
    fclose(f);
    return n == NW ? 0 : -1;
}

int main(int argc, char **argv) {
    sgd_config cfg = {.samples = 4096, .batch = 256, .epochs = 20, .lr = 0.2};
    const char *out_path = NULL, *check_path = NULL;
    double tol = 1e-9, max_mse = 1e-3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--epochs"))
            cfg.epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            cfg.batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--samples"))
            cfg.samples = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--lr"))
            cfg.lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--out"))
            out_path = argv[i + 1];
        else if (!strcmp(argv[i], "--check"))
            check_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tol"))
            tol = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-mse"))
            max_mse = atof(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 1;
        }
    }
    hvd_err e = {0};
    if (hvd_init(&e) != 0) {
        fprintf(stderr, "hvd_init failed: %s\n", e.msg);
        return 1;
    }
    int rank = hvd_rank(), size = hvd_size();
    double w[NW], mse = 0;
    char err[512];
    if (sgd_train(&cfg, w, &mse, err, sizeof err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        hvd_shutdown();
        return 1;
    }
    hvd_shutdown();
    int rc = 0;
    if (rank == 0) {
        printf("%d ranks, %d epochs: weights", size, cfg.epochs);
        for (int k = 0; k < NW; k++)
            printf(" %.17g", w[k]);
        printf("\nmean squared error %.6g\n", mse);
        if (out_path) {
            FILE *f = fopen(out_path, "w");
            if (!f) {
                perror(out_path);
                return 1;
            }
            for (int k = 0; k < NW; k++)
                fprintf(f, "%.17g\n", w[k]);
            fclose(f);
        }
    }
    if (check_path) {
        double ref[NW];
        if (read_weights(check_path, ref) != 0) {
            fprintf(stderr, "cannot read %d weights from %s\n", NW, check_path);
            return 1;
        }
        double worst = 0;
        for (int k = 0; k < NW; k++)
            worst = fmax(worst, fabs(w[k] - ref[k]));
        if (rank == 0)
            printf("largest difference from %s: %.3g (tolerance %.3g)\n", check_path, worst, tol);
        if (!(worst <= tol)) rc = 1;
    }
    if (!(mse <= max_mse)) {
        fprintf(stderr, "rank %d: training did not converge (mse %g > %g)\n", rank, mse, max_mse);
        rc = 1;
    } else if (rank == 0) {
        printf("converged (mse %g <= %g)\n", mse, max_mse);
    }
    return rc;
}
