/* A program entry point for the end-to-end tests: writes where the rank ran into
 * $HVD_E2E_DIR/rank<R> and exits with status $HVD_E2E_FAIL_STATUS on rank $HVD_E2E_FAIL_RANK. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "probe.h"

int main(void) {
    const char *dir = getenv("HVD_E2E_DIR");
    const char *rank = getenv("HOROVOD_RANK");
    if (!dir || !rank) {
        fprintf(stderr, "probe_rank: HVD_E2E_DIR and HOROVOD_RANK must be set\n");
        return 2;
    }
    const char *fail = getenv("HVD_E2E_FAIL_RANK");
    if (fail && atoi(fail) == atoi(rank)) {
        fprintf(stderr, "probe_rank: rank %s fails on purpose\n", rank);
        return 5;
    }
    int depth;
    int anc = probe_task_ancestor(&depth);
    char path[512];
    snprintf(path, sizeof path, "%s/rank%s", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return 2;
    const char *g = getenv("HVD_GPUS"), *t = getenv("HVD_TASK_INDEX"),
               *h = getenv("HOROVOD_HOSTNAME"), *wd = getenv("HOROVOD_SPARK_WORK_DIR");
    char cwd[512];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    fprintf(f, "rank=%s task=%s gpus=%s host=%s ancestor_task=%d cwd=%s workdir=%s\n", rank,
            t ? t : "", g ? g : "", h ? h : "", anc, cwd, wd ? wd : "");
    fclose(f);
    printf("rank %s ran in task %d\n", rank, anc);
    return 0;
}
