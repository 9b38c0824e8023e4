/* The stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS):
 * run by the coordinator over its table of names that some ranks have submitted. */
#ifndef HVD_RUNTIME_STALL_H
#define HVD_RUNTIME_STALL_H

#include <stddef.h>
#include <stdint.h>

#include "params.h"
#include "strmap.h"

/* What the coordinator knows about a name it has requests for (its table's values). */
typedef struct rt_table_entry {
    char *name;
    rt_params *params; /* size entries, valid where present[r] */
    uint8_t *present;  /* size entries */
    int nranks;        /* ranks present */
    uint8_t optype;    /* rt_optype of the first request */
    int64_t first_ns;  /* when the first request arrived */
} rt_table_entry;

typedef struct rt_stall {
    int64_t warn_ns;     /* report names waiting longer than this; 0 = never */
    int64_t shutdown_ns; /* fail names waiting longer than this; 0 = never */
    int64_t last_check_ns;
    int64_t last_warn_ns;
    uint64_t warnings; /* reports printed */
} rt_stall;

/* Checks the coordinator's table (name -> rt_table_entry*) at most once per warn period and
 * prints which ranks are missing which tensors. Names older than shutdown_ns are appended to
 * *expired (malloc'd array of borrowed entry pointers) for the caller to fail. Out of memory
 * only shortens the report or leaves expired names for the next check. */
void rt_stall_check(rt_stall *st, const rt_strmap *table, int size, int64_t now,
                    rt_table_entry ***expired, size_t *nexpired);

#endif
