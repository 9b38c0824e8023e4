/* Data-parallel SGD on a linear regression problem generated from a fixed seed. */
#ifndef HVD_EXAMPLE_TRAIN_SGD_H
#define HVD_EXAMPLE_TRAIN_SGD_H

#include <stddef.h>

#include "hvd/entry.h"

#define SGD_FEATURES 8

typedef struct sgd_config {
    int samples; /* size of the generated data set */
    int batch;   /* global batch size: every step uses the same samples on any rank count */
    int epochs;
    double lr;
} sgd_config;

/* Trains with the runtime already started (hvd_init). On success returns 0 and leaves the
 * final weights (SGD_FEATURES of them, then the bias) in w and the final mean squared error
 * in *mse; on failure returns -1 with a sentence in err (err_len bytes). */
int sgd_train(const sgd_config *cfg, double *w, double *mse, char *err, size_t err_len);

/* Elastic training (include/hvd/elastic.h): the same steps, resumed from the newest commit
 * after a reset, committing every commit_every steps. */
typedef struct sgd_elastic_config {
    sgd_config base;
    int commit_every;      /* steps between commits */
    int sleep_ms;          /* pause after each step (tests and benchmarks slow it down) */
    const char *log_path;  /* rank 0 appends "start ..." and "commit ..." lines here, or NULL */
    const char *fail_host; /* tests: ranks on this host hash fail (status 3) at every start */
    int fail_rank;         /* tests: this rank fails (status 3) at every start; -1: none */
    size_t state_bytes;    /* tests: commit this many bytes (the state, then zeros), if more */
} sgd_elastic_config;

/* Trains (hvd_init done) from the newest commit, or from the start. Returns 0 with the final
 * weights and error as sgd_train; HVD_ELASTIC_EXIT_RESET when the job must be reset (the hosts
 * changed at a commit, or a collective failed because a rank went away: the rank should end
 * with that status); -1 with err otherwise, also when a commit or the restore failed in a way
 * a reset cannot cure (hvd_elastic_resettable: e.g. a state over HVD_ELASTIC_STATE_MAX). */
int sgd_train_elastic(const sgd_elastic_config *ec, double *w, double *mse, char *err,
                      size_t err_len);

/* The elastic entry point: ctx->arg is "epochs=N,commit=K,sleep=MS,log=FILE,fail_host=H,
 * fail_rank=R,state_bytes=B" (each optional).
 * Returns as hvd_example_train_sgd, or HVD_ELASTIC_EXIT_RESET. */
int hvd_example_train_sgd_elastic(const hvd_entry_ctx *ctx, hvd_entry_result *out);

/* The entry point (type hvd_entry_fn). ctx->arg may hold "epochs=N" (text). Leaves the final
 * weights and MSE as one line of text in out->data. Returns 0, or 1 with out->error. */
int hvd_example_train_sgd(const hvd_entry_ctx *ctx, hvd_entry_result *out);

#endif
