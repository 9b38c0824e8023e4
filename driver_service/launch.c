/* One job's launcher (include/hvd/launch.h): the command line of DESIGN.md section 2 step 4 in
 * the dialect of its MPI (section 5d: Open MPI 4, Open MPI 5, MPICH), run through the process
 * runner and waited for. */
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/fs.h"
#include "common/proc.h"
#include "common/strv.h"
#include "hvd/launch.h"
#include "hvd/proto.h"
#include "launch_internal.h"

#define POLL_MS             50   /* how often the wait for mpirun looks at the stop flag */
#define RANK_FAILED_STOP_MS 1000 /* rank_failed_alone */

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

/* ---- the three dialects ----------------------------------------------------------------- */

/* Whether ifname is a loopback interface of this machine (the driver's: interface names are
 * assumed to mean the same on the executors, as for every interface option here). */
static bool is_loopback(const char *ifname) {
    struct ifaddrs *all;
    bool lo = strcmp(ifname, "lo") == 0;
    if (getifaddrs(&all) != 0) return lo;
    for (struct ifaddrs *i = all; i; i = i->ifa_next)
        if (i->ifa_name && strcmp(i->ifa_name, ifname) == 0)
            lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
    freeifaddrs(all);
    return lo;
}

/* "a,b" of ifaces; with no_loopback, without the loopback interfaces. NULL if none is left
 * (or out of memory: *failed is then set). */
static char *iface_list(char *const *ifaces, bool no_loopback, bool *failed) {
    hvd_strb keep = {0};
    for (size_t i = 0; ifaces && ifaces[i]; i++)
        if (!no_loopback || !is_loopback(ifaces[i])) hvd_strb_add(&keep, ifaces[i]);
    char **v = hvd_strb_finish(&keep);
    char *list = v && v[0] ? hvd_strv_join((const char *const *)v, ",") : NULL;
    if (!v || (v[0] && !list)) *failed = true;
    hvd_strv_free(v);
    return list;
}

/* The list for btl_tcp_if_include: without loopback when another interface remains. Open MPI's
 * TCP transport spreads a message over every interface of the list, and with loopback beside
 * another one a message over its eager limit (64 KiB) between two hosts never arrived (Open MPI
 * 4.1.4: a 68,000-byte MPI_Bcast between two fake hosts hung with lo,eth0 and ran with either
 * alone; e2e_big_messages). Between real hosts loopback carries nothing anyway. */
static char *btl_list(char *const *ifaces, bool *failed) {
    char *list = iface_list(ifaces, true, failed);
    return list ? list : iface_list(ifaces, false, failed);
}

/* Open MPI's "-mca NAME VALUE" (ORTE: -mca; PRRTE's daemons: --prtemca; the ranks: --mca). */
static void mca(hvd_strb *a, const char *opt, const char *name, const char *value) {
    hvd_strb_add(a, opt);
    hvd_strb_add(a, name);
    hvd_strb_add(a, value);
}

