/* Streaming line formatter: see output.h. */
#include "output.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static bool has_head(const hvd_output *o) {
    return o->opts.index >= 0 || o->opts.timestamp;
}

void hvd_output_init(hvd_output *o, const hvd_output_opts *opts) {
    memset(o, 0, sizeof *o);
    o->opts = *opts;
    o->at_line_start = true;
}

/* Builds the header for a line starting now. asctime() is not thread-safe and its text is
 * fixed English ("%.3s %.3s%3d %.2d:%.2d:%.2d %d"), so it is formatted here. */
static void build_head(hvd_output *o) {
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    size_t n = 0;
    if (o->opts.timestamp) {
        time_t t = o->opts.clock ? o->opts.clock() : time(NULL);
        struct tm tm;
        if (localtime_r(&t, &tm)) {
            int w = snprintf(o->head, sizeof o->head, "%.3s %.3s%3d %.2d:%.2d:%.2d %d",
                             days[(unsigned)tm.tm_wday % 7], months[(unsigned)tm.tm_mon % 12],
                             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, 1900 + tm.tm_year);
            if (w > 0) n = (size_t)w < sizeof o->head ? (size_t)w : sizeof o->head - 1;
        }
    }
    if (o->opts.index >= 0) {
        int w = snprintf(o->head + n, sizeof o->head - n, "[%d]<%s>:", o->opts.index,
                         o->opts.stream == HVD_OUTPUT_STDERR ? "stderr" : "stdout");
        if (w > 0) n += (size_t)w < sizeof o->head - n ? (size_t)w : sizeof o->head - n - 1;
    }
    o->head_len = n;
    o->head_pos = 0;
}

size_t hvd_output_format(hvd_output *o, const void *in_, size_t in_len, void *out_, size_t out_cap,
                         size_t *consumed) {
    const unsigned char *in = in_;
    unsigned char *out = out_;
    size_t i = 0, w = 0;
    bool head = has_head(o);
    while (i < in_len && w < out_cap) {
        if (head && o->at_line_start) {
            /* A header is written only once a byte of its line is here, so that end-of-file
             * after a line terminator does not leave a dangling prefix. */
            if (o->head_pos == o->head_len) build_head(o);
            size_t n = o->head_len - o->head_pos;
            if (n > out_cap - w) n = out_cap - w;
            memcpy(out + w, o->head + o->head_pos, n);
            w += n;
            o->head_pos += n;
            if (o->head_pos < o->head_len) break; /* out is full */
            o->at_line_start = false;
            continue;
        }
        size_t avail = in_len - i < out_cap - w ? in_len - i : out_cap - w;
        size_t n = 0;
        if (!head) {
            n = avail;
        } else {
            while (n < avail) {
                unsigned char ch = in[i + n++];
                if (ch == '\n' || ch == '\r') {
                    o->at_line_start = true;
                    break;
                }
            }
        }
        memcpy(out + w, in + i, n);
        w += n;
        i += n;
    }
    *consumed = i;
    return w;
}

size_t hvd_output_bound(const hvd_output *o, size_t in_len) {
    if (!has_head(o)) return in_len;
    size_t per_byte = 1 + HVD_OUTPUT_HEAD_MAX;
    if (in_len > (SIZE_MAX - HVD_OUTPUT_HEAD_MAX) / per_byte) return SIZE_MAX;
    /* + a header left pending by an earlier call whose out was full. */
    return in_len * per_byte + HVD_OUTPUT_HEAD_MAX;
}
