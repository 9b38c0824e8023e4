/* Runs an example's shared-object form the way hvd-exec does: dlopen the .so, look up the
 * entry symbol (type hvd_entry_fn, include/hvd/entry.h), call it with a context built from
 * Open MPI's environment, and check the result it hands back.
 *
 * Usage (under mpirun): test_entry_so LIB.so SYMBOL EXPECTED_SUBSTRING [ARG] */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/entry.h"
#include "testutil.h"

static int env_int(const char *name) {
    const char *s = getenv(name);
    return s ? atoi(s) : -1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIB.so SYMBOL EXPECTED [ARG]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(lib != NULL, "dlopen %s: %s", argv[1], dlerror());
    if (!lib) return test_finish();
    hvd_entry_fn fn;
    *(void **)&fn = dlsym(lib, argv[2]);
    CHECK_MSG(fn != NULL, "dlsym %s: %s", argv[2], dlerror());
    /* The runtime's own symbols stay inside the .so (linked with --exclude-libs). */
    CHECK(dlsym(lib, "hvd_init") == NULL);
    if (!fn) return test_finish();
    const char *arg = argc > 4 ? argv[4] : "";
    const char *gpus[] = {NULL};
    hvd_entry_ctx ctx = {.abi_version = HVD_ENTRY_ABI_VERSION,
                         .rank = env_int("OMPI_COMM_WORLD_RANK"),
                         .size = env_int("OMPI_COMM_WORLD_SIZE"),
                         .local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK"),
                         .local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE"),
                         .task_index = env_int("OMPI_COMM_WORLD_RANK"),
                         .arg = (const uint8_t *)arg,
                         .arg_len = strlen(arg),
                         .gpus = gpus,
                         .ngpus = 0};
    hvd_entry_result res;
    memset(&res, 0, sizeof res);
    int rc = fn(&ctx, &res);
    CHECK_MSG(rc == 0, "entry point returned %d: %s", rc, res.error);
    CHECK(res.data != NULL && res.len > 0);
    if (res.data) {
        char *text = strndup((const char *)res.data, res.len);
        fprintf(stderr, "rank %d result: %s", ctx.rank, text);
        CHECK_MSG(strstr(text, argv[3]) != NULL, "result lacks \"%s\"", argv[3]);
        free(text);
    }
    free(res.data);
    /* Not dlclosed: Open MPI, finalized inside, stays loaded until exit. */
    return test_finish();
}