/* An environment variable for the ranks: Open MPI's -x NAME=VALUE, Hydra's -genv NAME VALUE. */
void launch_rank_env(hvd_strb *a, hvd_mpi_impl mpi, const char *name, const char *fmt, ...) {
    char value[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    if (mpi == HVD_MPI_MPICH) {
        hvd_strb_add(a, "-genv");
        hvd_strb_add(a, name);
        hvd_strb_add(a, value);
    } else {
        hvd_strb_add(a, "-x");
        hvd_strb_addf(a, "%s=%s", name, value);
    }
}

/* Task 0's address on the first interface every pair of tasks shares (IPv4 first), with the
 * port task 0 found free on its host; false when there is none. */
static bool task0_addr(hvd_driver *d, char *const *ifaces, char *host, size_t cap, unsigned *port) {
    hvd_task_info t0;
    int64_t first = hvd_driver_first_active(d); /* task 0, or an elastic launch's first */
    if (first < 0 || hvd_driver_task(d, (uint32_t)first, &t0, NULL) != 0) return false;
    const hvd_addr *addrs = t0.addrs.v, *pick = NULL;
    for (size_t i = 0; i < t0.addrs.n; i++) {
        bool on_iface = !ifaces || !ifaces[0] || strcmp(addrs[i].ifname, ifaces[0]) == 0;
        if (on_iface && (!pick || (strchr(pick->host, ':') && !strchr(addrs[i].host, ':'))))
            pick = &addrs[i];
    }
    bool ok = pick && t0.free_port;
    if (ok) {
        snprintf(host, cap, "%s", pick->host);
        *port = t0.free_port;
    }
    hvd_msg_free(&hvd_task_info_desc, &t0);
    return ok;
}

/* Where Hydra's proxies call mpiexec back: the driver's IPv4 address on the first shared
 * interface that is not loopback, else on any interface that is not, else its first IPv4
 * address (a driver with loopback only). Without it mpiexec gives its hostname, which
 * executors may not resolve (and Hydra resolves every host name of -hosts to find itself). */
static bool control_addr(hvd_driver *d, char *const *ifaces, char *out, size_t cap) {
    hvd_addr *addrs;
    size_t n;
    if (hvd_driver_addrs(d, &addrs, &n, NULL) != 0) return false;
    const hvd_addr *pick = NULL;
    for (size_t k = 0; ifaces && ifaces[k] && !pick; k++) /* shared, in their order */
        for (size_t i = 0; i < n && !pick; i++)
            if (!strchr(addrs[i].host, ':') && !strcmp(addrs[i].ifname, ifaces[k]) &&
                !is_loopback(ifaces[k]))
                pick = &addrs[i];
    for (int any_lo = 0; any_lo < 2 && !pick; any_lo++) /* not loopback, then anything */
        for (size_t i = 0; i < n && !pick; i++)
            if (!strchr(addrs[i].host, ':') && (any_lo || !is_loopback(addrs[i].ifname)))
                pick = &addrs[i];
    if (pick) snprintf(out, cap, "%s", pick->host);
    free(addrs);
    return pick != NULL;
}

/* Open MPI 4.1 (ORTE): openmpi_rsh_agent.md. Host hashes never resolve: without
 * if_base_do_not_resolve mpirun sends a DNS query for each of them (seen with strace: 4
 * queries for one host) to whatever resolver the machine has. Rank 0 reads no stdin: large
 * stdin crashes remote orteds (openmpi_rsh_agent.md section 9). */
static void parts_openmpi4(hvd_launch_parts *p, const char *rsh, char *const *ifaces,
                           bool *failed) {
    hvd_strb args = {0}, agent = {0}, ifs = {0};
    mca(&args, "-mca", "if_base_do_not_resolve", "1");
    hvd_strb_add(&args, "--stdin");
    hvd_strb_add(&args, "none");
    mca(&agent, "-mca", "plm_rsh_agent", rsh);
    char *list = iface_list(ifaces, false, failed), *btl = btl_list(ifaces, failed);
    if (list) {
        mca(&ifs, "-mca", "btl_tcp_if_include", btl);
        mca(&ifs, "-mca", "oob_tcp_if_include", list);
        /* A prefix list for NCCL: '=' asks for exact names (eth1 not eth10). */
        launch_rank_env(&ifs, HVD_MPI_OPENMPI4, "NCCL_SOCKET_IFNAME", "=%s", list);
    }
    free(list);
    free(btl);
    p->args = hvd_strb_finish(&args);
    p->agent = hvd_strb_finish(&agent);
    p->ifaces = hvd_strb_finish(&ifs);
}

/* Open MPI 5 (PRRTE): the daemons take --prtemca, the ranks --mca. PRRTE resolves no host
 * name by default (prte_do_not_resolve, said anyway). Its daemons' out-of-band network never
 * uses a loopback interface (PMIx leaves them out of its interface list) and a name missing
 * from oob_tcp_if_include made prterun 5.0.11 crash (SIGSEGV): the list leaves loopback out,
 * and is left out when nothing remains (PRRTE then picks). */
static void parts_openmpi5(hvd_launch_parts *p, const char *rsh, char *const *ifaces,
                           bool *failed) {
    hvd_strb args = {0}, agent = {0}, ifs = {0};
    mca(&args, "--prtemca", "prte_do_not_resolve", "1");
    hvd_strb_add(&args, "--stdin");
    hvd_strb_add(&args, "none");
    mca(&agent, "--prtemca", "plm_ssh_agent", rsh);
    char *list = iface_list(ifaces, false, failed), *oob = iface_list(ifaces, true, failed);
    char *btl = btl_list(ifaces, failed);
    if (btl) mca(&ifs, "--mca", "btl_tcp_if_include", btl);
    if (oob) mca(&ifs, "--prtemca", "oob_tcp_if_include", oob);
    if (list) launch_rank_env(&ifs, HVD_MPI_OPENMPI5, "NCCL_SOCKET_IFNAME", "=%s", list);
    free(list);
    free(btl);
    free(oob);
    p->args = hvd_strb_finish(&args);
    p->agent = hvd_strb_finish(&agent);
    p->ifaces = hvd_strb_finish(&ifs);
}

/* MPICH and Intel MPI (Hydra). -genvnone: Hydra passes mpiexec's whole environment to the
 * ranks by default, the job secret included, over its unencrypted control connections; with
 * it the ranks get their task's environment (as under Open MPI) plus what -genv names.
 * -localhost: where the proxies call back. Hydra has no stdin option: mpiexec's stdin is
 * /dev/null (the process runner's). HYDRA_LAUNCHER_AUTOFORK=0: a host Hydra finds local is
 * otherwise started with fork, beside the driver, not through hvd-rsh. The interfaces of
 * MPICH's ch4 netmods: UCX_NET_DEVICES (UCX, the wheels' first choice); libfabric's
 * FI_TCP_IFACE takes a single name and is left alone. */
static void parts_mpich(hvd_launch_parts *p, const char *rsh, char *const *ifaces,
                        const char *control, bool *failed) {
    hvd_strb args = {0}, agent = {0}, ifs = {0}, env = {0};
    hvd_strb_add(&args, "-genvnone");
    if (control) {
        hvd_strb_add(&args, "-localhost");
        hvd_strb_add(&args, control);
    }
    hvd_strb_add(&agent, "-launcher");
    hvd_strb_add(&agent, "ssh");
    hvd_strb_add(&agent, "-launcher-exec");
    hvd_strb_add(&agent, rsh);
    char *list = iface_list(ifaces, false, failed);
    if (list) {
        launch_rank_env(&ifs, HVD_MPI_MPICH, "UCX_NET_DEVICES", "%s", list);
        launch_rank_env(&ifs, HVD_MPI_MPICH, "NCCL_SOCKET_IFNAME", "=%s", list);
    }
    free(list);
    hvd_strb_add(&env, "HYDRA_LAUNCHER_AUTOFORK=0");
    p->args = hvd_strb_finish(&args);
    p->agent = hvd_strb_finish(&agent);
    p->ifaces = hvd_strb_finish(&ifs);
    p->env = hvd_strb_finish(&env);
}

void hvd_launch_parts_free(hvd_launch_parts *p) {
    hvd_strv_free(p->args);
    hvd_strv_free(p->agent);
    hvd_strv_free(p->ifaces);
    hvd_strv_free(p->env);
    memset(p, 0, sizeof *p);
}

/* Whether the ranks get this process's variable name with forward_env: not hvd-bridge's own
 * (the job's secret, the task's addresses), not MPI's or its launcher's, not TMPDIR (each host
 * has its own), not the shell's bookkeeping, nor Horovod's exclusions (BASH_FUNC_*, OLDPWD,
 * CUDA_VISIBLE_DEVICES: each rank has its own GPUs). */
static bool forwarded(const char *name, size_t len) {
    static const char *const prefixes[] = {"HVD_",       "OMPI_", "ORTE_",  "PMIX_",
                                           "PRTE_",      "PMI_",  "HYDRA_", "MPICH_",
                                           "BASH_FUNC_", "SSH_",  NULL};
    static const char *const names[] = {"TMPDIR", "PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", NULL};
    for (size_t i = 0; i < len; i++)
        if (!(isalnum((unsigned char)name[i]) || name[i] == '_')) return false;
    for (size_t i = 0; prefixes[i]; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return false;
    for (size_t i = 0; names[i]; i++)
        if (strlen(names[i]) == len && strncmp(name, names[i], len) == 0) return false;
    static const char cvd[] = "CUDA_VISIBLE_DEVICES";
    return !(len >= sizeof cvd - 1 &&
             strncmp(name + len - (sizeof cvd - 1), cvd, sizeof cvd - 1) == 0);
}

/* Whether one of words ("NAME=VALUE", or after "-x" in args) sets the variable name. */
static bool sets(const char *const *words, bool after_x, const char *name, size_t len) {
    for (size_t i = 0; words && words[i]; i++) {
        const char *w = words[i];
        if (after_x && (strcmp(w, "-x") != 0 || !(w = words[++i]))) continue;
        if (strncmp(w, name, len) == 0 && w[len] == '=') return true;
    }
    return false;
}

/* Open MPI's -x NAME (the value comes from mpirun's environment, this process's: nothing of it
 * on the command line) for each variable of this process that forwarded() lets through and
 * that the job does not set otherwise (its args, the rank environment). */
static void add_forwarded_env(hvd_strb *b, char *const *args, const char *const *env) {
    extern char **environ;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : 0;
        if (!len || !forwarded(*e, len) || sets((const char *const *)args, true, *e, len) ||
            sets(env, false, *e, len))
            continue;
        hvd_strb_add(b, "-x");
        hvd_strb_addf(b, "%.*s", (int)len, *e);
    }
}

/* cfg->rank_env appended to the parts' args, in this MPI's words. Returns 0, or -1 with err. */
static int add_rank_env(hvd_launch_parts *p, const char *const *env, bool forward, hvd_err *err) {
    forward = forward && p->mpi != HVD_MPI_MPICH; /* Hydra passes its environment on itself */
    if ((!env || !env[0]) && !forward) return 0;
    hvd_strb b = {0};
    for (size_t i = 0; p->args && p->args[i]; i++)
        hvd_strb_add(&b, p->args[i]);
    if (forward) add_forwarded_env(&b, p->args, env);
    for (size_t i = 0; env && env[i]; i++) {
        const char *eq = strchr(env[i], '=');
        if (!eq || eq == env[i]) {
            hvd_strb_free(&b);
            return hvd_err_set(err, HVD_E_INVALID, "rank environment \"%s\" is not NAME=VALUE",
                               env[i]);
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
        launch_rank_env(&b, p->mpi, name, "%s", eq + 1);
    }
    char **v = hvd_strb_finish(&b);
    if (!v) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory building the mpirun command");
    hvd_strv_free(p->args);
    p->args = v;
    return 0;
}

int hvd_launch_parts_make(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                          hvd_launch_parts *out, hvd_err *err) {
    memset(out, 0, sizeof *out);
    out->mpi = cfg->mpi;
    if (out->mpi == HVD_MPI_AUTO &&
        hvd_mpi_detect(cfg->mpirun, &out->mpi, out->version, sizeof out->version, err) != 0)
        return -1;
    char rsh[PATH_MAX + 16];
    snprintf(rsh, sizeof rsh, "%s/hvd-rsh", cfg->bin_dir ? cfg->bin_dir : hvd_launch_bin_dir());
    bool failed = false;
    if (out->mpi == HVD_MPI_OPENMPI4) {
        parts_openmpi4(out, rsh, ifaces, &failed);
    } else if (out->mpi == HVD_MPI_OPENMPI5) {
        parts_openmpi5(out, rsh, ifaces, &failed);
    } else if (out->mpi == HVD_MPI_MPICH) {
        char control[HVD_HOST_MAX];
        bool have = control_addr(d, ifaces, control, sizeof control);
        parts_mpich(out, rsh, ifaces, have ? control : NULL, &failed);
    } else {
        return hvd_err_set(err, HVD_E_INVALID, "unknown MPI implementation %d", (int)cfg->mpi);
    }
    if (!out->env) out->env = calloc(1, sizeof *out->env);
    if (failed || !out->args || !out->agent || !out->ifaces || !out->env) {
        hvd_launch_parts_free(out);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory building the mpirun command");
    }
    if (add_rank_env(out, cfg->rank_env, cfg->forward_env, err) != 0) {
        hvd_launch_parts_free(out);
        return -1;
    }
    if (d) hvd_driver_set_mpi(d, out->mpi); /* its failure sentences name this MPI's daemon */
    return 0;
}

/* ---- the command line -------------------------------------------------------------------- */

/* Whether w is one of mpirun's options that set an MCA parameter (-mca NAME VALUE). */
static bool is_mca_option(const char *w) {
    static const char *const opts[] = {"-mca",     "--mca",     "-gmca",    "--gmca",
                                       "-prtemca", "--prtemca", "-pmixmca", "--pmixmca",
                                       "-omca",    "--omca",    NULL};
    for (size_t i = 0; opts[i]; i++)
        if (strcmp(w, opts[i]) == 0) return true;
    return false;
}

/* Whether the user's mpirun arguments set the MCA parameter name. */
static bool user_sets(const char *const *user, const char *name) {
    for (size_t i = 0; user && user[i] && user[i + 1]; i++)
        if (is_mca_option(user[i]) && strcmp(user[i + 1], name) == 0) return true;
    return false;
}

/* The MCA parameter of the launch agent's words (plm_rsh_agent, plm_ssh_agent) that the user's
 * mpirun arguments set too, or NULL: without hvd-bridge's agent no task service is reached. */
static const char *agent_overridden(char *const *agent, const hvd_launch_config *cfg) {
    for (size_t i = 0; agent && agent[i] && agent[i + 1]; i++)
        if (is_mca_option(agent[i]) && user_sets(cfg->mpi_args, agent[i + 1])) return agent[i + 1];
    return NULL;
}

/* Whether w is the placement option opt ("-bind-to"), with one dash or two, or as "--opt=V". */
static bool is_placement(const char *w, const char *opt) {
    const char *name = opt + strspn(opt, "-"), *given = w + strspn(w, "-");
    size_t n = strlen(name);
    return w != given && given - w <= 2 && strncmp(given, name, n) == 0 &&
           (given[n] == '\0' || given[n] == '=');
}

/* Whether the user's mpirun arguments give the placement option opt (--bind-to, --map-by):
 * PRRTE refuses one given twice ("listed more than once"), ORTE takes the last. */
static bool user_places(const char *const *user, const char *opt) {
    for (size_t i = 0; user && user[i]; i++)
        if (is_placement(user[i], opt)) return true;
    return false;
}

/* Adds words to a, but for an MCA parameter the user's mpirun arguments set too: theirs wins
 * (mpirun refuses a parameter given twice: "listed multiple times"). */
static void add_all(hvd_strb *a, char *const *words, const hvd_launch_config *cfg) {
    for (size_t i = 0; words && words[i]; i++) {
        if (is_mca_option(words[i]) && words[i + 1] && words[i + 2] &&
            user_sets(cfg->mpi_args, words[i + 1])) {
            launch_log(cfg, "mpirun's %s %s: the value given in its arguments replaces '%s'",
                       words[i], words[i + 1], words[i + 2]);
            i += 2;
            continue;
        }
        if ((is_placement(words[i], "bind-to") || is_placement(words[i], "map-by")) &&
            words[i + 1] && user_places(cfg->mpi_args, words[i])) {
            launch_log(cfg, "mpirun's %s: the value given in its arguments replaces '%s'", words[i],
                       words[i + 1]);
            i += 1;
            continue;
        }
        hvd_strb_add(a, words[i]);
    }
}

/* The options hvd-bridge's own jobs use besides the parts: output tagged with the rank,
 * ranks placed host by host in -H order (rank 0 on task 0's host) and not bound (the
 * executors share their machines), MPI over the TCP interfaces chosen (Open MPI: ob1 with
 * the shared-memory and TCP transports, not UCX). */
static void add_style(hvd_strb *a, hvd_mpi_impl mpi, const hvd_launch_config *cfg) {
    static const char *const ompi4[] = {"--tag-output",   "-bind-to", "none", "-map-by", "slot",
                                        "-mca",           "pml",      "ob1",  "-mca",    "btl",
                                        "self,vader,tcp", NULL};
    static const char *const ompi5[] = {
        "--bind-to", "none",  "--map-by", "slot",        "--mca", "pml",
        "ob1",       "--mca", "btl",      "self,sm,tcp", NULL}; /* and --output: add_output */
    static const char *const mpich[] = {"-prepend-rank", NULL};
    const char *const *v = mpi == HVD_MPI_OPENMPI4   ? ompi4
                           : mpi == HVD_MPI_OPENMPI5 ? ompi5
                                                     : mpich;
    add_all(a, (char *const *)v, cfg);
}

/* Whether a task declared only addresses of this machine (the driver's): it runs here. Loopback
 * addresses say nothing, so a task with nothing else counts as here too. */
static bool task_is_here(const hvd_task_info *t, const hvd_addr *mine, size_t n_mine) {
    for (size_t i = 0; i < t->addrs.n; i++) {
        const char *h = ((const hvd_addr *)t->addrs.v)[i].host;
        if (strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0) continue;
        bool found = false;
        for (size_t k = 0; k < n_mine && !found; k++)
            found = strcmp(mine[k].host, h) == 0;
        if (!found) return false;
    }
    return true;
}

/* How many of the job's tasks (its ranks) run on the driver's machine. */
static int ranks_here(hvd_driver *d) {
    hvd_addr *mine;
    size_t n_mine, n = 0;
    hvd_task_brief *tasks = NULL;
    if (hvd_driver_addrs(d, &mine, &n_mine, NULL) != 0) return 0;
    int here = 0;
    if (hvd_driver_tasks(d, &tasks, &n, NULL) == 0) {
        for (size_t i = 0; i < n; i++) {
            hvd_task_info t;
            if (!tasks[i].active || hvd_driver_task(d, tasks[i].index, &t, NULL) != 0) continue;
            here += task_is_here(&t, mine, n_mine);
            hvd_msg_free(&hvd_task_info_desc, &t);
        }
    }
    free(tasks);
    free(mine);
    return here;
}

/* Open MPI's ranks wait for messages by polling without ever giving up the CPU. When the ranks
 * on one machine outnumber its CPUs (executors on one machine: --local, a Spark local
 * cluster), a waiting rank takes the CPU the rank it waits for needs: 4 ranks on 2 CPUs took
 * 34 ms per step of a small model instead of 3 ms (docs/performance.md). mpirun would turn on
 * mpi_yield_when_idle itself if it knew, but each executor is a host of its own to it. The
 * driver sees only its own machine: tasks whose addresses are all its own. A value the user
 * gave (OMPI_MCA_mpi_yield_when_idle, or the parameter in --mpi-args) is left alone. */
static void add_yield(hvd_strb *a, hvd_driver *d, const hvd_launch_config *cfg, hvd_mpi_impl mpi) {
    if (mpi == HVD_MPI_MPICH || getenv("OMPI_MCA_mpi_yield_when_idle")) return;
    for (size_t i = 0; cfg->mpi_args && cfg->mpi_args[i]; i++) /* -mca ..., -x OMPI_MCA_... */
        if (strstr(cfg->mpi_args[i], "mpi_yield_when_idle")) return;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cpus <= 0) cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int here = ranks_here(d);
    if (cpus <= 0 || here <= cpus) return;
    launch_log(cfg,
               "%d ranks on this machine's %d CPUs: they yield the CPU when idle "
               "(mpi_yield_when_idle)",
               here, cpus);
    mca(a, mpi == HVD_MPI_OPENMPI4 ? "-mca" : "--mca", "mpi_yield_when_idle", "1");
}

/* DIR, and with np > 0 DIR/1/rank.R for R < np: Hydra and PRRTE open their output files
 * without making their directories. Returns 0, or -1 with err. */
static int make_output_dirs(const char *dir, int np, hvd_err *err) {
    char path[PATH_MAX];
    for (int r = -2; r < np; r++) { /* DIR, DIR/1, then each rank's */
        if (r == -1 && np == 0) break;
        if (r == -2)
            snprintf(path, sizeof path, "%s", dir);
        else if (r == -1)
            snprintf(path, sizeof path, "%s/1", dir);
        else
            snprintf(path, sizeof path, "%s/1/rank.%d", dir, r);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return hvd_err_set(err, HVD_E_IO, "cannot make %s for --output-filename: %s", path,
                               strerror(errno));
    }
    return 0;
}

/* Where the ranks' output goes: tagged with the rank, and to files under cfg->output_dir in
 * each launcher's own way (Open MPI 5 takes both in one --output). Returns 0, or -1 with err. */
static int add_output(hvd_strb *a, hvd_mpi_impl mpi, const hvd_launch_config *cfg, hvd_err *err) {
    const char *dir = cfg->output_dir;
    if (mpi == HVD_MPI_OPENMPI5) {
        /* file=, not dir=: PRRTE 5.0.11's dir= loses the stderr of ranks under a remote prted
         * ("PMIX_ERR_EXISTS", "PMIX_ERR_IOF_FAILURE" on the terminal) */
        if (dir && make_output_dirs(dir, 0, err) != 0) return -1;
        hvd_strb_add(a, "--output");
        if (dir)
            hvd_strb_addf(a, "tag,file=%s/rank", dir);
        else
            hvd_strb_add(a, "tag");
    } else if (dir && mpi == HVD_MPI_OPENMPI4) {
        hvd_strb_add(a, "--output-filename");
        hvd_strb_add(a, dir);
    } else if (dir) {
        if (make_output_dirs(dir, cfg->np, err) != 0) return -1;
        hvd_strb_add(a, "-outfile-pattern");
        hvd_strb_addf(a, "%s/1/rank.%%r/stdout", dir);
        hvd_strb_add(a, "-errfile-pattern");
        hvd_strb_addf(a, "%s/1/rank.%%r/stderr", dir);
    }
    return 0;
}

char **launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                   const hvd_launch_parts *parts, hvd_err *err) {
    char *hosts = hvd_driver_host_list(d, err);
    if (!hosts) return NULL;
    const char *bin = cfg->bin_dir ? cfg->bin_dir : hvd_launch_bin_dir();
    const char *exec_bin = cfg->exec_bin_dir ? cfg->exec_bin_dir : bin;
    bool hydra = parts->mpi == HVD_MPI_MPICH;
    hvd_strb a = {0};
    hvd_strb_add(&a, cfg->mpirun && *cfg->mpirun ? cfg->mpirun : "mpirun");
    if (!hydra && geteuid() == 0) hvd_strb_add(&a, "--allow-run-as-root");
    hvd_strb_add(&a, "-np");
    hvd_strb_addf(&a, "%d", cfg->np);
    hvd_strb_add(&a, hydra ? "-hosts" : "-H");
    hvd_strb_add(&a, hosts);
    add_style(&a, parts->mpi, cfg);
    add_yield(&a, d, cfg, parts->mpi);
    if (add_output(&a, parts->mpi, cfg, err) != 0) {
        hvd_strb_free(&a);
        free(hosts);
        return NULL;
    }
    const char *agent = agent_overridden(parts->agent, cfg);
    if (agent) {
        hvd_err_set(err, HVD_E_INVALID,
                    "the extra mpirun arguments set %s, which hvd-bridge sets to its own agent "
                    "(hvd-rsh: how mpirun reaches the task services): leave it out",
                    agent);
        hvd_strb_free(&a);
        free(hosts);
        return NULL;
    }
    add_all(&a, parts->args, cfg);
    add_all(&a, parts->agent, cfg);
    add_all(&a, parts->ifaces, cfg);
    /* torch.distributed's rendezvous: rank 0 runs for task 0. */
    char master[HVD_HOST_MAX];
    unsigned port;
    if (task0_addr(d, ifaces, master, sizeof master, &port)) {
        launch_rank_env(&a, parts->mpi, "MASTER_ADDR", "%s", master);
        launch_rank_env(&a, parts->mpi, "MASTER_PORT", "%u", port);
    }
    for (size_t i = 0; cfg->mpi_args && cfg->mpi_args[i]; i++)
        hvd_strb_add(&a, cfg->mpi_args[i]);
    hvd_strb_addf(&a, "%s/hvd-exec", exec_bin);
    free(hosts);
    char **argv = hvd_strb_finish(&a);
    if (!argv) hvd_err_set(err, HVD_E_INTERNAL, "out of memory building the mpirun command");
    return argv;
}

