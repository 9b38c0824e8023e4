/* Tests of the output line formatter (task_service/output.c): Horovod's prefix format, line
 * terminators, binary data, chunking, timestamps, and bounded state for very long lines. */
#include "output.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Formats in[0..n) as chunks of at most `chunk` input bytes into an out buffer of `cap`
 * bytes at a time; returns the whole output (malloc'd) and its length. */
static char *format_all(const hvd_output_opts *opts, const char *in, size_t n, size_t chunk,
                        size_t cap, size_t *out_len) {
    hvd_output o;
    hvd_output_init(&o, opts);
    size_t total_cap = hvd_output_bound(&o, n) + 1, len = 0;
    char *all = malloc(total_cap);
    char *buf = malloc(cap);
    for (size_t off = 0; off < n;) {
        size_t take = n - off < chunk ? n - off : chunk, used_total = 0;
        while (used_total < take) {
            size_t used = 0;
            size_t w =
                hvd_output_format(&o, in + off + used_total, take - used_total, buf, cap, &used);
            CHECK(w > 0 || used > 0); /* progress */
            if (w == 0 && used == 0) break;
            memcpy(all + len, buf, w);
            len += w;
            used_total += used;
        }
        off += take;
    }
    free(buf);
    *out_len = len;
    return all;
}

static void check_format(const hvd_output_opts *opts, const char *in, size_t n, const char *want,
                         size_t want_len) {
    static const size_t chunks[] = {1, 2, 3, 7, 64, 100000};
    static const size_t caps[] = {1, 2, 5, 13, 100000};
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        for (size_t j = 0; j < sizeof caps / sizeof *caps; j++) {
            size_t len;
            char *got = format_all(opts, in, n, chunks[i], caps[j], &len);
            CHECK_MSG(len == want_len && memcmp(got, want, len) == 0,
                      "chunk %zu cap %zu: got %zu bytes '%.*s', want %zu '%s'", chunks[i], caps[j],
                      len, (int)len, got, want_len, want);
            free(got);
        }
    }
}

#define S(lit) lit, sizeof(lit) - 1

static void test_passthrough(void) {
    hvd_output_opts opts = {.index = -1};
    check_format(&opts, S("a\nb\rc\0d\xff"), S("a\nb\rc\0d\xff"));
    check_format(&opts, S(""), S(""));
    hvd_output o;
    hvd_output_init(&o, &opts);
    CHECK(hvd_output_bound(&o, 12345) == 12345);
}

static void test_prefix(void) {
    hvd_output_opts out = {.index = 3, .stream = HVD_OUTPUT_STDOUT};
    check_format(&out, S("a\nb\rc"), S("[3]<stdout>:a\n[3]<stdout>:b\r[3]<stdout>:c"));
    /* Partial last line: written with its prefix, nothing added. */
    check_format(&out, S("abc"), S("[3]<stdout>:abc"));
    /* No dangling prefix after a final terminator; empty lines get one. */
    check_format(&out, S("x\n\n"), S("[3]<stdout>:x\n[3]<stdout>:\n"));
    /* "\r\n" is two line ends, as in Horovod's split on ([\r\n]). */
    check_format(&out, S("x\r\ny"), S("[3]<stdout>:x\r[3]<stdout>:\n[3]<stdout>:y"));
    check_format(&out, S(""), S(""));
    hvd_output_opts err = {.index = 12, .stream = HVD_OUTPUT_STDERR};
    check_format(&err, S("oops\n"), S("[12]<stderr>:oops\n"));
    /* Binary-safe: NUL and invalid UTF-8 pass through. */
    hvd_output_opts zero = {.index = 0, .stream = HVD_OUTPUT_STDOUT};
    check_format(&zero, S("a\0b\x01\xff\n\0"), S("[0]<stdout>:a\0b\x01\xff\n[0]<stdout>:\0"));
}

static time_t fixed_clock(void) {
    return 1579521601; /* Mon Jan 20 12:00:01 2020 UTC */
}

