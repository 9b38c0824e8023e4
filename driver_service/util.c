/* Small helpers of libhvd_driver: log lines, deep copies of messages, index ranges, waits. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_internal.h"

void drv_log(hvd_driver *d, const char *fmt, ...) {
    if (!d->log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    d->log(d->log_user, line);
}

int drv_msg_clone(const hvd_msg_desc *desc, const void *src, void *dst) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = -1;
    if (hvd_msg_pack(&pk, desc, src) == 0) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        if (msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
            rc = hvd_msg_unpack(&u.data, desc, dst, NULL);
        msgpack_unpacked_destroy(&u);
    }
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

void drv_format_ranges(const uint32_t *v, size_t n, char *buf, size_t len) {
    static const char more[] = ",...";
    size_t used = 0;
    if (len == 0) return;
    buf[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        char item[32];
        int k;
        if (j == i)
            k = snprintf(item, sizeof item, "%s%u", i ? "," : "", v[i]);
        else
            k = snprintf(item, sizeof item, "%s%u-%u", i ? "," : "", v[i], v[j]);
        /* Keep room for ",..." unless this is the last item. */
        size_t need = (size_t)k + (j + 1 < n ? sizeof more - 1 : 0);
        if (used + need + 1 > len) {
            const char *m = used ? more : more + 1; /* no leading comma */
            if (used + strlen(m) + 1 <= len) memcpy(buf + used, m, strlen(m) + 1);
            return;
        }
        memcpy(buf + used, item, (size_t)k + 1);
        used += (size_t)k;
        i = j + 1;
    }
}

bool drv_cond_wait(hvd_driver *d, int64_t deadline_ms) {
    if (deadline_ms < 0) {
        pthread_cond_wait(&d->cv, &d->mu);
        return true;
    }
    if (hvd_now_ms() >= deadline_ms) return false;
    struct timespec ts = {.tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000};
    int rc = pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    return rc != ETIMEDOUT || hvd_now_ms() < deadline_ms;
}