char **hvd_launch_argv(hvd_driver *d, const hvd_launch_config *cfg, char *const *ifaces,
                       hvd_err *err) {
    hvd_launch_parts parts;
    if (hvd_launch_parts_make(d, cfg, ifaces, &parts, err) != 0) return NULL;
    char **argv = launch_argv(d, cfg, ifaces, &parts, err);
    hvd_launch_parts_free(&parts);
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

static int stop_value(const hvd_launch_config *cfg) {
    return cfg->stop ? __atomic_load_n(cfg->stop, __ATOMIC_ACQUIRE) : 0;
}

static bool stop_requested(const hvd_launch_config *cfg) {
    return stop_value(cfg) != 0;
}

char **mpirun_env(hvd_driver *d, const hvd_launch_config *cfg, const hvd_launch_parts *parts,
                  const char *tmpdir, hvd_err *err) {
    char **job = hvd_driver_job_env(d, err);
    if (!job) return NULL;
    size_t nparts = hvd_strv_len((const char *const *)parts->env);
    size_t nextra = hvd_strv_len(cfg->extra_env), njob = hvd_strv_len((const char *const *)job);
    size_t total = nparts + nextra + njob;
    hvd_env_change *ch = calloc(total + 2, sizeof *ch);
    char **names = calloc(total + 1, sizeof *names);
    char **envp = NULL, **base = NULL;
    if (!ch || !names) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < total; i++) {
        const char *kv = i < nparts            ? parts->env[i]
                         : i < nparts + nextra ? cfg->extra_env[i - nparts]
                                               : job[i - nparts - nextra];
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
    ch[total] = (hvd_env_change){"TMPDIR", tmpdir};
    extern char **environ;
    /* A caller that called MPI_Init itself (hvd.init() in the Spark driver) must not hand
     * its singleton's variables to mpirun, which would end at once. */
    base = hvd_env_without_mpi_singleton(environ);
    if (!base) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        goto out;
    }
    envp = hvd_env_build(base, ch, total + 1, err);
out:
    free(base);
    hvd_strv_free(names);
    free(ch);
    for (size_t i = 0; job[i]; i++) /* the secret: wipe before freeing */
        memset(job[i], 0, strlen(job[i]));
    hvd_strv_free(job);
    return envp;
}

