/* The runtime's log (log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

static _Atomic int g_log_rank = -1;

void rt_log_set_rank(int rank) {
    g_log_rank = rank;
}

void rt_log(const char *fmt, ...) {
    int saved = errno;
    char line[2048];
    int n = snprintf(line, sizeof line, "[hvd rank %d] ", g_log_rank);
    va_list ap;
    va_start(ap, fmt);
    errno = saved; /* for %m */
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line, so ranks' lines do not interleave */
}
