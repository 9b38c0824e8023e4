/* A shared object for the driver's entry-point check (test_driver.c): one good entry point
 * and the near misses a user makes. */
int train_fn(const void *ctx, void *result);
int train_fn(const void *ctx, void *result) {
    (void)ctx;
    (void)result;
    return 0;
}

/* A variable, not a function. */
int train_var = 3;

/* Defined but not exported. */
__attribute__((visibility("hidden"))) int hidden_fn(void);
__attribute__((visibility("hidden"))) int hidden_fn(void) {
    return 1;
}

/* What a C++ compiler makes of `int cxx_train()` without extern "C". */
int _Z9cxx_trainv(void);
int _Z9cxx_trainv(void) {
    return 2;
}
