/* Test hook for allocation failures (fault.h). */
#include "fault.h"

#include <stdatomic.h>

static atomic_int g_armed[RT_FAULT_NUM_SITES];

void rt_fault_arm(rt_fault_site site, int times) {
    atomic_store(&g_armed[site], times > 0 ? times : 0);
}

bool rt_fault_hit(rt_fault_site site) {
    if (atomic_load_explicit(&g_armed[site], memory_order_relaxed) == 0) return false;
    int n = atomic_load(&g_armed[site]);
    while (n > 0 && !atomic_compare_exchange_weak(&g_armed[site], &n, n - 1)) {
    }
    return n > 0;
}
