/* hvd-rsh (also installed as mpirun_rsh): Open MPI's remote-shell agent for hvd-bridge.
 *
 * mpirun runs `hvd-rsh [ssh options] HOST [ssh options] WORDS...` once per remote host. In
 * RPC mode HOST is a host hash and the joined words run in the task service that stands for
 * it; in ssh mode (plain hosts, or --ssh) they run over ssh (libssh2). Either way hvd-rsh
 * stays attached like ssh and exits with the remote exit status; it never exits 0 without
 * having run the command, because mpirun would then wait forever. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd/proto.h"
#include "rsh_rpc.h"
#include "ssh/args.h"
#include "ssh/transport.h"

/* Exit status for failures of the agent itself, as ssh uses. */
#define RSH_FAILED 255

static const char USAGE[] =
    "usage: hvd-rsh [--verbose] [--ssh | --rpc] [ssh options] HOST [ssh options] COMMAND...\n"
    "\n"
    "Runs COMMAND on HOST for Open MPI's mpirun, like ssh: plug it in with\n"
    "  mpirun -mca plm_rsh_agent hvd-rsh ...\n"
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
    "  HVD_DRIVER_ADDRS   the driver's addresses (hvd-driver sets it)\n"
    "  HVD_SECRET         the job secret, base64 (or HVD_SECRET_FILE: a file holding it)\n"
    "\n"
    "Exit status: the remote command's, or 255 if hvd-rsh could not run it (with a one-line\n"
    "reason on stderr naming the host and the cause).\n";

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    (void)sig;
    int saved = errno;
    if (sig_pipe[1] >= 0) (void)!write(sig_pipe[1], "x", 1);
    errno = saved;
}

static int install_signals(void) {
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

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
    (void)!write(STDERR_FILENO, line, strlen(line));
    free(line);
}

/* Runs the command over ssh. Returns its exit status, or RSH_FAILED with err. */
static int run_ssh(const hvd_ssh_args *args, int verbose, hvd_err *err) {
    hvd_ssh_options opt;
    hvd_ssh_options_init(&opt);
    hvd_ssh_options_from_args(&opt, args);
    if (verbose > opt.verbose) opt.verbose = verbose;
    int code = RSH_FAILED;
    if (hvd_ssh_run(&opt, args->command, STDOUT_FILENO, STDERR_FILENO, sig_pipe[0], &code, err) < 0)
        return RSH_FAILED;
    return code;
}

int main(int argc, char **argv) {
    int verbose = 0, force_ssh = 0, force_rpc = 0;
    const char *env_verbose = getenv("HVD_RSH_VERBOSE");
    if (env_verbose && *env_verbose && strcmp(env_verbose, "0") != 0) verbose = 1;
    /* Our own long options come first, before anything Open MPI adds. */
    int first = 1;
    for (; first < argc && strncmp(argv[first], "--", 2) == 0 && argv[first][2]; first++) {
        if (!strcmp(argv[first], "--verbose")) {
            verbose = 1;
        } else if (!strcmp(argv[first], "--ssh")) {
            force_ssh = 1;
        } else if (!strcmp(argv[first], "--rpc")) {
            force_rpc = 1;
        } else if (!strcmp(argv[first], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else {
            fprintf(stderr, "hvd-rsh: unknown option %s (see hvd-rsh --help)\n", argv[first]);
            return RSH_FAILED;
        }
    }
    if (verbose) print_argv(argc, argv);
    if (force_ssh && force_rpc) {
        fprintf(stderr, "hvd-rsh: --ssh and --rpc exclude each other\n");
        return RSH_FAILED;
    }
    argv[first - 1] = argv[0];
    hvd_ssh_args args;
    hvd_err err = {0};
    if (hvd_ssh_args_parse(argc - first + 1, argv + first - 1, &args, &err) != 0) {
        fprintf(stderr, "hvd-rsh: %s (see hvd-rsh --help)\n", err.msg);
        hvd_ssh_args_free(&args);
        return RSH_FAILED;
    }
    if (!args.command || !*args.command) {
        fprintf(stderr,
                "hvd-rsh: %s: no command given: hvd-rsh runs a command like ssh does; "
                "interactive sessions are not supported\n",
                args.host);
        hvd_ssh_args_free(&args);
        return RSH_FAILED;
    }
    if (verbose) fprintf(stderr, "hvd-rsh: host [%s] command [%s]\n", args.host, args.command);
    if (install_signals() != 0) {
        fprintf(stderr, "hvd-rsh: cannot create a pipe: %s\n", strerror(errno));
        hvd_ssh_args_free(&args);
        return RSH_FAILED;
    }

    int status = RSH_FAILED;
    const char *driver = getenv(HVD_DRIVER_ADDRS_ENV);
    hvd_err ssh_err = {0};
    if (!force_ssh && (force_rpc || (driver && *driver))) {
        int code = 0;
        int rc = hvd_rsh_rpc_run(args.host, args.command, sig_pipe[0], verbose, &code, &err);
        if (rc == 0) {
            status = code;
        } else if (rc == HVD_RSH_UNKNOWN_HOST && !force_rpc) {
            /* Not a host hash of this job: maybe a plain host, as with horovodrun. */
            if (verbose) fprintf(stderr, "hvd-rsh: %s: %s; trying ssh\n", args.host, err.msg);
            status = run_ssh(&args, verbose, &ssh_err);
            if (ssh_err.msg[0])
                fprintf(stderr,
                        "hvd-rsh: %s: not a host hash of this job (%s), and ssh failed: %s\n",
                        args.host, err.msg, ssh_err.msg);
        } else if (rc == HVD_RSH_LOST) {
            fprintf(stderr, "hvd-rsh: %s: lost the task service while the command ran: %s\n",
                    args.host, err.msg);
        } else {
            fprintf(stderr, "hvd-rsh: %s: cannot run the command: %s\n", args.host, err.msg);
        }
    } else {
        status = run_ssh(&args, verbose, &ssh_err);
        if (ssh_err.msg[0]) fprintf(stderr, "hvd-rsh: %s\n", ssh_err.msg);
    }
    hvd_ssh_args_free(&args);
    return status;
}
