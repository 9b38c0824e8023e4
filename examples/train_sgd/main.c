/* The argv form of the SGD example, for mpirun (or hvd-exec's command form).
 *
 *   hvd-example-train-sgd [--epochs N] [--batch B] [--samples S] [--lr LR]
 *                         [--out FILE] [--check FILE --tol T] [--max-mse M]
 *
 * Rank 0 prints the final weights, bias and mean squared error. --out writes them to FILE
 * (rank 0); --check compares this run's weights with FILE (say, from a 1-rank run) and fails
 * if any differs by more than T. Also fails if the final mean squared error is above M
 * (default 1e-3: the data's noise alone gives about 3e-5). Exit 0 on success, 1 on failure,
 * 2 on a bad command line. */
#include <getopt.h>
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

static const char usage[] =
    "usage: hvd-example-train-sgd [--epochs N] [--batch B] [--samples S] [--lr LR]\n"
    "                             [--out FILE] [--check FILE [--tol T]] [--max-mse M]\n"
    "\n"
    "Data-parallel linear regression: each rank trains on its share of a synthetic data set\n"
    "and gradients are averaged with hvd_allreduce. Run it under mpirun or hvd-driver, e.g.\n"
    "  hvd-driver run -np 2 -- hvd-example-train-sgd --epochs 5\n"
    "\n"
    "  --epochs N      passes over the data (default 20)\n"
    "  --batch B       samples per step over all ranks (default 256)\n"
    "  --samples S     samples in the data set (default 4096)\n"
    "  --lr LR         learning rate (default 0.2)\n"
    "  --out FILE      rank 0 writes the final weights and bias to FILE\n"
    "  --check FILE    fail if any weight differs from FILE's by more than --tol (default 1e-9)\n"
    "  --max-mse M     fail if the final mean squared error is above M (default 1e-3)\n"
    "  -h, --help      print this help and exit\n";

/* Parses a whole positive number or a finite number; 0 when the text is neither. */
static int parse_int(const char *s, int *v) {
    char *end;
    long n = strtol(s, &end, 10);
    if (end == s || *end || n <= 0 || n > 1000000000) return 0;
    *v = (int)n;
    return 1;
}

static int parse_double(const char *s, double *v) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d) || d < 0) return 0;
    *v = d;
    return 1;
}

typedef struct {
    sgd_config cfg;
    const char *out_path, *check_path;
    double tol, max_mse;
} options;

/* Returns 0 to train, 1 after --help, -1 on a bad option (said on stderr). */
static int parse_options(int argc, char **argv, options *o) {
    static const struct option longs[] = {
        {"epochs", required_argument, NULL, 'e'},  {"batch", required_argument, NULL, 'b'},
        {"samples", required_argument, NULL, 's'}, {"lr", required_argument, NULL, 'l'},
        {"out", required_argument, NULL, 'o'},     {"check", required_argument, NULL, 'c'},
        {"tol", required_argument, NULL, 't'},     {"max-mse", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    int c, li = 0, ok = 1;
    opterr = 0;
    while (ok && (c = getopt_long(argc, argv, "h", longs, &li)) != -1) {
        switch (c) {
        case 'e':
            ok = parse_int(optarg, &o->cfg.epochs);
            break;
        case 'b':
            ok = parse_int(optarg, &o->cfg.batch);
            break;
        case 's':
            ok = parse_int(optarg, &o->cfg.samples);
            break;
        case 'l':
            ok = parse_double(optarg, &o->cfg.lr) && o->cfg.lr > 0;
            break;
        case 'o':
            o->out_path = optarg;
            break;
        case 'c':
            o->check_path = optarg;
            break;
        case 't':
            ok = parse_double(optarg, &o->tol);
            break;
        case 'm':
            ok = parse_double(optarg, &o->max_mse);
            break;
        case 'h':
            fputs(usage, stdout);
            return 1;
        default:
            fprintf(stderr,
                    "hvd-example-train-sgd: unknown option or missing value: %s (see --help)\n",
                    argv[optind - 1]);
            return -1;
        }
    }
    if (!ok) {
        fprintf(stderr, "hvd-example-train-sgd: bad value '%s' for --%s (see --help)\n", optarg,
                longs[li].name);
        return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "hvd-example-train-sgd: unexpected argument %s (see --help)\n",
                argv[optind]);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o = {.cfg = {.samples = 4096, .batch = 256, .epochs = 20, .lr = 0.2},
                 .tol = 1e-9,
                 .max_mse = 1e-3};
    int parsed = parse_options(argc, argv, &o);
    if (parsed != 0) return parsed > 0 ? 0 : 2;
    sgd_config cfg = o.cfg;
    const char *out_path = o.out_path, *check_path = o.check_path;
    double tol = o.tol, max_mse = o.max_mse;
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
