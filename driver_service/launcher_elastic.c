/* hvd-driver run's elastic jobs (docs/elastic.md): the options into hvd_launch_elastic (the
 * loop is libhvd_launch's, elastic_launch.c), the task services of the hosts a discovery
 * script names (fake hosts with --local, ssh sessions with --ssh), and the report at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/proc.h"
#include "common/strv.h"
#include "hvd/net.h"
#include "launcher.h"

/* A host a discovery script named: a fake host (--local), its tasks lt->procs[proc..proc+n);
 * or an ssh host (--ssh), its session ssh_tasks_add_host's number proc. */
typedef struct found_host {
    char name[256]; /* as the script named it (--local: the host hash, but see local_hash) */
    int first, n;   /* task indices first..first+n-1 */
    int proc;
} found_host;

typedef struct elastic_job {
    const launch_opts *o;
    local_tasks *lt;
    ssh_tasks *ssh; /* --ssh; else NULL */
    const launch_dir *dir;
    char *const *job_env;
    found_host *hosts;
    size_t nhosts;
    int next_index; /* the next task index a new host gets */
    char **refused; /* names not started, said once each (NULL-terminated, or NULL) */
} elastic_job;

static bool is_this_machine(const char *host);

/* Says once per name why a discovered host gets no task services. */
static void refuse_host(elastic_job *j, const char *name, bool too_many) {
    if (j->refused && hvd_strv_has((const char *const *)j->refused, name)) return;
    const char *at = strrchr(name, '@');
    if (too_many)
        fprintf(stderr,
                "hvd-driver: warning: not starting host '%s': the job would have more "
                "than %d task services\n",
                name, HVD_ELASTIC_LOCAL_TASKS_MAX);
    else if (j->ssh && is_this_machine(at ? at + 1 : name))
        fprintf(stderr,
                "hvd-driver: warning: not starting host '%s': it names this machine, "
                "where mpirun would start its daemon itself, outside every task "
                "service; for ranks on this machine run without --ssh (--local)\n",
                name);
    else
        fprintf(stderr, "hvd-driver: warning: not starting host '%s': %s\n", name,
                j->ssh ? "a host name has at most 255 characters"
                       : "a fake host's name is 1 to 127 of [A-Za-z0-9_-]");
    size_t n = j->refused ? hvd_strv_len((const char *const *)j->refused) : 0;
    char **v = realloc(j->refused, (n + 2) * sizeof *v);
    if (!v) return;
    j->refused = v;
    v[n] = strdup(name);
    v[n + (v[n] != NULL)] = NULL;
}

static void progress_line(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "hvd-driver: %s\n", line);
}

/* Whether host names this machine. */
static bool is_this_machine(const char *host) {
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    return !strcmp(host, "localhost") || !strcmp(host, me) || !strcmp(host, "127.0.0.1");
}

/* Whether a discovered name may get task services. With --ssh, never this machine (mpirun
 * would start orted there itself, outside every task service); with --local, a host hash
 * (this machine's names too, as Horovod's local runs have them: see local_hash). */
static bool name_ok(const elastic_job *j, const char *name) {
    const char *at = strrchr(name, '@');
    if (j->ssh) return !is_this_machine(at ? at + 1 : name) && strlen(name) < 256;
    return hvd_host_hash_valid(name) &&
           (!is_this_machine(name) || strlen(name) + 33 < HVD_HOST_HASH_MAX);
}

/* The host hash of a --local host's task services: its name; for a name of this machine
 * ("localhost:2", as in Horovod's local examples), the name, '-' and 32 hex digits, which
 * still counts as that host (docs/elastic.md, "Hosts") but is no name mpirun would take for
 * this machine and start orted on itself, outside every task service. */
static void local_hash(const char *name, char out[HVD_HOST_HASH_MAX]) {
    if (!is_this_machine(name)) {
        snprintf(out, HVD_HOST_HASH_MAX, "%.127s", name);
        return;
    }
    char hh[HVD_HOST_HASH_MAX];
    hvd_err err;
    const char *dash = hvd_host_hash(hh, "hvd-driver-local", &err) == 0 ? strrchr(hh, '-') : NULL;
    snprintf(out, HVD_HOST_HASH_MAX, "%.94s%s", name,
             dash && strlen(dash) == 33 ? dash : "-00000000000000000000000000000000");
}

/* Whether every task of a host has ended (killed, say; its ssh session gone). */
static bool host_ended(const elastic_job *j, const found_host *h) {
    if (j->ssh) return ssh_tasks_host_ended(j->ssh, h->proc);
    for (int i = h->proc; i < h->proc + h->n; i++)
        if (hvd_proc_reap(j->lt->procs[i], NULL) == 1) return false;
    return true;
}

