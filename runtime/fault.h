/* Test hook: makes chosen allocations of the runtime fail, so that tests can check the
 * out-of-memory paths, which no honest input reaches on a machine with memory to spare
 * (tests/runtime/test_oom.c). Off unless a test arms it; one relaxed atomic load per check. */
#ifndef HVD_RUNTIME_FAULT_H
#define HVD_RUNTIME_FAULT_H

#include <stdbool.h>

typedef enum rt_fault_site {
    RT_FAULT_SUBMIT = 0, /* building a submission (user thread): the call fails */
    RT_FAULT_CYCLE = 1,  /* the background thread's bookkeeping before the cycle's agreement */
    RT_FAULT_FUSION = 2, /* growing the host fusion buffer */
    RT_FAULT_OUTPUT = 3, /* the output of an allgather or alltoall */
    RT_FAULT_NUM_SITES = 4
} rt_fault_site;

/* Makes the next `times` checks of site fail (0 disarms it). Any thread. */
void rt_fault_arm(rt_fault_site site, int times);

/* True if the allocation at site must fail now (and counts it). */
bool rt_fault_hit(rt_fault_site site);

#endif
