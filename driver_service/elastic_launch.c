/* The elastic loop (include/hvd/launch.h, hvd_launch_elastic; docs/elastic.md has its state
 * machine): wait for enough usable slots, launch mpirun over the chosen tasks, watch it and
 * the hosts, and reset: stop mpirun and the tasks' commands, and launch again. Runs on the
 * caller's thread; installs no signal handler and never ends the process. */
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/proc.h"
#include "common/strv.h"
#include "elastic.h"
#include "hvd/proto.h"
#include "launch_internal.h"

#define EL_TICK_MS       50   /* how often a launch is looked at */
#define EL_BLAME_WAIT_MS 300  /* a failing rank may be the echo of a loss: wait this long for it */
#define EL_QUIET_WAIT_MS 1000 /* a wait for slots shorter than this says nothing */
/* Launches in a row that may end before any rank reported (no task lost) before the job
 * fails: mpirun or the ranks cannot start, and resetting would not change that. */
#define EL_FAILED_LAUNCHES_MAX 3

/* How a launch ended. */
typedef enum el_end { END_DONE, END_RESET, END_STOPPED } el_end;

typedef struct el_run {
    hvd_driver *d;
    const hvd_launch_config *cfg;
    const hvd_elastic_config *ec;
    el_hosts hosts;
    int64_t next_discovery; /* hvd_now_ms time of the next script run */
    int64_t deadline;       /* the whole job's end (cfg->timeout_s), or -1 */
    hvd_task_brief *tasks;  /* the last snapshot of the registered tasks */
    size_t ntasks;
    el_plan plan;           /* the running launch's tasks */
    char *plan_hosts;       /* "host:slots,..." of the last launch */
    char **ifaces;          /* found at the first launch, kept (as Horovod does) */
    hvd_launch_parts parts; /* the launcher's words, made at the first launch */
    bool have_parts;
    uint64_t epoch; /* launches so far */
    int resets;
    uint64_t commit; /* the newest commit the tasks held at the last reset */
    size_t holders;
    bool pending;        /* the ranks were told that the hosts changed */
    int failed_launches; /* launches in a row that ended with no rank reporting, no task lost */
    bool discovered;     /* the discovery script answered once */
    char script_err[HVD_ERR_MAX]; /* its last failure, said once until it answers again */
    hvd_proc *mpirun;
    char *mpirun_tmpdir; /* its TMPDIR (launch_tmpdir_make) */
    char why[768];       /* why the last launch ended (the reset line says it) */
} el_run;

static void progress(el_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(el_run *r, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->ec->progress)
        r->ec->progress(r->ec->progress_user, line);
    else if (r->cfg->log)
        r->cfg->log(r->cfg->log_user, line);
}

static bool stop_requested(const el_run *r) {
    return r->cfg->stop && __atomic_load_n(r->cfg->stop, __ATOMIC_ACQUIRE);
}

/* The start timeout (ms): for the first hosts, the interface probe, and each launch's ranks. */
static int start_ms_of(const el_run *r) {
    return r->cfg->start_timeout_ms > 0 ? r->cfg->start_timeout_ms
                                        : HVD_START_TIMEOUT_DEFAULT_S * 1000;
}

static bool past_deadline(const el_run *r) {
    return r->deadline >= 0 && hvd_now_ms() >= r->deadline;
}

/* ---- The hosts ------------------------------------------------------------------------------- */

/* Runs the discovery script when it is due. The first run must work; later failures keep the
 * last answer (a transient error) and are logged. Returns 0, or -1 with err. */
static int discover(el_run *r, hvd_err *err) {
    if (!r->hosts.script || hvd_now_ms() < r->next_discovery) return 0;
    r->next_discovery = hvd_now_ms() + HVD_DISCOVERY_INTERVAL_MS;
    hvd_elastic_host *v;
    size_t n;
    hvd_err e;
    if (el_discover(r->ec->discovery_script, r->ec->slots, &v, &n, &e) != 0) {
        if (!r->discovered) {
            if (err) *err = e;
            return -1;
        }
        if (strcmp(e.msg, r->script_err) != 0) /* not once a second for as long as it lasts */
            progress(r, "warning: %s; keeping its last answer", e.msg);
        snprintf(r->script_err, sizeof r->script_err, "%s", e.msg);
        return 0;
    }
    if (r->script_err[0]) progress(r, "the host discovery script answers again");
    r->script_err[0] = '\0';
    r->discovered = true;
    free(r->hosts.disc);
    r->hosts.disc = v;
    r->hosts.ndisc = n;
    if (r->ec->on_hosts) r->ec->on_hosts(r->ec->on_hosts_user, v, n);
    return 0;
}

