/* hvd-driver: runs an mpirun job inside task services (DESIGN.md section 2): the job's
 * private directory, the entry point, and the run and serve flows. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/proc.h"
#include "common/sig.h"
#include "common/strv.h"
#include "hvd/proto.h"
#include "launcher.h"

/* Reads a whole file into a malloc'd buffer. Returns 0, or -1 after printing why. */
static int read_file(const char *path, const char *what, hvd_bytes *out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hvd-driver: cannot read %s %s: %s\n", what, path, strerror(errno));
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    out->len = len > 0 ? (size_t)len : 0;
    out->data = malloc(out->len ? out->len : 1);
    if (!out->data || fread(out->data, 1, out->len, f) != out->len) {
        fprintf(stderr, "hvd-driver: cannot read %s %s\n", what, path);
        free(out->data);
        out->data = NULL;
        fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

/* Reads the entry point into the message the driver hands to ranks. */
static int load_code(const launch_opts *o, hvd_code_msg *code) {
    memset(code, 0, sizeof *code);
    if (o->command) {
        code->kind = o->payload ? HVD_CODE_ARGV_IO : HVD_CODE_ARGV;
        code->argv.v = o->command;
        code->argv.n = hvd_strv_len((const char *const *)o->command);
        return o->payload ? read_file(o->payload, "the payload", &code->object) : 0;
    }
    const char *colon = strrchr(o->entry, ':');
    if (!colon || colon == o->entry || !colon[1]) {
        fprintf(stderr, "hvd-driver: --entry must be LIB.so:SYMBOL, got '%s'\n", o->entry);
        return -1;
    }
    char *path = strndup(o->entry, (size_t)(colon - o->entry));
    int rc = read_file(path, "the entry point", &code->object);
    free(path);
    if (rc != 0) return -1;
    code->kind = HVD_CODE_SHARED_OBJECT;
    code->symbol = (char *)(colon + 1);
    code->arg.data = (uint8_t *)(o->entry_arg ? o->entry_arg : "");
    code->arg.len = o->entry_arg ? strlen(o->entry_arg) : 0;
    return 0;
}

/* Progress lines with --verbose; warnings always. */
static void log_line(void *user, const char *line) {
    const launch_opts *o = user;
    if (o->verbose || strncmp(line, "warning:", 8) == 0) fprintf(stderr, "hvd-driver: %s\n", line);
}

void launcher_log(void *user, const char *line) {
    log_line(user, line);
}

/* ---- the private directory ---------------------------------------------------------------- */

/* Starts a small process that removes the private directory (with the secret file) when
 * hvd-driver ends, however it ends, SIGKILL included: it waits for end-of-file on a pipe
 * whose only write end hvd-driver holds. Only async-signal-safe calls after fork (a thread
 * is running). */
static void start_cleaner(const char *dir) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction ign = {.sa_handler = SIG_IGN};
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGTERM, &ign, NULL);
        sigaction(SIGHUP, &ign, NULL);
        close(p[1]);
        char c;
        while (read(p[0], &c, 1) < 0 && errno == EINTR) {
        }
        hvd_remove_tree(dir);
        _exit(0);
    }
    close(p[0]);
    if (pid < 0) close(p[1]); /* the write end stays open (leaked on purpose) until exit */
}

/* Creates the private directory and its cleaner. Returns 0, or -1 after printing why. */
static int dir_create(launch_dir *dir) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir->path, sizeof dir->path, "%s/hvd-driver.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir->path)) {
        fprintf(stderr, "hvd-driver: cannot create a private directory: %s\n", strerror(errno));
        return -1;
    }
    start_cleaner(dir->path);
    snprintf(dir->secret_file, sizeof dir->secret_file, "%s/secret", dir->path);
    return 0;
}

/* Prints why the job did not get to run. Tasks missing at the start timeout on ssh hosts:
 * the line also names the hosts whose ssh session had not started its tasks, so that the
 * host is named whichever timer fires first (the driver's, or the session's own). */
