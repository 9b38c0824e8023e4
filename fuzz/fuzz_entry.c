/* libFuzzer target for the driver's entry-point check (driver_service/entry_check.c): any
 * bytes given as a shared-object entry point get a verdict, never a crash, a hang or a leak.
 * The input's first byte picks the symbol asked for; the rest is the object (the seeds are
 * small ELF shared objects). A refusal must say why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const symbols[] = {"train_fn", "train_var", "hidden_fn", "cxx_train", ""};
    if (size < 1) return 0;
    const char *symbol = symbols[data[0] % 5];
    hvd_bytes object = {(uint8_t *)data + 1, size - 1};
    hvd_err err = {0};
    if (drv_check_entry(&object, symbol, &err) != 0 && (!err.msg[0] || err.code == 0)) {
        fprintf(stderr, "fuzz_entry: a refusal without a reason\n");
        abort();
    }
    return 0;
}