/* Takes a new snapshot of the registered tasks. */
static void snapshot(el_run *r) {
    hvd_task_brief *t;
    size_t n;
    if (hvd_driver_tasks(r->d, &t, &n, NULL) != 0) return; /* keep the last one */
    free(r->tasks);
    r->tasks = t;
    r->ntasks = n;
}

/* The lost task of the running launch seen first, or NULL. */
static const hvd_task_brief *lost_active(const el_run *r) {
    for (size_t i = 0; i < r->ntasks; i++)
        if (r->tasks[i].active && r->tasks[i].lost) return &r->tasks[i];
    return NULL;
}

/* A lost task ends the launch: says so into r->why. */
static el_end lost_why(el_run *r, const hvd_task_brief *lost) {
    snprintf(r->why, sizeof r->why, "task %u of host %s went away (its task service is lost)",
             lost->index, lost->host_hash);
    return END_RESET;
}

/* Lost tasks leave the registry: their indices may register again (a replacement). */
static void forget_lost(el_run *r) {
    for (size_t i = 0; i < r->ntasks; i++)
        if (r->tasks[i].lost) hvd_driver_forget_task(r->d, r->tasks[i].index);
    snapshot(r);
}

/* ---- Waiting for slots ------------------------------------------------------------------------
 */

/* Waits until a plan of at least `need` ranks can be made, for up to timeout_ms. Returns 0
 * with r->plan, or -1 with err (out of time, stopped, the discovery script failed first). */
