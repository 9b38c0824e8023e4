/* One job's mpirun (include/hvd/launch.h): the command line of DESIGN.md section 2 step 4,
 * run through the process runner and waited for. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/proc.h"
#include "common/strv.h"
#include "hvd/launch.h"
#include "hvd/proto.h"
#include "launch_internal.h"

#define POLL_MS 50 /* how often the wait for mpirun looks at the stop flag */

const char *hvd_launch_bin_dir(void) {
    static char dir[PATH_MAX];
    if (dir[0]) return dir;
    const char *env = getenv(HVD_BIN_DIR_ENV);
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s", env);
        return dir;
    }
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
        snprintf(dir, sizeof dir, ".");
        return dir;
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    return dir;
}

static void mca(hvd_strb *a, const char *name, const char *value) {
    hvd_strb_add(a, "-mca");
    hvd_strb_add(a, name);
    hvd_strb_add(a, value);
}

/* The options that pin the job to the interfaces every pair of tasks shares. */
static void add_interfaces(hvd_strb *a, char *const *ifaces) {
    if (!ifaces || !ifaces[0]) return;
    char *list = hvd_strv_join((const char *const *)ifaces, ",");
    if (!list) {
        a->failed = true;
        return;
    }
    mca(a, "btl_tcp_if_include", list);
    mca(a, "oob_tcp_if_include", list);
    /* NCCL_SOCKET_IFNAME is a prefix list: '=' asks for exact names (eth1 not eth10). */
    hvd_strb_add(a, "-x");
    hvd_strb_addf(a, "NCCL_SOCKET_IFNAME==%s", list);
    free(list);
}

/* torch.distributed's rendezvous for the ranks: rank 0 runs for task 0, so MASTER_ADDR is task
 * 0's address on the first interface every pair of tasks shares (IPv4 first), and MASTER_PORT
 * the port task 0 found free on its host. Nothing when task 0 reported no port. */
static void add_master(hvd_strb *a, hvd_driver *d, char *const *ifaces) {
    hvd_task_info t0;
    int64_t first = hvd_driver_first_active(d); /* task 0, or an elastic launch's first */
    if (first < 0 || hvd_driver_task(d, (uint32_t)first, &t0, NULL) != 0) return;
    const hvd_addr *addrs = t0.addrs.v, *pick = NULL;
    for (size_t i = 0; i < t0.addrs.n; i++) {
        bool on_iface = !ifaces || !ifaces[0] || strcmp(addrs[i].ifname, ifaces[0]) == 0;
        if (on_iface && (!pick || (strchr(pick->host, ':') && !strchr(addrs[i].host, ':'))))
            pick = &addrs[i];
    }
    if (pick && t0.free_port) {
        hvd_strb_add(a, "-x");
        hvd_strb_addf(a, "MASTER_ADDR=%s", pick->host);
        hvd_strb_add(a, "-x");
        hvd_strb_addf(a, "MASTER_PORT=%u", t0.free_port);
    }
    hvd_msg_free(&hvd_task_info_desc, &t0);
}

char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err) {
    char *hosts = hvd_driver_host_list(d, err);
    if (!hosts) return NULL;
    const char *bin = cfg->bin_dir ? cfg->bin_dir : hvd_launch_bin_dir();
    const char *exec_bin = cfg->exec_bin_dir ? cfg->exec_bin_dir : bin;
    hvd_strb a = {0};
    hvd_strb_add(&a, "mpirun");
    if (geteuid() == 0) hvd_strb_add(&a, "--allow-run-as-root");
    hvd_strb_add(&a, "--tag-output");
    hvd_strb_add(&a, "-np");
    hvd_strb_addf(&a, "%d", cfg->np);
    hvd_strb_add(&a, "-H");
    hvd_strb_add(&a, hosts);
    hvd_strb_add(&a, "-bind-to");
    hvd_strb_add(&a, "none");
    hvd_strb_add(&a, "-map-by");
    hvd_strb_add(&a, "slot");
    /* Rank 0 reads no stdin: large stdin crashes remote orteds (openmpi_rsh_agent.md §9). */
    hvd_strb_add(&a, "--stdin");
    hvd_strb_add(&a, "none");
    /* Host hashes never resolve: without this mpirun sends a DNS query for each of them
     * (seen with strace: 4 queries for one host) to whatever resolver the machine has. */
    mca(&a, "if_base_do_not_resolve", "1");
    mca(&a, "pml", "ob1");
    mca(&a, "btl", "self,vader,tcp");
    hvd_strb_add(&a, "-mca");
    hvd_strb_add(&a, "plm_rsh_agent");
    hvd_strb_addf(&a, "%s/hvd-rsh", bin);
    add_interfaces(&a, ifaces);
    add_master(&a, d, ifaces);
    for (size_t i = 0; cfg->mpi_args && cfg->mpi_args[i]; i++)
        hvd_strb_add(&a, cfg->mpi_args[i]);
    hvd_strb_addf(&a, "%s/hvd-exec", exec_bin);
    free(hosts);
    char **argv = hvd_strb_finish(&a);
    if (!argv) hvd_err_set(err, HVD_E_INTERNAL, "out of memory building the mpirun command");
    return argv;
}

void hvd_launch_free_argv(char **argv) {
    hvd_strv_free(argv);
}

