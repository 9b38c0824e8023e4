/* Horovod's output line format (safe_shell_exec.prefix_connection), as a streaming formatter.
 *
 * Every line gets an optional prefix "[index]<stdout>:" or "[index]<stderr>:", with an
 * optional asctime()-style local timestamp glued in front of it (no separator, as Horovod
 * does): "Mon Jan 20 12:00:01 2020[3]<stdout>:text\n". Both '\n' and '\r' end a line and are
 * kept after it. Bytes are passed through unchanged (NUL and invalid UTF-8 included).
 *
 * The formatter is a state machine with O(1) state ("are we at the start of a line?"): the
 * prefix is written when the first byte of a line arrives, with the time of that moment, and
 * the line's bytes stream through as they come, so a 1 MiB line costs no memory. A partial
 * last line has already been written, prefix included, when its bytes were fed: nothing has
 * to be flushed at end-of-file. With neither prefix nor timestamp it is a pass-through.
 *
 * Pure: no I/O, no allocation. One formatter per stream; not thread-safe. */
#ifndef HVD_TASK_OUTPUT_H
#define HVD_TASK_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

typedef enum hvd_output_stream {
    HVD_OUTPUT_STDOUT = 0, /* prefix names "stdout" */
    HVD_OUTPUT_STDERR = 1, /* prefix names "stderr" */
} hvd_output_stream;

/* Longest line header: a timestamp (24 chars for years 1000-9999, room for more) plus
 * "[-2147483648]<stdout>:". */
#define HVD_OUTPUT_HEAD_MAX 80

typedef struct hvd_output_opts {
    int index;                /* task index for the "[index]<stream>:" prefix; < 0: no prefix */
    hvd_output_stream stream; /* which stream name the prefix carries */
    bool timestamp;           /* glue the local time, asctime() style, before each line */
    time_t (*clock)(void);    /* source of the time for timestamps; NULL: time(NULL) */
} hvd_output_opts;

typedef struct hvd_output {
    hvd_output_opts opts;           /* as given to hvd_output_init */
    bool at_line_start;             /* the next content byte starts a new line */
    char head[HVD_OUTPUT_HEAD_MAX]; /* header (timestamp + prefix) of the current line */
    size_t head_len;                /* its length */
    size_t head_pos;                /* how much of it has been written; < head_len: pending */
} hvd_output;

/* Initializes a formatter at the start of a line. */
void hvd_output_init(hvd_output *o, const hvd_output_opts *opts);

/* Formats input bytes into out. Consumes as much of in[0..in_len) as fits, writes at most
 * out_cap bytes, stores the number of input bytes consumed in *consumed and returns the
 * number of bytes written. Call again with the rest of the input until all is consumed;
 * with out_cap > 0 and input left, every call makes progress. Never fails. */
size_t hvd_output_format(hvd_output *o, const void *in, size_t in_len, void *out, size_t out_cap,
                         size_t *consumed);

/* An out_cap that is always enough to consume in_len bytes in one call (every byte could
 * start a line); SIZE_MAX if that does not fit in a size_t. */
size_t hvd_output_bound(const hvd_output *o, size_t in_len);

#endif
