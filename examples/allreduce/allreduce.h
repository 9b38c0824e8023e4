/* The minimal collective example, shared by the program and the shared object. */
#ifndef HVD_EXAMPLE_ALLREDUCE_H
#define HVD_EXAMPLE_ALLREDUCE_H

#include "hvd/entry.h"

/* The entry point (type hvd_entry_fn): starts the runtime, sums (rank + 1) * [1, 2, 3, 4]
 * over all ranks, checks the result against the closed form, and leaves one line of text
 * describing this rank's result in out->data. Returns 0 on success, 1 with out->error set on
 * failure. */
int hvd_example_allreduce(const hvd_entry_ctx *ctx, hvd_entry_result *out);

#endif
