/* The C entry point of a training job shipped as a shared object.
 *
 * `hvd-driver run --entry LIB.so:SYMBOL [--entry-arg STR]` sends LIB.so's bytes to every rank;
 * hvd-exec loads them from memory and calls SYMBOL, which must have the type hvd_entry_fn.
 * The executor does not need the file. */
#ifndef HVD_ENTRY_H
#define HVD_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#define HVD_ENTRY_ABI_VERSION 1
#define HVD_ENTRY_ERROR_MAX   1024

/* What a rank knows when its entry point is called. Valid for the duration of the call. */
typedef struct hvd_entry_ctx {
    uint32_t abi_version; /* HVD_ENTRY_ABI_VERSION */
    int rank;             /* OMPI_COMM_WORLD_RANK */
    int size;             /* OMPI_COMM_WORLD_SIZE */
    int local_rank;       /* OMPI_COMM_WORLD_LOCAL_RANK */
    int local_size;       /* OMPI_COMM_WORLD_LOCAL_SIZE */
    int task_index;       /* index of the task service this rank represents */
    const uint8_t *arg;   /* the --entry-arg bytes (may be empty, never NULL) */
    size_t arg_len;
    const char *const *gpus; /* GPU ids of this rank's task (NULL-terminated, maybe empty) */
    size_t ngpus;
} hvd_entry_ctx;

/* Where the entry point leaves its result. */
typedef struct hvd_entry_result {
    uint8_t *data; /* result bytes, malloc'd by the entry point (or NULL);
                      hvd-exec frees them with free() */
    size_t len;
    char error[HVD_ENTRY_ERROR_MAX]; /* on failure: one sentence saying what went wrong */
} hvd_entry_result;

/* Returns 0 on success, non-zero on failure (the rank's exit status becomes that value, and
 * out->error reaches the driver and the user). */
typedef int (*hvd_entry_fn)(const hvd_entry_ctx *ctx, hvd_entry_result *out);

#endif