/* Whether every rank has started (hvd-exec told the driver where it runs) by now, the start
 * timeout after mpirun's start; if not, records why the launch failed. A launcher whose daemons
 * came up but never started the ranks (PRRTE 3.0, Open MPI 5's, did so in about 2% of launches
 * here: docs/launcher.md) would otherwise hold the job until --timeout, or forever. */
static bool ranks_on_time(hvd_driver *d, const hvd_launch_config *cfg, int start_ms) {
    size_t np, started = hvd_driver_ranks_started(d, &np);
    if (started >= np) return true;
    char why[HVD_ERR_MAX];
    snprintf(why, sizeof why,
             "%zu of %zu ranks had started %d s after mpirun began (the start timeout): mpirun "
             "or its daemons stalled before starting the rest, so mpirun was stopped (a start "
             "that is only slow needs a longer one: --start-timeout, start_timeout=)",
             started, np, (start_ms + 999) / 1000);
    launch_log(cfg, "%s", why);
    hvd_driver_launch_failed(d, why);
    return false;
}

/* Stops mpirun, within delay_ms (-1: its usual grace period); the driver blames what fails from
 * now on on this stop, not on the job. */
static void stop_mpirun(hvd_driver *d, hvd_proc *p, int delay_ms) {
    hvd_driver_stopping_job(d);
    if (delay_ms < 0)
        hvd_proc_abort(p);
    else
        hvd_proc_abort_within(p, delay_ms);
}

