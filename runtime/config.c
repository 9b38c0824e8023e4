/* The runtime's knobs (config.h). */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses a non-negative number in [0, max] from the environment; *out = def if unset. On a
 * malformed value, keeps def, sets err (unless already set) and returns -1. */
static int env_double(const char *name, double def, double max, double *out, hvd_err *err) {
    const char *s = getenv(name);
    *out = def;
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0 || v > max) {
        if (err && err->code == 0)
            hvd_err_set(err, HVD_E_INVALID, "%s=%s is not a number between 0 and %g", name, s, max);
        return -1;
    }
    *out = v;
    return 0;
}

int rt_config_read(rt_config *c, hvd_err *err) {
    double cycle_ms, fusion, cache, stall, stall_shutdown, chase_ms;
    int rc = 0;
    rc |= env_double("HOROVOD_CYCLE_TIME", 1.0, 1e4, &cycle_ms, err);
    rc |= env_double("HOROVOD_FUSION_THRESHOLD", 128.0 * 1024 * 1024, 1ull << 40, &fusion, err);
    rc |= env_double("HOROVOD_CACHE_CAPACITY", 1024, 1 << 20, &cache, err);
    rc |= env_double("HOROVOD_STALL_CHECK_TIME_SECONDS", 60, 1e6, &stall, err);
    rc |= env_double("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0, 1e6, &stall_shutdown, err);
    rc |= env_double("HVD_CHASE_TIME_MS", RT_CHASE_MS_DEFAULT, 1e4, &chase_ms, err);
    const char *disable = getenv("HOROVOD_STALL_CHECK_DISABLE");
    if (disable && *disable && strcmp(disable, "0") != 0) stall = 0;
    c->cycle_ns = (int64_t)(cycle_ms * 1e6);
    c->fusion_threshold = (int64_t)fusion;
    c->cache_capacity = (int64_t)cache;
    c->stall_warn_ns = (int64_t)(stall * 1e9);
    c->stall_shutdown_ns = (int64_t)(stall_shutdown * 1e9);
    c->chase_ns = (int64_t)(chase_ms * 1e6);
    const char *tl = getenv("HOROVOD_TIMELINE");
    if (tl && strlen(tl) >= sizeof c->timeline_path) {
        if (err && err->code == 0)
            hvd_err_set(err, HVD_E_INVALID, "HOROVOD_TIMELINE is longer than %zu bytes",
                        sizeof c->timeline_path - 1);
        rc = -1;
        tl = NULL;
    }
    snprintf(c->timeline_path, sizeof c->timeline_path, "%s", tl ? tl : "");
    return rc ? -1 : 0;
}
