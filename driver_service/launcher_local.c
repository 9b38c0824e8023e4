/* Local task services for `hvd-driver run --local H`: N hvd-task processes on this machine,
 * grouped into H fake hosts. Each fake host has its own host hash and its own TMPDIR, so the
 * orteds of different fake hosts never share session directories (shared/reference/
 * openmpi_rsh_agent.md section 7), under Open MPI 5 it gets a hostname of its own, and its orted
 * does not put the hardware topology in a shared-memory segment at a hole of its address space
 * (rtc_hwloc_vmhole none): with many orteds on one machine that crashed one orted in about a
 * thousand (SIGSEGV in hwloc_shmem_topology_write), failing 2 of 8 jobs of 256 fake hosts. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/proc.h"
#include "common/strv.h"
#include "hvd/net.h"
#include "launcher.h"

extern char **environ;

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

/* Starts task `index` of fake host `host_hash`. Returns the process, or NULL with err. */
static hvd_proc *start_task(const launch_opts *o, const char *task_bin, int index,
                            const char *host_hash, const char *tmp, char *const *job_env,
                            hvd_err *err) {
    hvd_strb a = {0};
    hvd_strb_add(&a, task_bin);
    hvd_strb_add(&a, "--index");
    hvd_strb_addf(&a, "%d", index);
    hvd_strb_add(&a, "--start-timeout");
    hvd_strb_addf(&a, "%d", o->start_timeout_s);
    /* The job is over when the driver shuts tasks down: no need to linger. */
    hvd_strb_add(&a, "--min-lifetime");
    hvd_strb_add(&a, "1");
    hvd_strb_add(&a, "--log-level");
    hvd_strb_add(&a, o->verbose ? "info" : "warn");
    if (o->bind) {
        hvd_strb_add(&a, "--bind");
        hvd_strb_add(&a, o->bind);
    }
    if (o->many_commands) hvd_strb_add(&a, "--elastic");
    char **argv = hvd_strb_finish(&a);
    /* Open MPI 5's daemons tell hosts apart by gethostname(): fake hosts of one machine each
     * get a hostname of their own (docs/launcher.md, "Open MPI 5"), the host hash when it fits. */
    char uts[HOST_NAME_MAX + 1];
    const char *suffix = strstr(host_hash, "-hvdlocal");
    const char *name = strlen(host_hash) <= HOST_NAME_MAX || !suffix ? host_hash : suffix + 1;
    size_t len = strnlen(name, HOST_NAME_MAX);
    memcpy(uts, name, len);
    uts[len] = '\0';
    size_t nj = hvd_strv_len((const char *const *)job_env);
    hvd_env_change *ch = calloc(nj + 3, sizeof *ch);
    char **names = calloc(nj + 1, sizeof *names);
    char **envp = NULL, **base = hvd_env_without_mpi_singleton(environ);
    hvd_proc *p = NULL;
    if (!argv || !ch || !names || !base) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nj; i++) {
        const char *eq = strchr(job_env[i], '=');
        names[i] = strndup(job_env[i], (size_t)(eq - job_env[i]));
        ch[i] = (hvd_env_change){names[i], eq + 1};
    }
    ch[nj] = (hvd_env_change){HVD_HOST_HASH_ENV, host_hash};
    ch[nj + 1] = (hvd_env_change){"TMPDIR", tmp};
    ch[nj + 2] = (hvd_env_change){"OMPI_MCA_rtc_hwloc_vmhole", "none"};
    /* Their orted and ranks must not see a singleton MPI_Init of this process's caller. */
    if (!(envp = hvd_env_build(base, ch, nj + 3, err))) goto out;
    hvd_proc_spec spec = {.argv = argv,
                          .envp = envp,
                          .cwd = NULL, /* the caller's: its ranks run there, as horovodrun's */
                          .uts_hostname = o->fake_hostnames ? uts : NULL,
                          .grace_ms = HVD_TASK_STOP_GRACE_MS,
                          .pass_stdout = true,
                          .stdout_fd = STDOUT_FILENO,
                          .pass_stderr = true,
                          .stderr_fd = STDERR_FILENO};
    p = hvd_proc_start(&spec, err);
out:
    hvd_env_free(envp);
    free(base);
    hvd_strv_free(names);
    free(ch);
    hvd_strv_free(argv);
    return p;
}

/* hvd-task next to hvd-driver into out. Returns 0, or -1 with err. */
static int task_bin(char *out, size_t cap, hvd_err *err) {
    snprintf(out, cap, "%s/hvd-task", hvd_launch_bin_dir());
    if (access(out, X_OK) != 0)
        return hvd_err_set(err, HVD_E_NOT_FOUND,
                           "%s is missing: hvd-task must sit next to hvd-driver (or set "
                           "HVD_BIN_DIR)",
                           out);
    return 0;
}

/* Makes dir (mode 0700) unless it exists. Returns 0, or -1 with err. */
static int make_dir(const char *dir, hvd_err *err) {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return hvd_err_set(err, HVD_E_IO, "mkdir %s: %s", dir, strerror(errno));
    return 0;
}

int local_host_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir,
                     char *const *job_env, const char *host_hash, int first, int n, hvd_err *err) {
    char bin[PATH_MAX], tmp[400];
    if (task_bin(bin, sizeof bin, err) != 0) return -1;
    snprintf(tmp, sizeof tmp, "%s/host%d", dir->path, first); /* short: socket paths */
    if (make_dir(tmp, err) != 0) return -1;
    if (lt->n + n > lt->cap) {
        int cap = lt->cap ? lt->cap : 8;
        while (cap < lt->n + n)
            cap *= 2;
        hvd_proc **p = realloc(lt->procs, (size_t)cap * sizeof *p);
        if (!p) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        lt->procs = p;
        lt->cap = cap;
    }
    for (int task = first; task < first + n; task++) {
        hvd_proc *p = start_task(o, bin, task, host_hash, tmp, job_env, err);
        if (!p) return -1;
        lt->procs[lt->n++] = p;
    }
    return 0;
}

int local_tasks_start(local_tasks *lt, const launch_opts *o, const launch_dir *dir,
                      char *const *job_env, hvd_err *err) {
    int n = launch_task_slots(o), hosts = o->local_hosts;
    /* Tasks per fake host: the first hosts get one more when N does not divide evenly. */
    int per = n / hosts, extra = n % hosts;
    int task = 0;
    for (int h = 0; h < hosts; h++) {
        char hash[128];
        fake_host_hash(hash, sizeof hash, h);
        int k = per + (h < extra);
        if (local_host_start(lt, o, dir, job_env, hash, task, k, err) != 0) return -1;
        task += k;
    }
    return 0;
}

void local_tasks_stop(local_tasks *lt, int grace_ms) {
    int64_t deadline = hvd_now_ms() + grace_ms;
    for (int i = 0; i < lt->n; i++)
        hvd_proc_wait(lt->procs[i], hvd_ms_left(deadline), NULL);
    for (int i = 0; i < lt->n; i++) /* all at once: SIGTERM, SIGKILL after the grace period */
        hvd_proc_abort(lt->procs[i]);
    for (int i = 0; i < lt->n; i++)
        hvd_proc_free(lt->procs[i]);
    free(lt->procs);
    lt->procs = NULL;
    lt->n = lt->cap = 0;
}
