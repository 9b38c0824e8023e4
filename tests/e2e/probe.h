/* What a rank can find out about where it runs, for the end-to-end tests. */
#ifndef HVD_E2E_PROBE_H
#define HVD_E2E_PROBE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Walks this process's ancestors; returns the --index of the nearest hvd-task process, or -1
 * (and the number of ancestors seen in *depth). */
static inline int probe_task_ancestor(int *depth) {
    pid_t pid = getppid();
    *depth = 0;
    while (pid > 1 && *depth < 64) {
        char path[64], comm[64] = "", stat[512];
        (*depth)++;
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) return -1;
        if (!fgets(comm, sizeof comm, f)) comm[0] = '\0';
        fclose(f);
        comm[strcspn(comm, "\n")] = '\0';
        if (strcmp(comm, "hvd-task") == 0) {
            char args[4096];
            snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
            f = fopen(path, "r");
            if (!f) return -1;
            size_t n = fread(args, 1, sizeof args - 1, f);
            fclose(f);
            args[n] = '\0';
            for (size_t i = 0; i < n;) {
                size_t len = strlen(args + i);
                if (strcmp(args + i, "--index") == 0 && i + len + 1 < n)
                    return atoi(args + i + len + 1);
                i += len + 1;
            }
            return -1;
        }
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        f = fopen(path, "r");
        if (!f) return -1;
        size_t n = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[n] = '\0';
        char *close_paren = strrchr(stat, ')');
        if (!close_paren) return -1;
        int ppid = 0;
        if (sscanf(close_paren + 2, "%*c %d", &ppid) != 1) return -1;
        pid = ppid;
    }
    return -1;
}

#endif