static int wait_slots(el_run *r, int need, int timeout_ms, const char *limit, hvd_err *err) {
    int64_t start = hvd_now_ms(), until = start + timeout_ms;
    size_t said = SIZE_MAX;
    for (;;) {
        if (discover(r, err) != 0) return -1;
        forget_lost(r);
        el_plan_free(&r->plan);
        if (el_plan_make(&r->hosts, r->tasks, r->ntasks, r->ec->max_np, hvd_now_ms(), &r->plan))
            return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        if (r->plan.n >= (size_t)need) return 0;
        if (stop_requested(r) || past_deadline(r))
            return hvd_err_set(err, HVD_E_STATE, "the job was stopped while waiting for hosts");
        if (hvd_now_ms() >= until)
            return hvd_err_set(err, HVD_E_TIMEOUT,
                               "only %zu slot(s) were usable for %lld s, and %d are needed "
                               "(%s)%s%s",
                               r->plan.usable, (long long)(hvd_now_ms() - start) / 1000, need,
                               limit, r->why[0] ? "; the last launch ended: " : "", r->why);
        if (r->plan.usable != said && hvd_now_ms() - start >= EL_QUIET_WAIT_MS) {
            said = r->plan.usable;
            progress(r, "waiting for hosts: %zu slot(s) usable, %d needed (%s)", said, need, limit);
        }
        struct timespec ts = {0, EL_TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- A launch ------------------------------------------------------------------------------- */

/* Names in "a:1,b:2" list x that are not in list y, as "a, b" into out ("" if none). */
static void hosts_not_in(const char *x, const char *y, char *out, size_t cap) {
    out[0] = '\0';
    char **xv = hvd_strv_split(x ? x : "", ','), **yv = hvd_strv_split(y ? y : "", ',');
    for (size_t i = 0; xv && xv[i]; i++) {
        size_t len = strcspn(xv[i], ":");
        bool found = false;
        for (size_t j = 0; yv && yv[j] && !found; j++)
            found = strncmp(xv[i], yv[j], len) == 0 && yv[j][len] == ':';
        size_t used = strlen(out);
        if (!found && used + len + 3 < cap)
            snprintf(out + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, xv[i]);
    }
    hvd_strv_free(xv);
    hvd_strv_free(yv);
}

/* Hosts of "a:1,b:2" list x that are in list y with another slot count, as "a 2 -> 1" into
 * out ("" if none): one of two executors of a machine lost leaves its host with fewer slots. */
static void hosts_resized(const char *x, const char *y, char *out, size_t cap) {
    out[0] = '\0';
    char **xv = hvd_strv_split(x ? x : "", ','), **yv = hvd_strv_split(y ? y : "", ',');
    for (size_t i = 0; xv && xv[i]; i++) {
        size_t len = strcspn(xv[i], ":");
        for (size_t j = 0; yv && yv[j]; j++) {
            if (strncmp(xv[i], yv[j], len) != 0 || yv[j][len] != ':') continue;
            const char *was = xv[i][len] ? xv[i] + len + 1 : "", *now = yv[j] + len + 1;
            size_t used = strlen(out);
            if (strcmp(was, now) != 0 && used + len + strlen(was) + strlen(now) + 7 < cap)
                snprintf(out + used, cap - used, "%s%.*s %s -> %s", used ? ", " : "", (int)len,
                         xv[i], was, now);
            break;
        }
    }
    hvd_strv_free(xv);
    hvd_strv_free(yv);
}

/* The reset line (or the first launch's): who left and came, why, the size, the commit. */
static void say_launch(el_run *r, const char *hosts) {
    if (r->epoch == 1) {
        progress(r, "elastic job: %zu rank%s on %s", r->plan.n, r->plan.n == 1 ? "" : "s", hosts);
        return;
    }
    char left[512], came[512], resized[512], commit[96];
    hosts_not_in(r->plan_hosts, hosts, left, sizeof left);
    hosts_not_in(hosts, r->plan_hosts, came, sizeof came);
    hosts_resized(r->plan_hosts, hosts, resized, sizeof resized);
    if (r->commit)
        snprintf(commit, sizeof commit, "resuming from commit %llu (held by %zu task%s)",
                 (unsigned long long)r->commit, r->holders, r->holders == 1 ? "" : "s");
    else
        snprintf(commit, sizeof commit, "no commit yet: starting from the beginning");
    progress(r, "reset %d: %s; hosts left: %s; came: %s; %s%s%snow %zu rank%s on %s; %s", r->resets,
             r->why, left[0] ? left : "none", came[0] ? came : "none",
             resized[0] ? "slots changed: " : "", resized, resized[0] ? "; " : "", r->plan.n,
             r->plan.n == 1 ? "" : "s", hosts, commit);
}

/* mpirun's extra arguments for this launch: the user's, and the epoch for the ranks. */
static char **launch_args(el_run *r) {
    hvd_strb b = {0};
    for (size_t i = 0; r->cfg->mpi_args && r->cfg->mpi_args[i]; i++)
        hvd_strb_add(&b, r->cfg->mpi_args[i]);
    launch_rank_env(&b, r->parts.mpi, HVD_ELASTIC_EPOCH_ENV, "%llu", (unsigned long long)r->epoch);
    /* Horovod's marker, for scripts that look at it */
    launch_rank_env(&b, r->parts.mpi, "HOROVOD_ELASTIC", "1");
    return hvd_strb_finish(&b);
}

/* Starts mpirun over r->plan's tasks with argv. Returns 0, or -1 with err. */
static int start_mpirun(el_run *r, hvd_launch_config *lc, char **argv, hvd_err *err) {
    char *tmpdir = launch_tmpdir_make(err);
    char **envp = tmpdir ? mpirun_env(r->d, lc, &r->parts, tmpdir, err) : NULL;
    if (!envp) {
        launch_tmpdir_remove(tmpdir);
        return -1;
    }
    hvd_proc_spec spec = {.argv = argv,
                          .envp = envp,
                          .cleanup_dir = tmpdir,
                          .grace_ms = HVD_ELASTIC_KILL_DELAY_MS,
                          .pass_stdout = true,
                          .stdout_fd = lc->output_fds ? lc->output_fds[0] : 1,
                          .pass_stderr = true,
                          .stderr_fd = lc->output_fds ? lc->output_fds[1] : 2};
    r->mpirun = hvd_proc_start(&spec, err);
    hvd_env_free(envp);
    if (!r->mpirun) {
        launch_tmpdir_remove(tmpdir);
        return hvd_err_prefix(err, "cannot start mpirun (is Open MPI installed?): ");
    }
    r->mpirun_tmpdir = tmpdir;
    return 0;
}

/* Makes r->plan the driver's active set and starts mpirun over it (probing the interfaces at
 * the first launch). Returns 0, or -1 with err. */
static int launch(el_run *r, hvd_err *err) {
    if (hvd_driver_set_active(r->d, r->plan.idx, r->plan.n, err) != 0) return -1;
    r->epoch++;
    r->pending = false;
    hvd_driver_set_elastic(r->d, r->epoch, false);
    if (!r->ifaces && hvd_driver_common_interfaces(r->d, start_ms_of(r), &r->ifaces, err) != 0)
        return -1;
    if (!r->have_parts) {
        if (hvd_mpi_check_named(r->cfg->mpi, r->cfg->mpirun, err) != 0 ||
            hvd_launch_parts_make(r->d, r->cfg, r->ifaces, &r->parts, err) != 0)
            return -1;
        r->have_parts = true;
    }
    char *hosts = el_plan_hosts(&r->plan, r->tasks, r->ntasks);
    say_launch(r, hosts ? hosts : "?");
    free(r->plan_hosts);
    r->plan_hosts = hosts;
    hvd_launch_config lc = *r->cfg;
    lc.np = (int)r->plan.n;
    char **args = launch_args(r);
    lc.mpi_args = (const char *const *)args;
    char out_dir[PATH_MAX];
    if (r->ec->output_dir) {
        snprintf(out_dir, sizeof out_dir, "%s/launch.%llu", r->ec->output_dir,
                 (unsigned long long)r->epoch);
        lc.output_dir = out_dir;
    }
    char **argv = args ? launch_argv(r->d, &lc, r->ifaces, &r->parts, err) : NULL;
    int rc = -1;
    if (!args)
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    else if (argv) {
        char *line = hvd_strv_join((const char *const *)argv, " ");
        launch_log(r->cfg, "launch %llu: running %s", (unsigned long long)r->epoch,
                   line ? line : "mpirun");
        free(line);
        rc = start_mpirun(r, &lc, argv, err);
    }
    hvd_launch_free_argv(argv);
    hvd_strv_free(args);
    return rc;
}

/* ---- Watching a launch -------------------------------------------------------------------- */

/* The first rank that failed on its own (a status 1-127 of its own, not the reset status),
 * or -1. */
static int own_failure(const hvd_rank_result *res, size_t n, size_t *count) {
    int best = -1;
    *count = 0;
    for (size_t i = 0; i < n; i++) {
        int s = res[i].status;
        if (!res[i].present || s <= 0 || s >= 128 || s == HVD_ELASTIC_EXIT_RESET) continue;
        (*count)++;
        if (best < 0 || res[i].order < res[best].order) best = (int)i;
    }
    return best;
}

/* A rank failed on its own: its host is blacklisted, unless a task of the launch was lost
 * meanwhile (then the loss explains it). Says why into r->why. */
static el_end blame(el_run *r, const hvd_rank_result *f) {
    struct timespec ts = {0, EL_BLAME_WAIT_MS * 1000000L};
    nanosleep(&ts, NULL);
    snapshot(r);
    const hvd_task_brief *lost = lost_active(r);
    if (lost) {
        return lost_why(r, lost);
    }
    const char *host = f->host_hash ? f->host_hash : "?";
    int secs = el_blacklist(&r->hosts, host, hvd_now_ms());
    char until[64];
    if (secs < 0)
        snprintf(until, sizeof until, "for the rest of the job");
    else
        snprintf(until, sizeof until, "for %d s", secs);
    snprintf(r->why, sizeof r->why,
             "rank %d (task %u on host %s) failed with status %d%s%.300s; "
             "host %s blacklisted %s",
             f->rank, f->index, host, f->status, f->error ? ": " : "", f->error ? f->error : "",
             host, until);
    return END_RESET;
}

/* mpirun ended with `status`: the job is done, or is reset (r->why says why). */
static el_end judge(el_run *r, int status) {
    snapshot(r);
    const hvd_task_brief *lost = lost_active(r);
    if (lost) {
        return lost_why(r, lost);
    }
    hvd_rank_result *res = NULL;
    size_t n = 0, nfail = 0, nreset = 0, nok = 0;
    if (hvd_driver_results(r->d, &res, &n, NULL) != 0) n = 0;
    for (size_t i = 0; i < n; i++) {
        nok += res[i].present && res[i].status == 0;
        nreset += res[i].present && res[i].status == HVD_ELASTIC_EXIT_RESET;
    }
    int f = own_failure(res, n, &nfail);
    el_end end = END_RESET;
    if (n > 0 && nok == n) {
        end = END_DONE;
    } else if (f >= 0 && nfail == n) { /* every rank failed by itself: the job's own failure */
        end = END_DONE;
    } else if (f >= 0) {
        end = blame(r, &res[f]);
    } else if (nreset > 0) {
        snprintf(r->why, sizeof r->why, "the ranks reset for the host change (%s)",
                 r->pending ? "the driver told them" : "a collective failed");
    } else {
        snprintf(r->why, sizeof r->why,
                 "mpirun exited with status %d before every rank reported (its output above "
                 "says why)",
                 status);
    }
    size_t reported = 0;
    for (size_t i = 0; i < n; i++)
        reported += res[i].present;
    r->failed_launches = reported == 0 && end == END_RESET ? r->failed_launches + 1 : 0;
    hvd_driver_results_free(res, n);
    return end;
}

/* Tells the ranks once when the tasks they would run on have changed: they commit and end
 * at their next commit (hvd_elastic_commit, state.commit()). */
static void check_hosts(el_run *r) {
    if (r->pending) return;
    el_plan next;
    if (el_plan_make(&r->hosts, r->tasks, r->ntasks, r->ec->max_np, hvd_now_ms(), &next) != 0)
        return;
    if (!el_plan_same(&next, &r->plan)) {
        /* Below --min-np too (Horovod does the same): the hosts the discovery script no longer
         * lists are not used any more, and the job waits up to --elastic-timeout for others. */
        char *hosts = el_plan_hosts(&next, r->tasks, r->ntasks);
        r->pending = true;
        hvd_driver_set_elastic(r->d, r->epoch, true);
        if (next.n >= (size_t)r->ec->min_np)
            launch_log(r->cfg, "the hosts changed (next: %s): the ranks reset at their next commit",
                       hosts ? hosts : "?");
        else
            launch_log(r->cfg,
                       "the hosts changed (%zu slot(s) left: %s; min_np %d): the ranks stop at "
                       "their next commit and the job waits up to the elastic timeout for hosts",
                       next.n, hosts && *hosts ? hosts : "none", r->ec->min_np);
        free(hosts);
    }
    el_plan_free(&next);
}

/* Whether the launch stalled: not every rank had started when the start timeout had passed
 * since mpirun began (PRRTE 3.0 does so now and then after starting its daemons:
 * docs/launcher.md). It then ends in a reset, which counts as a failed launch when no rank
 * reported. */
static bool stalled(el_run *r) {
    size_t np, started = hvd_driver_ranks_started(r->d, &np);
    if (started >= np) return false;
    snprintf(r->why, sizeof r->why,
             "%zu of %zu ranks had started %d s after mpirun began (the start timeout): mpirun "
             "or its daemons stalled before starting the rest",
             started, np, (start_ms_of(r) + 999) / 1000);
    hvd_rank_result *res = NULL;
    size_t n = 0, reported = 0;
    if (hvd_driver_results(r->d, &res, &n, NULL) != 0) n = 0;
    for (size_t i = 0; i < n; i++)
        reported += res[i].present;
    hvd_driver_results_free(res, n);
    r->failed_launches = reported == 0 ? r->failed_launches + 1 : 0;
    return true;
}

/* Watches the running launch until it ends, stalls, a task of it is lost, or the job is
 * stopped. */
static el_end watch(el_run *r, hvd_launch_outcome *out) {
    int64_t start_deadline = hvd_now_ms() + start_ms_of(r); /* -1 once looked at */
    for (;;) {
        int code = 255;
        int w = hvd_proc_wait(r->mpirun, EL_TICK_MS, &code);
        if (w <= 0) {
            out->status = w == 0 ? code : 255;
            return judge(r, out->status);
        }
        if (stop_requested(r) || past_deadline(r)) {
            out->stopped = stop_requested(r);
            out->timed_out = !out->stopped;
            hvd_driver_stopping_job(r->d); /* what fails from here on is the stop's doing */
            return END_STOPPED;
        }
        snapshot(r);
        const hvd_task_brief *lost = lost_active(r);
        if (lost) {
            return lost_why(r, lost);
        }
        if (start_deadline >= 0 && hvd_now_ms() >= start_deadline) {
            start_deadline = -1;
            if (stalled(r)) return END_RESET;
        }
        discover(r, NULL);
        check_hosts(r);
    }
}

/* Ends a launch: mpirun (SIGTERM, SIGKILL HVD_ELASTIC_KILL_DELAY_MS later) and the commands of
 * its tasks still there, whose newest commit it notes. Nothing of the launch runs after it. */
static void end_launch(el_run *r, int *status) {
    if (!r->mpirun) return;
    hvd_proc_abort(r->mpirun);
    snapshot(r);
    uint32_t *live = malloc((r->plan.n ? r->plan.n : 1) * sizeof *live);
    size_t nlive = 0;
    for (size_t i = 0; live && i < r->ntasks; i++)
        if (r->tasks[i].active && !r->tasks[i].lost) live[nlive++] = r->tasks[i].index;
    int grace = HVD_GRACE_DEFAULT_MS + HVD_ELASTIC_KILL_DELAY_MS + 5000;
    if (live) hvd_driver_stop_commands(r->d, live, nlive, grace, &r->commit, &r->holders);
    free(live);
    int code = 255;
    if (hvd_proc_wait(r->mpirun, -1, &code) == 0 && status) *status = code;
    hvd_proc_free(r->mpirun);
    r->mpirun = NULL;
    launch_tmpdir_remove(r->mpirun_tmpdir);
    r->mpirun_tmpdir = NULL;
}

/* ---- The loop ------------------------------------------------------------------------------- */

static void run_free(el_run *r) {
    if (r->mpirun) end_launch(r, NULL);
    el_hosts_free(&r->hosts);
    el_plan_free(&r->plan);
    free(r->tasks);
    free(r->plan_hosts);
    hvd_strv_free(r->ifaces);
    hvd_launch_parts_free(&r->parts);
}

/* Waits for the slots of the next launch: np at first (start timeout), min_np later (elastic
 * timeout). */
static int wait_next(el_run *r, hvd_err *err) {
    const hvd_elastic_config *ec = r->ec;
    char limit[96];
    if (r->epoch == 0) {
        int need = ec->np > 0 ? ec->np : ec->min_np;
        if (ec->max_np > 0 && need > ec->max_np) need = ec->max_np;
        int ms = start_ms_of(r);
        snprintf(limit, sizeof limit, "np %d within the start timeout, %d s", need, ms / 1000);
        return wait_slots(r, need, ms, limit, err);
    }
    int secs = ec->elastic_timeout_s > 0 ? ec->elastic_timeout_s : HVD_ELASTIC_TIMEOUT_DEFAULT_S;
    snprintf(limit, sizeof limit, "min_np %d within the elastic timeout, %d s", ec->min_np, secs);
    return wait_slots(r, ec->min_np, secs * 1000, limit, err);
}

int hvd_launch_elastic(hvd_driver *d, const hvd_launch_config *cfg, const hvd_elastic_config *ec,
                       hvd_launch_outcome *out, hvd_elastic_outcome *eout, hvd_err *err) {
    memset(out, 0, sizeof *out);
    memset(eout, 0, sizeof *eout);
    if (ec->min_np < 1 || (ec->max_np > 0 && ec->max_np < ec->min_np))
        return hvd_err_set(err, HVD_E_INVALID, "elastic jobs need 1 <= --min-np <= --max-np");
    el_run r = {.d = d, .cfg = cfg, .ec = ec, .deadline = -1};
    r.hosts.script = ec->discovery_script != NULL;
    r.hosts.cooldown_min_s = ec->cooldown_min_s;
    r.hosts.cooldown_max_s = ec->cooldown_max_s;
    if (cfg->timeout_s > 0) r.deadline = hvd_now_ms() + (int64_t)cfg->timeout_s * 1000;
    int rc = 0;
    for (;;) {
        if (wait_next(&r, err) != 0 || launch(&r, err) != 0) {
            rc = -1;
            break;
        }
        el_end end = watch(&r, out);
        end_launch(&r, &out->status);
        if (end != END_RESET) break;
        if (r.failed_launches >= EL_FAILED_LAUNCHES_MAX) {
            rc = hvd_err_set(err, HVD_E_STATE,
                             "%d launches in a row ended before any rank reported, with no task "
                             "lost: the job cannot start; the last: %s",
                             r.failed_launches, r.why);
            break;
        }
        if (ec->reset_limit >= 0 && ++r.resets > ec->reset_limit) {
            rc = hvd_err_set(err, HVD_E_STATE,
                             "the job was reset %d time%s, more than --reset-limit %d allows; "
                             "the last reset: %s",
                             r.resets, r.resets == 1 ? "" : "s", ec->reset_limit, r.why);
            break;
        }
        if (ec->reset_limit < 0) r.resets++;
    }
    eout->resets = r.resets;
    eout->commit = r.commit;
    eout->ranks = (int)r.plan.n;
    run_free(&r);
    return rc;
}