static void print_start_error(const hvd_err *err, ssh_tasks *ssh) {
    char hosts[512];
    if (err->code == HVD_E_TIMEOUT && ssh_tasks_starting(ssh, hosts, sizeof hosts) > 0)
        fprintf(stderr, "hvd-driver: %s; the ssh sessions of %s had not started their tasks\n",
                err->msg, hosts);
    else
        fprintf(stderr, "hvd-driver: %s\n", err->msg);
}

/* ---- serve ------------------------------------------------------------------------------- */

/* `export NAME='VALUE'`, the value quoted for the shell. */
static void export_var(FILE *f, const char *name, const char *value) {
    fprintf(f, "export %s='", name);
    for (const char *p = value ? value : ""; *p; p++)
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    fputs("'\n", f);
}

/* export_var of words joined with spaces (options whose words hold no space: the shell's word
 * splitting of $NAME gives them back). */
static void export_words(FILE *f, const char *name, char *const *words) {
    char *joined = hvd_strv_join((const char *const *)words, " ");
    export_var(f, name, joined ? joined : "");
    free(joined);
}

/* The env file: everything a command typed by hand needs, in the dialect of the MPI of
 * parts (docs/launcher.md, "Doing the mpirun part by hand"). */
static int write_env_file(const launch_opts *o, const launch_dir *dir, const char *addrs,
                          const char *hosts, char *const *ifaces, const hvd_launch_parts *parts) {
    FILE *f = fopen(o->env_file, "w");
    if (!f) return -1;
    char *iface_list = hvd_strv_join((const char *const *)ifaces, ",");
    char rsh[PATH_MAX + 16], exec[PATH_MAX + 16], np[16];
    snprintf(rsh, sizeof rsh, "%s/hvd-rsh", hvd_launch_bin_dir());
    snprintf(exec, sizeof exec, "%s/hvd-exec",
             o->ssh_bin_dir ? o->ssh_bin_dir : hvd_launch_bin_dir());
    snprintf(np, sizeof np, "%d", o->np);
    fprintf(f, "# written by hvd-driver serve (pid %d) for %s%s%s%s; source it before mpirun\n",
            (int)getpid(), hvd_mpi_impl_name(parts->mpi), parts->version[0] ? " (" : "",
            parts->version, parts->version[0] ? ")" : "");
    export_var(f, "HVD_DRIVER_ADDRS", addrs);
    export_var(f, "HVD_SECRET_FILE", dir->secret_file);
    export_var(f, "HVD_MPI", hvd_mpi_impl_name(parts->mpi));
    export_var(f, "HVD_MPIRUN", o->mpirun ? o->mpirun : "mpirun");
    export_var(f, "HVD_HOSTS_OPT", parts->mpi == HVD_MPI_MPICH ? "-hosts" : "-H");
    export_var(f, "HVD_HOSTS", hosts);
    export_var(f, "HVD_IFACES", iface_list);
    export_var(f, "HVD_RSH", rsh);
    export_var(f, "HVD_EXEC", exec);
    export_var(f, "HVD_NP", np);
    /* What every hvd-bridge job wants (no name resolution, no stdin, ...), the agent, and
     * the interface options, in this MPI's words. */
    export_words(f, "HVD_MPIRUN_ARGS", parts->args);
    export_words(f, "HVD_AGENT_ARGS", parts->agent);
    export_words(f, "HVD_IFACE_ARGS", parts->ifaces);
    for (size_t i = 0; parts->env && parts->env[i]; i++) { /* the launcher's own variables */
        const char *eq = strchr(parts->env[i], '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - parts->env[i]), parts->env[i]);
        export_var(f, name, eq + 1);
    }
    free(iface_list);
    return fclose(f);
}

/* serve: waits until every rank reported, or the job is stopped. */
static void wait_for_results(hvd_driver *d, int np) {
    struct timespec tick = {0, 100 * 1000 * 1000};
    while (!__atomic_load_n(watch_stop_flag(), __ATOMIC_SEQ_CST)) {
        hvd_rank_result *r;
        size_t n;
        hvd_err err;
        int got = 0;
        if (hvd_driver_results(d, &r, &n, &err) == 0) {
            for (size_t i = 0; i < n; i++)
                got += r[i].present;
            hvd_driver_results_free(r, n);
        }
        if (got == np) return;
        nanosleep(&tick, NULL);
    }
}

/* serve: waits until every task is in (registered, and the interfaces probed), then writes
 * the env file. Returns 0, or -1 after saying why. */
static int tasks_in(hvd_driver *d, const launch_opts *o, const launch_dir *dir, const char *addrs,
                    ssh_tasks *ssh) {
    hvd_err err;
    char **ifaces = NULL, *hosts = NULL;
    hvd_launch_config lc = {
        .np = o->np, .mpi = o->mpi, .mpirun = o->mpirun, .rank_env = o->rank_env};
    hvd_launch_parts parts = {0};
    int rc = -1;
    if (hvd_driver_wait_registration(d, o->start_timeout_s * 1000, &err) != 0 ||
        hvd_driver_common_interfaces(d, o->start_timeout_s * 1000, &ifaces, &err) != 0 ||
        !(hosts = hvd_driver_host_list(d, &err)) ||
        hvd_launch_parts_make(d, &lc, ifaces, &parts, &err) != 0) {
        print_start_error(&err, ssh);
    } else if (write_env_file(o, dir, addrs, hosts, ifaces, &parts) != 0) {
        fprintf(stderr, "hvd-driver: cannot write %s: %s\n", o->env_file, strerror(errno));
    } else {
        rc = 0;
    }
    hvd_launch_parts_free(&parts);
    hvd_strv_free(ifaces);
    free(hosts);
    return rc;
}

/* serve: readies the driver for job `job`. Task services started without --elastic ran their
 * one command and were let go: new ones must register at their indices first. Returns 0, or
 * the exit status after saying why. */
static int next_job(hvd_driver *d, const launch_opts *o, const launch_dir *dir, const char *addrs,
                    ssh_tasks *ssh, int job) {
    hvd_err err;
    if (hvd_driver_next_job(d, &err) != 0) {
        fprintf(stderr, "hvd-driver: cannot ready job %d: %s\n", job, err.msg);
        return 1;
    }
    uint32_t in = hvd_driver_registered(d);
    if (in < (uint32_t)o->np) {
        fprintf(stderr,
                "hvd-driver: %u of %d task services ran their one command (no --elastic) and "
                "were let go: waiting for new ones to register for job %d\n",
                o->np - in, o->np, job);
        if (tasks_in(d, o, dir, addrs, ssh) != 0) return 1;
    }
    fprintf(stderr, "hvd-driver: ready for job %d: run mpirun with %s again\n", job, o->env_file);
    return 0;
}

/* serve: each job's results, one job after another (--jobs). Returns the first failed job's
 * exit status, or 0. */
static int serve_jobs(hvd_driver *d, const launch_opts *o, const launch_dir *dir, const char *addrs,
                      ssh_tasks *ssh) {
    int rc = 0;
    for (int job = 1; o->jobs == 0 || job <= o->jobs; job++) {
        wait_for_results(d, o->np);
        bool last = (o->jobs != 0 && job == o->jobs) ||
                    __atomic_load_n(watch_stop_flag(), __ATOMIC_SEQ_CST);
        if (last) watch_ignore_lost(); /* the tasks are shut down next */
        char why[512];
        watch_stop_reason(why, sizeof why);
        job_end_info end = {.mpirun = NULL, .stopped = why};
        if (o->jobs != 1) fprintf(stderr, "hvd-driver: job %d:\n", job);
        int jrc = report_results(d, o, &end);
        if (rc == 0) rc = jrc;
        if (last) break;
        int nrc = next_job(d, o, dir, addrs, ssh, job + 1);
        if (nrc != 0) return rc ? rc : nrc;
    }
    return rc;
}

/* serve: the tasks are in; writes the env file and waits for the ranks. */
static int serve(hvd_driver *d, const launch_opts *o, const launch_dir *dir, const char *addrs,
                 ssh_tasks *ssh) {
    if (tasks_in(d, o, dir, addrs, ssh) != 0) return 1;
    fprintf(stderr, "hvd-driver: all %d tasks are in; wrote %s. Now run mpirun with it.\n", o->np,
            o->env_file);
    return serve_jobs(d, o, dir, addrs, ssh);
}

/* ---- run --------------------------------------------------------------------------------- */

static int run(hvd_driver *d, const launch_opts *o, local_tasks *lt, ssh_tasks *ssh) {
    const char *exec_dir = o->ssh_bin_dir; /* hvd-exec on the hosts; NULL: ours */
    hvd_launch_config lc = {.np = o->np,
                            .mpi = o->mpi,
                            .mpirun = o->mpirun,
                            .exec_bin_dir = exec_dir,
                            .mpi_args = o->mpi_args,
                            .rank_env = o->rank_env,
                            .forward_env = o->ssh_hosts != NULL, /* local tasks inherit it */
                            .output_dir = o->output_arg,
                            .timeout_s = o->timeout_s,
                            .start_timeout_ms = o->start_timeout_s * 1000,
                            .stop = watch_stop_flag(),
                            .log = log_line,
                            .log_user = (void *)o};
    hvd_launch_outcome out;
    hvd_err err;
    int rc = hvd_launch_job(d, &lc, &out, &err);
    watch_ignore_lost(); /* from here on, task services end because the job did */
    if (rc != 0) {
        print_start_error(&err, ssh);
        return 1;
    }
    char why[512];
    job_stop_reason(o, &out, why, sizeof why);
    /* Local task services end first: a line of theirs (a command the stop left ending) must
     * not come after the job's last line. The watcher, which polls them, ends before. */
    watch_end();
    hvd_driver_shutdown_tasks(d);
    local_tasks_stop(lt, HVD_TASK_STOP_GRACE_MS);
    job_end_info end = {.mpirun = &out, .stopped = why};
    return report_results(d, o, &end);
}

/* ---- the job ------------------------------------------------------------------------------ */

/* Everything one job holds, for the cleanup. */
typedef struct job {
    launch_opts o;
    hvd_code_msg code;
    launch_dir dir;
    hvd_driver *d;
    char **job_env; /* HVD_SECRET=..., HVD_DRIVER_ADDRS=... */
    char *addrs;    /* the driver's addresses, text form */
    char **nics;
    local_tasks lt;
    ssh_tasks *ssh;
} job;

/* Creates the secret (file and driver config) and starts the driver service. */
static int start_driver(job *j) {
    hvd_err err;
    hvd_secret secret;
    if (hvd_secret_generate(&secret, &err) != 0 ||
        hvd_secret_write_file(&secret, j->dir.secret_file, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        return -1;
    }
    j->nics = j->o.nics ? hvd_strv_split(j->o.nics, ',') : NULL;
    /* Room for a connection per task and per rank (the library warns if there is none). */
    hvd_nofile_ensure((long)launch_task_slots(&j->o) * HVD_DRIVER_FDS_PER_TASK +
                      HVD_DRIVER_FDS_BASE);
    hvd_driver_config cfg = {.num_tasks = (uint32_t)launch_task_slots(&j->o),
                             .secret = secret,
                             .code = &j->code,
                             .nics = (const char *const *)j->nics,
                             .bind_host = j->o.bind,
                             .log = log_line,
                             .log_user = &j->o,
                             .net_timeout_ms = j->o.net_timeout_s * 1000};
    j->d = hvd_driver_start(&cfg, &err);
    hvd_secret_wipe(&secret);
    hvd_secret_wipe(&cfg.secret);
    if (!j->d) {
        fprintf(stderr, "hvd-driver: cannot start the driver service: %s\n", err.msg);
        return -1;
    }
    watch_set_driver(j->d);
    hvd_addr *addrs;
    size_t n;
    if (hvd_driver_addrs(j->d, &addrs, &n, &err) != 0 ||
        !(j->job_env = hvd_driver_job_env(j->d, &err))) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        return -1;
    }
    j->addrs = hvd_addrs_format(addrs, n);
    free(addrs);
    return j->addrs ? 0 : -1;
}

/* The MPI of the launcher `run` will start, before any task service starts: asked (auto), or
 * the one named checked against it, so that a launcher that is missing or another MPI's is
 * said at once, not after the executors registered. Returns 0, or -1 after printing why. */
static int run_mpi(launch_opts *o) {
    hvd_err err;
    char version[64];
    if (o->mpi != HVD_MPI_AUTO) {
        if (hvd_mpi_check_named(o->mpi, o->mpirun, &err) == 0) return 0;
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        return -1;
    }
    if (hvd_mpi_detect(o->mpirun, &o->mpi, version, sizeof version, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        return -1;
    }
    if (o->verbose)
        fprintf(stderr, "hvd-driver: %s says it is %s\n", o->mpirun ? o->mpirun : "mpirun",
                version);
    return 0;
}

/* --local under Open MPI 5: several fake hosts need a hostname each (a UTS namespace per fake
 * host, root only). Returns 0, or -1 after printing why. */
static int local_mpi(launch_opts *o) {
    if (o->mpi != HVD_MPI_OPENMPI5 || o->local_hosts < 2) return 0;
    if (geteuid() != 0) {
        fprintf(stderr,
                "hvd-driver: --local %d under Open MPI 5 needs root: PRRTE tells hosts apart by "
                "gethostname(), so each fake host needs a hostname of its own (a UTS namespace, "
                "which needs CAP_SYS_ADMIN); without it jobs compute wrong results or hang. Use "
                "--local 1, or run as root\n",
                o->local_hosts);
        return -1;
    }
    o->fake_hostnames = true;
    return 0;
}

/* A Python command that writes unbuffered (PYTHONUNBUFFERED, python -u) writes each print
 * argument and its newline apart, and the launcher tags each piece: said once, with the cure
 * (docs/launcher.md). Not for --payload commands (hvd_bridge.run's ranks write whole lines). */
static void warn_unbuffered_python(const launch_opts *o) {
    if (!o->command || o->payload) return;
    const char *slash = strrchr(o->command[0], '/');
    const char *name = slash ? slash + 1 : o->command[0];
    const char *unbuffered = getenv("PYTHONUNBUFFERED"), *opt = o->command[1] ? o->command[1] : "";
    bool dash_u = strcmp(opt, "-u") == 0,
         env_u = unbuffered && *unbuffered && strcmp(opt, "-E") != 0 && strcmp(opt, "-I") != 0;
    if (strncmp(name, "python", 6) != 0 || (!env_u && !dash_u)) return;
    fprintf(stderr,
            "hvd-driver: warning: %s writes unbuffered, so a rank's line may come out in tagged "
            "pieces; run it buffered (%s) or write each line in one call\n",
            dash_u ? "python -u" : "PYTHONUNBUFFERED is set: python",
            dash_u ? "without -u" : "env -u PYTHONUNBUFFERED hvd-driver ...");
}

/* Starts the task services (local, over ssh), or says how to start them. */
static int start_tasks(job *j) {
    hvd_err err;
    warn_unbuffered_python(&j->o);
    if (!j->o.serve && (run_mpi(&j->o) != 0 || horovodrun_timestamps(&j->o) != 0))
        return -1; /* serve: the user runs the launcher */
    if (j->o.local_hosts > 0 && local_mpi(&j->o) != 0) return -1;
    if (j->o.local_hosts > 0 && j->o.discovery_script) {
        /* elastic_run starts the hosts the discovery script names */
    } else if (j->o.ssh_discovered) { /* and elastic_run their sessions */
        if (!(j->ssh = ssh_tasks_open(&j->o, j->d, j->job_env, &err))) {
            fprintf(stderr, "hvd-driver: %s\n", err.msg);
            return -1;
        }
        watch_set_ssh(j->ssh);
    } else if (j->o.local_hosts > 0) {
        if (local_tasks_start(&j->lt, &j->o, &j->dir, j->job_env, &err) != 0) {
            fprintf(stderr, "hvd-driver: cannot start the local task services: %s\n", err.msg);
            return -1;
        }
        watch_set_local(&j->lt);
    } else if (j->o.ssh_hosts) {
        if (!(j->ssh = ssh_tasks_start(&j->o, j->d, j->job_env, &err))) {
            fprintf(stderr, "hvd-driver: cannot start the task services over ssh: %s\n", err.msg);
            return -1;
        }
        watch_set_ssh(j->ssh);
    } else {
        int n = launch_task_slots(&j->o);
        char here[96] = ""; /* serve starts no task services here */
        if (!j->o.serve)
            snprintf(here, sizeof here,
                     " To run them on this machine instead: --local 1 (or -H localhost:%d)", n);
        fprintf(stderr,
                "hvd-driver: waiting for %d task services. Start each executor's with\n"
                "  HVD_SECRET_FILE=%s hvd-task --driver '%s' --index I%s\n"
                "(I = 0..%d; copy the secret file there with mode 0600, never on a command "
                "line).%s\n",
                j->o.elastic ? j->o.np : n, j->dir.secret_file, j->addrs,
                j->o.many_commands ? " --elastic" : "", n - 1, here);
    }
    return 0;
}

static void job_end(job *j) {
    watch_end();
    if (j->d) hvd_driver_shutdown_tasks(j->d);
    if (j->lt.n) local_tasks_stop(&j->lt, HVD_TASK_STOP_GRACE_MS);
    ssh_tasks_stop(j->ssh, HVD_TASK_STOP_GRACE_MS);
    hvd_driver_stop(j->d);
    for (size_t i = 0; j->job_env && j->job_env[i]; i++) /* the secret */
        memset(j->job_env[i], 0, strlen(j->job_env[i]));
    hvd_strv_free(j->job_env);
    hvd_strv_free(j->nics);
    free(j->addrs);
    free(j->code.object.data);
    launch_opts_free(&j->o);
    if (j->dir.path[0]) hvd_remove_tree(j->dir.path);
}

int main(int argc, char **argv) {
    job j = {0};
    int rc = launch_opts_parse(argc, argv, &j.o);
    if (rc != 0 || load_code(&j.o, &j.code) != 0) {
        launch_opts_free(&j.o);
        return rc < 0 ? 0 : rc != 0 ? rc : 1;
    }
    hvd_err err;
    /* Signals go to the watcher before the secret file exists, so that an interrupt always
     * gets to the cleanup. */
    int sig_fd = hvd_signals_install(&err);
    if (sig_fd < 0 || watch_start(sig_fd, j.o.lifeline_fd, &err) != 0) {
        fprintf(stderr, "hvd-driver: %s\n", err.msg);
        return 1;
    }
    /* Local task services take the network timeout from the environment. */
    char nt[16];
    snprintf(nt, sizeof nt, "%d", j.o.net_timeout_s);
    setenv(HVD_NET_TIMEOUT_ENV, nt, 1);
    rc = 1;
    if (j.o.elastic) watch_ignore_lost(); /* the elastic loop resets instead */
    if (dir_create(&j.dir) == 0 && start_driver(&j) == 0 && start_tasks(&j) == 0) {
        if (j.o.elastic)
            rc = elastic_run(j.d, &j.o, &j.lt, j.ssh, &j.dir, j.job_env);
        else
            rc =
                j.o.serve ? serve(j.d, &j.o, &j.dir, j.addrs, j.ssh) : run(j.d, &j.o, &j.lt, j.ssh);
    }
    char why[512];
    watch_stop_reason(why, sizeof why);
    int sig = hvd_signals_first();
    if (why[0] && rc == 0) rc = 1;
    if (sig && why[0]) rc = 128 + sig;
    const char *payload = j.o.payload, *results = j.o.results_json, *dir = j.o.lifeline_dir;
    job_end(&j);            /* frees the options, not the argv strings they point into */
    if (watch_orphaned()) { /* nobody is left to read them, or to remove them */
        if (payload) unlink(payload);
        if (results) unlink(results);
        if (dir) hvd_remove_tree(dir);
    }
    return rc;
}