void launch_log(const hvd_launch_config *cfg, const char *fmt, ...) {
    if (!cfg->log) return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cfg->log(cfg->log_user, line);
}

static bool stop_requested(const hvd_launch_config *cfg) {
    return cfg->stop && __atomic_load_n(cfg->stop, __ATOMIC_ACQUIRE);
}

char **mpirun_env(hvd_driver *d, const hvd_launch_config *cfg, hvd_err *err) {
    char **job = hvd_driver_job_env(d, err);
    if (!job) return NULL;
    size_t nextra = hvd_strv_len(cfg->extra_env), njob = hvd_strv_len((const char *const *)job);
    hvd_env_change *ch = calloc(nextra + njob + 1, sizeof *ch);
    char **names = calloc(nextra + njob + 1, sizeof *names);
    char **envp = NULL;
    if (!ch || !names) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nextra + njob; i++) {
        const char *kv = i < nextra ? cfg->extra_env[i] : job[i - nextra];
        const char *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            hvd_err_set(err, HVD_E_INVALID, "mpirun's environment entry '%.40s' is not NAME=VALUE",
                        kv);
            goto out;
        }
        if (!(names[i] = strndup(kv, (size_t)(eq - kv)))) {
            hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
            goto out;
        }
        ch[i] = (hvd_env_change){names[i], eq + 1};
    }
    extern char **environ;
    envp = hvd_env_build(environ, ch, nextra + njob, err);
out:
    hvd_strv_free(names);
    free(ch);
    for (size_t i = 0; job[i]; i++) /* the secret: wipe before freeing */
        memset(job[i], 0, strlen(job[i]));
    hvd_strv_free(job);
    return envp;
}

/* Waits for mpirun, stopping it on timeout or *stop. */
static void wait_mpirun(hvd_proc *p, const hvd_launch_config *cfg, hvd_launch_outcome *out) {
    int64_t deadline = cfg->timeout_s > 0 ? hvd_now_ms() + (int64_t)cfg->timeout_s * 1000 : -1;
    int code = 255;
    for (;;) {
        int r = hvd_proc_wait(p, POLL_MS, &code);
        if (r <= 0) {
            if (r < 0) code = 255; /* reaped by someone else: cannot know */
            break;
        }
        if (!out->timed_out && !out->stopped && deadline >= 0 && hvd_now_ms() >= deadline) {
            out->timed_out = true;
            launch_log(cfg, "the job ran past its timeout of %d s; stopping mpirun",
                       cfg->timeout_s);
            hvd_proc_abort(p);
        }
        if (!out->timed_out && !out->stopped && stop_requested(cfg)) {
            out->stopped = true;
            hvd_proc_abort(p);
        }
    }
    out->status = code;
}

/* Runs argv (mpirun) and waits for it. Returns 0 with the outcome, or -1 with err. */
static int run_mpirun(hvd_driver *d, char **argv, const hvd_launch_config *cfg,
                      hvd_launch_outcome *out, hvd_err *err) {
    char **envp = mpirun_env(d, cfg, err);
    if (!envp) return -1;
    hvd_proc_spec spec = {.argv = argv,
                          .envp = envp,
                          .grace_ms = HVD_MPIRUN_KILL_DELAY_MS,
                          .pass_stdout = true,
                          .stdout_fd = cfg->output_fds ? cfg->output_fds[0] : 1,
                          .pass_stderr = true,
                          .stderr_fd = cfg->output_fds ? cfg->output_fds[1] : 2};
    hvd_proc *p = hvd_proc_start(&spec, err);
    hvd_env_free(envp);
    if (!p) return hvd_err_prefix(err, "cannot start mpirun (is Open MPI installed?): ");
    wait_mpirun(p, cfg, out);
    hvd_proc_free(p);
    return 0;
}

int hvd_launch_job(hvd_driver *d, const hvd_launch_config *cfg, hvd_launch_outcome *out,
                   hvd_err *err) {
    memset(out, 0, sizeof *out);
    int start_ms =
        cfg->start_timeout_ms > 0 ? cfg->start_timeout_ms : HVD_START_TIMEOUT_DEFAULT_S * 1000;
    char **ifaces = NULL, **argv = NULL;
    int rc = -1;
    if (hvd_driver_wait_registration(d, start_ms, err) != 0 ||
        hvd_driver_common_interfaces(d, start_ms, &ifaces, err) != 0)
        goto out;
    if (!(argv = hvd_launch_argv(d, cfg, ifaces, err))) goto out;
    if (cfg->log) {
        char *hosts = hvd_driver_host_list(d, NULL),
             *names = hvd_strv_join((const char *const *)ifaces, " ");
        launch_log(cfg, "hosts %s; interfaces %s", hosts ? hosts : "?", names ? names : "?");
        free(hosts);
        free(names);
        char *line = hvd_strv_join((const char *const *)argv, " ");
        launch_log(cfg, "running %s", line ? line : "mpirun");
        free(line);
    }
    if (stop_requested(cfg)) {
        hvd_err_set(err, HVD_E_STATE, "the job was stopped before mpirun started");
        goto out;
    }
    rc = run_mpirun(d, argv, cfg, out, err);
out:
    hvd_strv_free(ifaces);
    hvd_launch_free_argv(argv);
    return rc;
}
