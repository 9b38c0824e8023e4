/* hvd-rsh (also installed as mpirun_rsh): the remote-shell agent of hvd-bridge for the MPI
 * launchers that start their per-host daemon through ssh: Open MPI 4's mpirun (plm_rsh_agent:
 * orted), Open MPI 5's prterun (plm_ssh_agent: exports, then prted) and MPICH's Hydra
 * (-launcher-exec: hydra_pmi_proxy). All three pass an ssh-style argv whose words a shell runs.
 *
 * The launcher runs `hvd-rsh [ssh options] HOST [ssh options] WORDS...` once per remote host. In
 * RPC mode HOST is a host hash and the joined words run in the task service that stands for
 * it; in ssh mode (plain hosts, or --ssh) they run over ssh (libssh2). Either way hvd-rsh
 * stays attached like ssh and exits with the remote exit status; it never exits 0 without
 * having run the command, because mpirun would then wait forever.
 *
 * This file: the command line, the signal pipe (common/sig.h) and the choice of mode. RPC
 * mode is rsh_rpc.c (over rpc/), ssh mode is the ssh/ part (rsh_agent/README.md). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/io.h"
#include "common/sig.h"
#include "hvd/proto.h"
#include "rsh_rpc.h"
#include "ssh/args.h"
#include "ssh/transport.h"

/* Exit status for failures of the agent itself, as ssh uses. */
#define RSH_FAILED 255

static const char USAGE[] =
    "usage: hvd-rsh [--verbose] [--ssh | --rpc] [ssh options] HOST [ssh options] COMMAND...\n"
    "\n"
    "Runs COMMAND on HOST for an MPI launcher, like ssh: plug it in with\n"
    "  mpirun -mca plm_rsh_agent hvd-rsh ...            (Open MPI 4: orted)\n"
    "  mpirun --prtemca plm_ssh_agent hvd-rsh ...       (Open MPI 5: prted)\n"
    "  mpiexec -launcher ssh -launcher-exec hvd-rsh ... (MPICH, Intel MPI: hydra_pmi_proxy)\n"
    "The words of COMMAND are joined with single spaces and run by /bin/sh -c on the far\n"
    "side. hvd-rsh stays attached until the command ends: its output comes back on\n"
    "hvd-rsh's stdout and stderr, SIGTERM, SIGINT or SIGHUP abort it, and hvd-rsh exits with\n"
    "its exit status (128+N if it was killed by signal N).\n"
    "\n"
    "Modes:\n"
    "  RPC (when HVD_DRIVER_ADDRS is set): HOST is a host hash. The driver names the task\n"
    "      service with the lowest index on that host, and the command runs inside it (in\n"
    "      the executor), in its own process group, killed with it.\n"
    "  ssh (when HVD_DRIVER_ADDRS is unset, when the driver knows no task for HOST, or with\n"
    "      --ssh): the command runs over ssh (libssh2), with host keys checked against\n"
    "      ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts.\n"
    "\n"
    "Options:\n"
    "  --verbose   print the arguments received and the command run, to stderr\n"
    "              (also: HVD_RSH_VERBOSE=1 in the environment)\n"
    "  --ssh       always use ssh\n"
    "  --rpc       always use RPC; an unknown host hash is an error, not a fallback\n"
    "  --help      this text\n"
    "ssh options, before or after HOST: -p PORT, -l USER, USER@HOST, -i FILE, -q, -v, -x,\n"
    "  -o StrictHostKeyChecking=yes|accept-new|no, -o UserKnownHostsFile=F,\n"
    "  -o ConnectTimeout=S, -o Port=P, -o User=U, -o IdentityFile=F; other ssh flags are\n"
    "  accepted and ignored. In RPC mode user and port do not apply.\n"
    "\n"
    "Environment:\n"
    "  HVD_DRIVER_ADDRS   the driver's addresses (hvd-driver sets it); set: RPC mode\n"
    "  HVD_SECRET         RPC mode: the job secret, base64\n"
    "  HVD_SECRET_FILE    RPC mode: a file holding it, when HVD_SECRET is unset or empty\n"
    "  HVD_RSH_VERBOSE    set and not 0: as --verbose\n"
    "  SSH_AUTH_SOCK      ssh mode: the ssh-agent whose keys are tried first\n"
    "  HOME               ssh mode: where ~ is (known_hosts, key files); else the passwd entry\n"
    "  USER, LOGNAME      ssh mode: the login name, when there is no -l/USER@ and the\n"
    "                     passwd entry has none\n"
    "\n"
    "Exit status: the remote command's, or 255 if hvd-rsh could not run it (with a one-line\n"
    "reason on stderr naming the host and the cause).\n";

