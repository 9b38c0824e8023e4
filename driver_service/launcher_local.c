/* Local task services for `hvd-driver run --local H`: N hvd-task processes on this machine,
 * grouped into H fake hosts. Each fake host has its own host hash and its own TMPDIR, so the
 * orteds of different fake hosts never share session directories (shared/reference/
 * openmpi_rsh_agent.md section 7). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

/* A host hash for fake host k of this job: never resolvable, never containing '.' or ':'. */
static void fake_host_hash(char *out, size_t cap, int k) {
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++) {
        if (*p == '.') {
            *p = '\0';
            break;
        }
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-'))
            *p = '_';
    }
    snprintf(out, cap, "%s-hvdlocal%d-%d", host, (int)getpid(), k);
}

int local_tasks_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir, hvd_err *err) {
    int n = o->np, hosts = o->local_hosts;
    lt->pids = calloc((size_t)n, sizeof(pid_t));
    lt->n = 0;
    if (!lt->pids) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    char task_bin[PATH_MAX];
    snprintf(task_bin, sizeof task_bin, "%s/hvd-task", hvd_launch_bin_dir());
    if (access(task_bin, X_OK) != 0)
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "%s is missing: hvd-task must sit next to hvd-driver (or set "
                           "HVD_BIN_DIR)",
                           task_bin);
    /* Tasks per fake host: the first hosts get one more when N does not divide evenly. */
    int per = n / hosts, extra = n % hosts;
    int task = 0;
    for (int h = 0; h < hosts; h++) {
        char hash[128], tmp[400];
        fake_host_hash(hash, sizeof hash, h);
        snprintf(tmp, sizeof tmp, "%s/host%d", dir->path, h);
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return hvd_err_set(err, HVD_E_IO, "mkdir %s: %s", tmp, strerror(errno));
        for (int k = 0; k < per + (h < extra); k++, task++) {
            char work[420], index[16], start_timeout[16];
            snprintf(work, sizeof work, "%s/task%d", dir->path, task);
            if (mkdir(work, 0700) != 0 && errno != EEXIST)
                return hvd_err_set(err, HVD_E_IO, "mkdir %s: %s", work, strerror(errno));
            snprintf(index, sizeof index, "%d", task);
            snprintf(start_timeout, sizeof start_timeout, "%d", o->start_timeout_s);
            pid_t parent = getpid();
            pid_t pid = fork();
            if (pid < 0) return hvd_err_set(err, HVD_E_INTERNAL, "fork: %s", strerror(errno));
            if (pid == 0) {
                /* The task dies with the launcher even if the driver's connection lingers. */
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                if (getppid() != parent) _exit(1);
                setenv("HVD_HOST_HASH", hash, 1);
                setenv("TMPDIR", tmp, 1);

                if (chdir(work) != 0) _exit(1);
                const char *level = o->verbose ? "info" : "warn";
                /* The job is over when the driver shuts tasks down: no need to linger. */
                execl(task_bin, "hvd-task", "--index", index, "--start-timeout", start_timeout,
                      "--min-lifetime", "1", "--log-level", level, (char *)NULL);
                fprintf(stderr, "hvd-driver: cannot run %s: %s\n", task_bin, strerror(errno));
                _exit(127);
            }
            lt->pids[lt->n++] = pid;
        }
    }
    return 0;
}

void local_tasks_stop(local_tasks *lt, int grace_ms) {
    struct timespec tick = {0, 20 * 1000 * 1000};
    int left = lt->n;
    for (int waited = 0; left > 0; waited += 20) {
        left = 0;
        for (int i = 0; i < lt->n; i++) {
            if (lt->pids[i] <= 0) continue;
            if (waitpid(lt->pids[i], NULL, WNOHANG) == lt->pids[i])
                lt->pids[i] = 0;
            else
                left++;
        }
        if (left == 0) break;
        if (waited >= grace_ms) {
            for (int i = 0; i < lt->n; i++)
                if (lt->pids[i] > 0) kill(lt->pids[i], waited >= grace_ms * 2 ? SIGKILL : SIGTERM);
            if (waited >= grace_ms * 2 + 2000) break;
        }
        nanosleep(&tick, NULL);
    }
    for (int i = 0; i < lt->n; i++)
        if (lt->pids[i] > 0) {
            kill(lt->pids[i], SIGKILL);
            waitpid(lt->pids[i], NULL, 0);
        }
    free(lt->pids);
    lt->pids = NULL;
    lt->n = 0;
}
