/* Linked into the runtime's MPI test programs in AddressSanitizer builds only.
 *
 * Open MPI 4.1 dlcloses its plugins (mca_*.so) in MPI_Finalize. What those plugins allocated
 * and kept is then reported by LeakSanitizer at exit as "<unknown module>", which can be
 * neither attributed nor suppressed, so real leaks of ours would drown in it. Making dlclose
 * a no-op for the test process keeps the plugins mapped, so lsan.supp can name them (Open MPI
 * 5 has mca_base_component_disable_dlclose for this; 4.1 does not). Nothing in the runtime
 * calls dlclose. */
#include <dlfcn.h>

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