/* What hvd-rsh's own options (and HVD_RSH_VERBOSE) asked for. */
typedef struct rsh_opts {
    int verbose;    /* --verbose, or HVD_RSH_VERBOSE set and not "0" */
    bool force_ssh; /* --ssh */
    bool force_rpc; /* --rpc */
    int first;      /* argv index of the first word that is not one of our options */
} rsh_opts;

/* Prints the argv received as one line, written at once so that the lines of agents that
 * mpirun runs side by side do not mix. */
static void print_argv(int argc, char **argv) {
    size_t len = 64;
    for (int i = 0; i < argc; i++)
        len += strlen(argv[i]) + 3;
    char *line = malloc(len);
    if (!line) return;
    size_t n = (size_t)snprintf(line, len, "hvd-rsh: received %d arguments:", argc - 1);
    for (int i = 0; i < argc; i++)
        n += (size_t)snprintf(line + n, len - n, " [%s]", argv[i]);
    snprintf(line + n, len - n, "\n");
    (void)hvd_write_all(STDERR_FILENO, line, strlen(line));
    free(line);
}

/* Which MPI daemon the command starts, for messages: the first of the known program names that
 * stands as a word of its own or ends a path (orted, "/x/prted", "\"/x/hydra_pmi_proxy\""). */
static const char *daemon_of(const char *command) {
    static const char *const names[][2] = {{"orted", "orted (Open MPI 4)"},
                                           {"prted", "prted (Open MPI 5)"},
                                           {"hydra_pmi_proxy", "hydra_pmi_proxy (MPICH)"}};
    const char *best = NULL, *best_at = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len = strlen(names[i][0]);
        for (const char *p = strstr(command, names[i][0]); p; p = strstr(p + 1, names[i][0])) {
            bool starts = p == command || strchr(" /\";", p[-1]);
            bool ends = !p[len] || strchr(" \";", p[len]);
            if (starts && ends) {
                if (!best_at || p < best_at) best = names[i][1], best_at = p;
                break;
            }
        }
    }
    return best ? best : "the command";
}

/* Reads our own long options, which come first, before anything Open MPI adds. Returns 0 to
 * go on, 1 when --help was printed, or -1 after printing why on stderr. */
static int parse_own_options(int argc, char **argv, rsh_opts *o) {
    memset(o, 0, sizeof *o);
    const char *env_verbose = getenv("HVD_RSH_VERBOSE");
    if (env_verbose && *env_verbose && strcmp(env_verbose, "0") != 0) o->verbose = 1;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0 && argv[i][2]; i++) {
        if (!strcmp(argv[i], "--verbose")) {
            o->verbose = 1;
        } else if (!strcmp(argv[i], "--ssh")) {
            o->force_ssh = true;
        } else if (!strcmp(argv[i], "--rpc")) {
            o->force_rpc = true;
        } else if (!strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 1;
        } else {
            fprintf(stderr, "hvd-rsh: unknown option %s (see hvd-rsh --help)\n", argv[i]);
            return -1;
        }
    }
    o->first = i;
    return 0;
}

/* Parses the ssh-style rest of the command line (host, ssh options, command words) and
 * checks that there is a command. Returns 0, or -1 after printing why on stderr (args is then
 * freed). */
static int parse_ssh_words(int argc, char **argv, const rsh_opts *o, hvd_ssh_args *args) {
    /* The ssh parser wants a program name in front: put ours just before the first word. */
    argv[o->first - 1] = argv[0];
    hvd_err err = {0};
    if (hvd_ssh_args_parse(argc - o->first + 1, argv + o->first - 1, args, &err) != 0) {
        fprintf(stderr, "hvd-rsh: %s (see hvd-rsh --help)\n", err.msg);
        hvd_ssh_args_free(args);
        return -1;
    }
    if (!args->command || !*args->command) {
        fprintf(stderr,
                "hvd-rsh: %s: no command given: hvd-rsh runs a command like ssh does; "
                "interactive sessions are not supported\n",
                args->host);
        hvd_ssh_args_free(args);
        return -1;
    }
    if (o->verbose)
        fprintf(stderr, "hvd-rsh: host [%s] runs %s: [%s]\n", args->host, daemon_of(args->command),
                args->command);
    return 0;
}