static time_t fixed_clock_single_digit_day(void) {
    return 1614928089; /* Fri Mar  5 07:08:09 2021 UTC */
}

static time_t clock_value;

static time_t variable_clock(void) {
    return clock_value;
}

static void test_timestamp(void) {
    setenv("TZ", "UTC", 1);
    tzset();
    hvd_output_opts ts = {
        .index = 3, .stream = HVD_OUTPUT_STDOUT, .timestamp = true, .clock = fixed_clock};
    check_format(&ts, S("line\nnext"),
                 S("Mon Jan 20 12:00:01 2020[3]<stdout>:line\n"
                   "Mon Jan 20 12:00:01 2020[3]<stdout>:next"));
    ts.clock = fixed_clock_single_digit_day;
    check_format(&ts, S("x\n"), S("Fri Mar  5 07:08:09 2021[3]<stdout>:x\n"));
    /* Timestamp without an index: glued straight onto the line. */
    hvd_output_opts only_ts = {.index = -1, .timestamp = true, .clock = fixed_clock};
    check_format(&only_ts, S("a\rb"), S("Mon Jan 20 12:00:01 2020a\rMon Jan 20 12:00:01 2020b"));

    /* Same text as the C library's asctime() for a spread of times. */
    time_t times[] = {0, 951782400 /* leap day 2000 */, 1579521601, 1614928089, time(NULL)};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++) {
        struct tm tm;
        char want[64];
        localtime_r(&times[i], &tm);
        asctime_r(&tm, want);
        want[strcspn(want, "\n")] = '\0';
        strcat(want, "z");
        clock_value = times[i];
        hvd_output_opts opts = {.index = -1, .timestamp = true, .clock = variable_clock};
        check_format(&opts, S("z"), want, strlen(want));
    }
}

/* A 1 MiB line streams through a formatter of fixed size with small buffers. */
static void test_long_line(void) {
    size_t n = 1 << 20;
    char *in = malloc(n + 1);
    memset(in, 'x', n);
    in[n] = '\n';
    hvd_output o;
    hvd_output_opts opts = {.index = 7, .stream = HVD_OUTPUT_STDERR};
    hvd_output_init(&o, &opts);
    const char *prefix = "[7]<stderr>:";
    size_t plen = strlen(prefix), pos = 0, mismatches = 0;
    char buf[4096];
    for (size_t off = 0; off < n + 1;) {
        size_t take = n + 1 - off < 65536 ? n + 1 - off : 65536, done = 0;
        while (done < take) {
            size_t used;
            size_t w = hvd_output_format(&o, in + off + done, take - done, buf, sizeof buf, &used);
            for (size_t k = 0; k < w; k++, pos++) {
                char want = pos < plen ? prefix[pos] : pos == plen + n ? '\n' : 'x';
                if (buf[k] != want) mismatches++;
            }
            done += used;
        }
        off += take;
    }
    CHECK(pos == plen + n + 1);
    CHECK(mismatches == 0);
    CHECK(sizeof(hvd_output) <= 256); /* O(1) state: the line is never held */
    free(in);
}

/* hvd_output_bound is enough for the worst case: every byte a line terminator. */
static void test_bound(void) {
    hvd_output_opts opts = {.index = 123456, .stream = HVD_OUTPUT_STDOUT, .timestamp = true};
    hvd_output o;
    hvd_output_init(&o, &opts);
    char in[100];
    memset(in, '\r', sizeof in);
    size_t cap = hvd_output_bound(&o, sizeof in);
    char *out = malloc(cap);
    size_t used;
    size_t w = hvd_output_format(&o, in, sizeof in, out, cap, &used);
    CHECK(used == sizeof in);
    CHECK(w <= cap);
    CHECK(w > sizeof in * strlen("[123456]<stdout>:"));
    free(out);
    CHECK(hvd_output_bound(&o, (size_t)-1 / 2) == (size_t)-1);
}

int main(void) {
    RUN(test_passthrough);
    RUN(test_prefix);
    RUN(test_timestamp);
    RUN(test_long_line);
    RUN(test_bound);
    return test_finish();
}