/* Whether mpirun is being stopped already: one stop at a time, so that the first reason (a
 * stalled start, the timeout, a stop request) is the one reported (a lost task only cuts the
 * kill delay short). */
static bool stopping(const hvd_launch_outcome *out) {
    return out->late || out->timed_out || out->stopped || out->rank_failed;
}

/* Whether a rank failed RANK_FAILED_STOP_MS ago or more while mpirun keeps the others
 * running: Hydra (MPICH) ends nothing when a rank exits non-zero (Open MPI's mpirun aborts the
 * job itself), so a hung rank held the job for ever; the driver then stops mpirun, the failed
 * rank being what it reports. The wait lets the failed rank's last lines through mpiexec.
 * *since: when the failure was first seen (-1: not yet). */
static bool rank_failed_alone(hvd_driver *d, int64_t *since) {
    if (hvd_driver_mpi(d) != HVD_MPI_MPICH || hvd_driver_ranks_failed(d) == 0) return false;
    if (*since < 0) *since = hvd_now_ms();
    return hvd_now_ms() - *since >= RANK_FAILED_STOP_MS;
}

/* Waits for mpirun, stopping it on timeout, a stalled start or *stop. */
static void wait_mpirun(hvd_driver *d, hvd_proc *p, const hvd_launch_config *cfg, int start_ms,
                        hvd_launch_outcome *out) {
    int64_t deadline = cfg->timeout_s > 0 ? hvd_now_ms() + (int64_t)cfg->timeout_s * 1000 : -1;
    int64_t start_deadline = hvd_now_ms() + start_ms; /* -1 once every rank has started */
    int code = 255;
    bool urgent = false;       /* the kill delay was cut short */
    int64_t failed_since = -1; /* rank_failed_alone */
    for (;;) {
        int r = hvd_proc_wait(p, POLL_MS, &code);
        if (r <= 0) {
            if (r < 0) code = 255; /* reaped by someone else: cannot know */
            break;
        }
        if (start_deadline >= 0 && hvd_now_ms() >= start_deadline) {
            start_deadline = -1;
            if (!stopping(out) && !ranks_on_time(d, cfg, start_ms)) {
                out->late = true;
                stop_mpirun(d, p, -1);
            }
        }
        if (!stopping(out) && deadline >= 0 && hvd_now_ms() >= deadline) {
            out->timed_out = true;
            launch_log(cfg, "the job ran past its timeout of %d s; stopping mpirun",
                       cfg->timeout_s);
            stop_mpirun(d, p, -1);
        }
        if (!stopping(out) && stop_requested(cfg)) {
            out->stopped = true;
            stop_mpirun(d, p, -1);
        }
        if (!stopping(out) && rank_failed_alone(d, &failed_since)) {
            out->rank_failed = true;
            launch_log(cfg, "a rank failed and mpiexec keeps the others running: stopping it");
            stop_mpirun(d, p, -1);
        }
        if (!urgent && stop_value(cfg) == HVD_LAUNCH_STOP_LOST) {
            urgent = out->stopped = true;
            launch_log(cfg, "a part of the job is unreachable: mpirun gets SIGKILL in %d ms",
                       HVD_MPIRUN_LOST_KILL_DELAY_MS);
            stop_mpirun(d, p, HVD_MPIRUN_LOST_KILL_DELAY_MS);
        }
    }
    out->status = code;
    out->signal = hvd_proc_exit_signal(p);
}