/* Runs the command over ssh. Returns its exit status, or RSH_FAILED with err. */
static int run_ssh(const hvd_ssh_args *args, int verbose, int sig_fd, hvd_err *err) {
    hvd_ssh_options opt;
    hvd_ssh_options_init(&opt);
    hvd_ssh_options_from_args(&opt, args);
    if (verbose > opt.verbose) opt.verbose = verbose;
    int code = RSH_FAILED;
    if (hvd_ssh_run(&opt, args->command, STDOUT_FILENO, STDERR_FILENO, sig_fd, &code, err) < 0)
        return RSH_FAILED;
    return code;
}

/* ssh mode. Returns the exit status; a failure is reported on stderr. */
static int ssh_mode(const hvd_ssh_args *args, const rsh_opts *o, int sig_fd) {
    hvd_err err = {0};
    int status = run_ssh(args, o->verbose, sig_fd, &err);
    if (err.msg[0]) fprintf(stderr, "hvd-rsh: %s\n", err.msg);
    return status;
}

/* RPC mode, falling back to ssh for a host the driver does not know (unless --rpc). Returns
 * the exit status; a failure is reported on stderr. */
static int rpc_mode(const hvd_ssh_args *args, const rsh_opts *o, int sig_fd) {
    hvd_err err = {0}, ssh_err = {0};
    int code = 0;
    int rc = hvd_rsh_rpc_run(args->host, args->command, sig_fd, o->verbose, &code, &err);
    if (rc == 0) return code;
    if (rc == HVD_RSH_UNKNOWN_HOST && !o->force_rpc) {
        /* Not a host hash of this job: maybe a plain host, as with horovodrun. */
        if (o->verbose) fprintf(stderr, "hvd-rsh: %s: %s; trying ssh\n", args->host, err.msg);
        int status = run_ssh(args, o->verbose, sig_fd, &ssh_err);
        if (ssh_err.msg[0])
            fprintf(stderr, "hvd-rsh: %s: not a host hash of this job (%s), and ssh failed: %s\n",
                    args->host, err.msg, ssh_err.msg);
        return status;
    }
    if (rc == HVD_RSH_LOST)
        fprintf(stderr, "hvd-rsh: %s: lost the task service while the command ran: %s\n",
                args->host, err.msg);
    else
        fprintf(stderr, "hvd-rsh: %s: cannot run %s: %s\n", args->host, daemon_of(args->command),
                err.msg);
    return RSH_FAILED;
}

int main(int argc, char **argv) {
    rsh_opts o;
    int rc = parse_own_options(argc, argv, &o);
    if (rc != 0) return rc > 0 ? 0 : RSH_FAILED;
    if (o.verbose) print_argv(argc, argv);
    if (o.force_ssh && o.force_rpc) {
        fprintf(stderr, "hvd-rsh: --ssh and --rpc exclude each other\n");
        return RSH_FAILED;
    }
    hvd_ssh_args args;
    if (parse_ssh_words(argc, argv, &o, &args) != 0) return RSH_FAILED;
    /* SIGTERM, SIGINT and SIGHUP make the signal pipe readable; both modes watch it and abort
     * the remote command, then still wait for its exit status. */
    hvd_err err = {0};
    int sig_fd = hvd_signals_install(&err);
    if (sig_fd < 0) {
        fprintf(stderr, "hvd-rsh: %s\n", err.msg);
        hvd_ssh_args_free(&args);
        return RSH_FAILED;
    }
    const char *driver = getenv(HVD_DRIVER_ADDRS_ENV);
    bool rpc = !o.force_ssh && (o.force_rpc || (driver && *driver));
    int status = rpc ? rpc_mode(&args, &o, sig_fd) : ssh_mode(&args, &o, sig_fd);
    hvd_ssh_args_free(&args);
    return status;
}