/* Starts the tasks of a host (again, at the same indices, if they had ended). */
static void start_host(elastic_job *j, found_host *h) {
    hvd_err err = {0};
    int rc;
    if (j->ssh) {
        rc = h->proc = ssh_tasks_add_host(j->ssh, h->name, h->first, h->n, &err);
    } else {
        char hash[HVD_HOST_HASH_MAX];
        local_hash(h->name, hash);
        h->proc = j->lt->n;
        rc = local_host_start(j->lt, j->o, j->dir, j->job_env, hash, h->first, h->n, &err);
    }
    if (rc < 0)
        fprintf(stderr, "hvd-driver: warning: cannot start the tasks of host %s: %s\n", h->name,
                err.msg);
}

/* The discovery script answered (hvd_elastic_config.on_hosts): new hosts get task services. */
static void on_hosts(void *user, const hvd_elastic_host *v, size_t n) {
    elastic_job *j = user;
    for (size_t i = 0; i < n; i++) {
        found_host *h = NULL;
        for (size_t k = 0; k < j->nhosts && !h; k++)
            if (!strcmp(j->hosts[k].name, v[i].name)) h = &j->hosts[k];
        if (h) {
            if (host_ended(j, h)) start_host(j, h);
            continue;
        }
        bool too_many = j->next_index + v[i].slots > HVD_ELASTIC_LOCAL_TASKS_MAX;
        if (!name_ok(j, v[i].name) || too_many) {
            refuse_host(j, v[i].name, too_many && name_ok(j, v[i].name));
            continue;
        }
        found_host *g = realloc(j->hosts, (j->nhosts + 1) * sizeof *g);
        if (!g) continue;
        j->hosts = g;
        h = &j->hosts[j->nhosts++];
        snprintf(h->name, sizeof h->name, "%s", v[i].name);
        h->first = j->next_index;
        h->n = v[i].slots;
        j->next_index += v[i].slots;
        start_host(j, h);
    }
}

static hvd_elastic_config elastic_config(const launch_opts *o, elastic_job *j) {
    hvd_elastic_config ec = {.min_np = o->min_np,
                             .max_np = o->max_np,
                             .np = o->np,
                             .discovery_script = o->discovery_script,
                             .slots = o->slots,
                             .output_dir = o->output_arg,
                             .reset_limit = o->reset_limit,
                             .elastic_timeout_s = o->elastic_timeout_s,
                             .cooldown_min_s = o->cooldown_min_s,
                             .cooldown_max_s = o->cooldown_max_s,
                             .progress = progress_line};
    if ((o->local_hosts || o->ssh_discovered) && o->discovery_script) {
        ec.on_hosts = on_hosts;
        ec.on_hosts_user = j;
    }
    return ec;
}

int elastic_run(hvd_driver *d, const launch_opts *o, local_tasks *lt, ssh_tasks *ssh,
                const launch_dir *dir, char *const *job_env) {
    elastic_job j = {
        .o = o, .lt = lt, .ssh = o->ssh_discovered ? ssh : NULL, .dir = dir, .job_env = job_env};
    hvd_launch_config lc = {.exec_bin_dir = o->ssh_bin_dir,
                            .mpi = o->mpi,
                            .mpirun = o->mpirun,
                            .mpi_args = o->mpi_args,
                            .rank_env = o->rank_env,
                            .forward_env = o->ssh_discovered, /* local tasks inherit it */
                            .timeout_s = o->timeout_s,
                            .start_timeout_ms = o->start_timeout_s * 1000,
                            .stop = watch_stop_flag(),
                            .log = launcher_log,
                            .log_user = (void *)o};
    hvd_elastic_config ec = elastic_config(o, &j);
    hvd_launch_outcome out;
    hvd_elastic_outcome eo;
    hvd_err err;
    int rc = hvd_launch_elastic(d, &lc, &ec, &out, &eo, &err);
    free(j.hosts);
    hvd_strv_free(j.refused);
    char why[512];
    if (rc != 0) {
        watch_stop_reason(why, sizeof why);
        fprintf(stderr, "hvd-driver: %s\n", why[0] ? why : err.msg);
        return 1;
    }
    job_stop_reason(o, &out, why, sizeof why);
    fprintf(stderr, "hvd-driver: elastic job: %d reset%s; the last launch had %d ranks\n",
            eo.resets, eo.resets == 1 ? "" : "s", eo.ranks);
    job_end_info end = {.mpirun = &out, .stopped = why};
    return report_results(d, o, &end);
}