char *launch_tmpdir_make(hvd_err *err) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *dir = NULL;
    if (asprintf(&dir, "%s/hvd-mpirun.XXXXXX", base) < 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    if (!mkdtemp(dir)) {
        hvd_err_set(err, HVD_E_IO,
                    "cannot make mpirun's temporary directory in %s: %s (set TMPDIR to a "
                    "writable directory)",
                    base, strerror(errno));
        free(dir);
        return NULL;
    }
    return dir;
}

void launch_tmpdir_remove(char *dir) {
    if (!dir) return;
    hvd_remove_tree(dir);
    free(dir);
}

/* Runs argv (mpirun) and waits for it. Returns 0 with the outcome, or -1 with err. */
static int run_mpirun(hvd_driver *d, char **argv, const hvd_launch_config *cfg, int start_ms,
                      const hvd_launch_parts *parts, hvd_launch_outcome *out, hvd_err *err) {
    char *tmpdir = launch_tmpdir_make(err);
    char **envp = tmpdir ? mpirun_env(d, cfg, parts, tmpdir, err) : NULL;
    if (!envp) {
        launch_tmpdir_remove(tmpdir);
        return -1;
    }
    hvd_proc_spec spec = {.argv = argv,
                          .envp = envp,
                          .cleanup_dir = tmpdir,
                          .grace_ms = HVD_MPIRUN_KILL_DELAY_MS,
                          .pass_stdout = true,
                          .stdout_fd = cfg->output_fds ? cfg->output_fds[0] : 1,
                          .pass_stderr = true,
                          .stderr_fd = cfg->output_fds ? cfg->output_fds[1] : 2};
    hvd_proc *p = hvd_proc_start(&spec, err);
    hvd_env_free(envp);
    if (!p) {
        launch_tmpdir_remove(tmpdir);
        return hvd_err_prefix(err, "cannot start %s (is MPI installed?): ", argv[0]);
    }
    wait_mpirun(d, p, cfg, start_ms, out);
    hvd_proc_free(p);
    launch_tmpdir_remove(tmpdir);
    return 0;
}

