/* File system helpers (common/fs.h). hvd_empty_dir_at runs in forked children of
 * multithreaded processes (the process runner's keeper): system calls only there. */
#include "common/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_DEPTH  8  /* deeper trees are left (nothing we create nests that deep) */
#define MAX_PASSES 64 /* entries vanish and appear while we read: re-read, boundedly */

/* A getdents64 record. */
struct dirent64_rec {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

static int is_dot(const char *n) {
    return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

static void empty_dir(int dir, int depth) {
    _Alignas(8) char buf[4096];
    for (int pass = 0; pass < MAX_PASSES; pass++) {
        int removed = 0;
        long n;
        lseek(dir, 0, SEEK_SET);
        while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct dirent64_rec *e = (void *)(buf + off);
                off += e->reclen;
                if (is_dot(e->name)) continue;
                if (unlinkat(dir, e->name, 0) == 0) {
                    removed = 1;
                    continue;
                }
                if (depth >= MAX_DEPTH) continue;
                int sub = openat(dir, e->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sub < 0) continue;
                empty_dir(sub, depth + 1);
                close(sub);
                if (unlinkat(dir, e->name, AT_REMOVEDIR) == 0) removed = 1;
            }
        }
        if (!removed) return;
    }
}

void hvd_empty_dir_at(int dirfd) {
    empty_dir(dirfd, 0);
}

int hvd_remove_tree(const char *path) {
    int dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir < 0) {
        if (errno == ENOENT) return 0;
        return unlink(path) == 0 || errno == ENOENT ? 0 : -1; /* a file or a link */
    }
    empty_dir(dir, 0);
    close(dir);
    return rmdir(path) == 0 || errno == ENOENT ? 0 : -1;
}
