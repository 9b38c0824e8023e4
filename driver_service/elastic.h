/* Elastic launches (include/hvd/launch.h, hvd_launch_elastic), private to driver_service/:
 * the hosts as the elastic loop sees them, the discovery script and the choice of a launch's
 * tasks (elastic_hosts.c), and the loop itself (elastic_launch.c). */
#ifndef HVD_ELASTIC_INTERNAL_H
#define HVD_ELASTIC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvd/driver.h"
#include "hvd/launch.h"

/* A host hash the job has seen a task of. */
typedef struct el_host {
    char hash[HVD_HOST_HASH_MAX];
    uint64_t seen;          /* order of first appearance: older hosts get the lower ranks */
    int blacklists;         /* times it was blacklisted */
    int64_t cooldown_until; /* hvd_now_ms time it is blacklisted until; INT64_MAX: for good */
} el_host;

typedef struct el_hosts {
    el_host *v;
    size_t n, cap;
    uint64_t seq;           /* the last el_host.seen given */
    hvd_elastic_host *disc; /* the discovery script's last answer */
    size_t ndisc;
    bool script; /* a discovery script decides which hosts are usable */
    int cooldown_min_s, cooldown_max_s;
} el_hosts;

/* The tasks of a launch, in rank order: host by host (older hosts first), indices ascending
 * within a host. */
typedef struct el_plan {
    uint32_t *idx;
    size_t n;
    size_t usable; /* usable slots in all (n is at most max_np of them) */
} el_plan;

/* Runs the discovery script (/bin/sh -c, bounded by HVD_DISCOVERY_TIMEOUT_MS) and parses its
 * "host[:slots]" lines (a host without slots gets default_slots; blank lines are skipped).
 * Returns 0 with a malloc'd array, or -1 with err (the script failed, or a line is bad). */
int el_discover(const char *script, int default_slots, hvd_elastic_host **out, size_t *n,
                hvd_err *err);

/* Whether a task with host hash `hash` is on the host a discovery script calls `name`: the
 * same text; the name with every character outside [A-Za-z0-9_-] made '-' (hvd-driver --ssh
 * gives its tasks that); or name's first label followed by "-" and 32 hex digits. */
bool el_host_matches(const char *hash, const char *name);

/* The entry of a host hash, added (seen now) if new. NULL on out of memory. */
el_host *el_host_get(el_hosts *h, const char *hash);

/* Blacklists a host for its cool-down (now: hvd_now_ms). Returns the seconds it lasts, or -1
 * for the rest of the job. */
int el_blacklist(el_hosts *h, const char *hash, int64_t now);

/* Whether a host may run ranks now: not blacklisted, and listed by the script (if any). */
bool el_host_usable(el_hosts *h, const char *hash, int64_t now);

/* The launch the usable tasks of t[0..n) make: at most max_np (0: all) ranks. Registers the
 * hosts it has not seen. Returns 0, or -1 on out of memory. */
int el_plan_make(el_hosts *h, const hvd_task_brief *t, size_t n, int max_np, int64_t now,
                 el_plan *out);
/* Whether two plans hold the same tasks. */
bool el_plan_same(const el_plan *a, const el_plan *b);
void el_plan_free(el_plan *p);

/* "host:slots,..." of a plan's tasks (t: the task list it was made from). malloc'd. */
char *el_plan_hosts(const el_plan *p, const hvd_task_brief *t, size_t n);

void el_hosts_free(el_hosts *h);

#endif