int hvd_launch_job(hvd_driver *d, const hvd_launch_config *cfg, hvd_launch_outcome *out,
                   hvd_err *err) {
    memset(out, 0, sizeof *out);
    /* mpirun runs the agent, and orted the ranks, from other directories. */
    const char *dirs[2] = {cfg->bin_dir, cfg->exec_bin_dir};
    for (int i = 0; i < 2; i++)
        if (dirs[i] && dirs[i][0] != '/')
            return hvd_err_set(err, HVD_E_INVALID,
                               "the bin dir '%s' is not an absolute path: mpirun's agent and the "
                               "ranks start in other directories",
                               dirs[i]);
    int start_ms =
        cfg->start_timeout_ms > 0 ? cfg->start_timeout_ms : HVD_START_TIMEOUT_DEFAULT_S * 1000;
    char **ifaces = NULL, **argv = NULL;
    hvd_launch_parts parts = {0};
    int rc = -1;
    if (hvd_mpi_check_named(cfg->mpi, cfg->mpirun, err) != 0 ||
        hvd_driver_wait_registration(d, start_ms, err) != 0 ||
        hvd_driver_common_interfaces(d, start_ms, &ifaces, err) != 0 ||
        hvd_launch_parts_make(d, cfg, ifaces, &parts, err) != 0)
        goto out;
    if (!(argv = launch_argv(d, cfg, ifaces, &parts, err))) goto out;
    if (cfg->log) {
        launch_log(cfg, "MPI: %s%s%s%s", hvd_mpi_impl_name(parts.mpi), parts.version[0] ? " (" : "",
                   parts.version, parts.version[0] ? ")" : "");
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
    rc = run_mpirun(d, argv, cfg, start_ms, &parts, out, err);
    /* Ranks stopped as the job ended may still be reporting so (hvd-exec's stop watcher). */
    if (rc == 0 && out->status != 0) hvd_driver_wait_results(d, HVD_LATE_RESULTS_MS);
out:
    hvd_launch_parts_free(&parts);
    hvd_strv_free(ifaces);
    hvd_launch_free_argv(argv);
    return rc;
}
