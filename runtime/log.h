/* The runtime's log: one line per message on stderr, prefixed with the rank. */
#ifndef HVD_RUNTIME_LOG_H
#define HVD_RUNTIME_LOG_H

/* Prints "[hvd rank N] <message>" and a newline to stderr in one write, so lines of ranks that
 * share a terminal do not interleave. %m works (errno is kept for it). Any thread. */
void rt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The rank printed by rt_log (-1 until the background thread knows it). */
void rt_log_set_rank(int rank);

#endif
