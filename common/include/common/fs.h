/* File system helpers. */
#ifndef HVD_COMMON_FS_H
#define HVD_COMMON_FS_H

/* Removes everything below the directory open as dirfd (up to 8 levels deep; links are
 * removed, never followed), using system calls only and a buffer per level on the stack, so
 * it may run in a forked child of a multithreaded process. Entries that cannot be removed
 * are left; entries created while it runs are picked up by another pass (at most 64). */
void hvd_empty_dir_at(int dirfd);

/* Removes path and everything below it (as hvd_empty_dir_at, then rmdir). A path that does
 * not exist is not an error. Returns 0, or -1 with errno if path is still there. */
int hvd_remove_tree(const char *path);

#endif
