/* hvd-driver's command line: getopt_long_only (so -np works as well as --np), numbers
 * validated, defaults from include/hvd/defaults.h. */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/num.h"
#include "launcher.h"

static const char USAGE[] =
    "usage: hvd-driver run -np N [--local H | --ssh-hosts H:S,...] [options]\n"
    "                      (--entry LIB.so:SYMBOL [--entry-arg S] | -- COMMAND [ARGS...])\n"
    "       hvd-driver serve -np N --env-file FILE [options] (--entry ... | -- COMMAND ...)\n"
    "\n"
    "Runs an MPI job whose ranks live inside task services (executors), through mpirun and\n"
    "hvd-rsh instead of ssh.\n"
    "\n"
    "run: starts the driver service, waits for N task services to register, has them probe\n"
    "  each other for the network interfaces they share, runs the MPI launcher with hvd-rsh\n"
    "  as its remote-shell agent, in its own dialect (--mpi):\n"
    "    openmpi4  mpirun -H <host hash>:<slots>,... -mca plm_rsh_agent hvd-rsh ... hvd-exec\n"
    "    openmpi5  mpirun -H ... --prtemca plm_ssh_agent hvd-rsh ... hvd-exec\n"
    "    mpich     mpiexec -hosts ... -launcher ssh -launcher-exec hvd-rsh ... hvd-exec\n"
    "  and waits for it. Each rank (hvd-exec) runs the entry point; its output reaches this\n"
    "  terminal tagged with its rank. At the end a table gives each rank's task, host hash,\n"
    "  status and error text.\n"
    "  With --local H the N task services are started here, on H fake hosts (the embedded\n"
    "  default for trying things out; under Open MPI 5, H > 1 needs root: each fake host\n"
    "  gets a hostname of its own), and the ranks run in this working directory; without\n"
    "  it, hvd-driver prints how to start them elsewhere and waits.\n"
    "  With --ssh-hosts the task services are started over ssh on plain hosts (no Spark):\n"
    "  one hvd-task per slot, numbered host by host in the order given, stopped at the end.\n"
    "serve: starts the driver service, waits for the N tasks, and writes FILE for the shell:\n"
    "  HVD_DRIVER_ADDRS, HVD_SECRET_FILE, HVD_MPI, HVD_MPIRUN, HVD_HOSTS_OPT, HVD_HOSTS,\n"
    "  HVD_IFACES, HVD_RSH, HVD_EXEC, HVD_NP, and the launcher's options HVD_AGENT_ARGS,\n"
    "  HVD_MPIRUN_ARGS and HVD_IFACE_ARGS, so that you can type your own\n"
    "    . FILE; \"$HVD_MPIRUN\" -np $HVD_NP $HVD_HOSTS_OPT \"$HVD_HOSTS\" $HVD_AGENT_ARGS \\\n"
    "        $HVD_MPIRUN_ARGS $HVD_IFACE_ARGS \"$HVD_EXEC\" < /dev/null\n"
    "  (docs/launcher.md spells it out per MPI). It exits once every rank reported a result\n"
    "  (printing the table), or on Ctrl-C; with --jobs N it serves N jobs (mpirun runs) one\n"
    "  after another, a table after each, over the same task services or new ones.\n"
    "\n"
    "Options:\n"
    "  -np, --num-proc N   number of tasks, and of ranks (one rank per task); with\n"
    "                      --ssh-hosts, the number of slots by default\n"
    "  --local H           start the N task services on this machine, on H fake hosts\n"
    "                      (run only: serve waits for task services started elsewhere)\n"
    "  --ssh-hosts LIST    start the task services over ssh: LIST is [user@]host[:slots],...\n"
    "                      (slots default 1; N must not exceed their sum). The secret goes\n"
    "                      through each session's stdin, never on a command line\n"
    "  --ssh-port P        ssh port (default 22)\n"
    "  --ssh-user U        login name (default: yours; user@host in LIST wins)\n"
    "  --ssh-identity F    private key file, tried after ssh-agent's keys (default\n"
    "                      ~/.ssh/id_ed25519, id_ecdsa, id_rsa); also -i,\n"
    "                      --ssh-identity-file\n"
    "  --ssh-known-hosts F known_hosts file (default ~/.ssh/known_hosts, and\n"
    "                      /etc/ssh/ssh_known_hosts); host keys are always checked\n"
    "  --ssh-accept-new    add unknown host keys to it (a changed key is still refused)\n"
    "  --ssh-bin-dir DIR   where hvd-task and hvd-exec are on the hosts (default: the\n"
    "                      directory of this hvd-driver)\n"
    "  --ssh-fake-hosts    for tests: the hosts are all this machine (loopback addresses);\n"
    "                      give each its own host hash and Open MPI shared-memory directory\n"
    "  --entry LIB.so:SYM  entry point: a shared object shipped to the ranks as bytes, SYM an\n"
    "                      hvd_entry_fn (include/hvd/entry.h)\n"
    "  --entry-arg STR     argument bytes for the shared-object entry point\n"
    "  -- COMMAND ARGS     entry point: a program each rank runs (found in PATH)\n"
    "  --payload FILE      give the program FILE's bytes on descriptor 3 ($HVD_PAYLOAD_FD);\n"
    "                      what it writes to descriptor 4 ($HVD_RESULT_FD) is its rank's\n"
    "                      result (--results-json result_hex)\n"
    "  --lifeline-fd N     descriptor N is the read end of a pipe whose write end the\n"
    "                      program that starts hvd-driver keeps open: when it closes (that\n"
    "                      program is gone, even by SIGKILL), the job is stopped as by\n"
    "                      SIGTERM and the --payload and --results-json files are removed\n"
    "  --lifeline-dir DIR  with --lifeline-fd: the starter's private directory (holding those\n"
    "                      files), removed with what is in it when the starter is gone\n"
    "  --timeout S         stop the job after S seconds (default: none)\n"
    "  --start-timeout S   time for tasks to register, and for every rank to start once\n"
    "                      mpirun runs: else mpirun is stopped (default 120)\n"
    "  --net-timeout S     a task service the driver hears nothing from for about S seconds\n"
    "                      (TCP keepalive) is lost, e.g. behind a network partition: the job\n"
    "                      stops, naming it; tasks end their command when they lose the\n"
    "                      driver that long (default 15, or HVD_NET_TIMEOUT; local and ssh\n"
    "                      tasks get it, start other tasks with --net-timeout S as well)\n"
    "  --nics a,b          use these interfaces (every host must have them); skip probing\n"
    "  --jobs N            serve: N jobs one after another (0: until Ctrl-C; default 1).\n"
    "                      Tasks started by hand with --elastic stay for the next job;\n"
    "                      without it each runs one command and is let go: serve waits\n"
    "                      for new ones at their indices before the next job\n"
    "  --bind ADDR         listen only there: a numeric address, or an interface name such\n"
    "                      as lo (default: every interface); --local task services too\n"
    "  --mpi IMPL          whose launcher runs the job, and so which command line:\n"
    "                      openmpi4 (Open MPI <= 4.1: -mca plm_rsh_agent, orted),\n"
    "                      openmpi5 (Open MPI 5, PRRTE: --prtemca plm_ssh_agent, prted),\n"
    "                      mpich (MPICH, Intel MPI: Hydra's -launcher-exec, hydra_pmi_proxy)\n"
    "                      or auto (the default: ask the launcher, mpirun --version);\n"
    "                      --mpi with no such name after it is horovodrun's flag (MPI\n"
    "                      is all hvd-bridge runs)\n"
    "  --mpirun PATH       the launcher to run (default: mpirun in PATH)\n"
    "  --mpi-arg ARG       pass ARG to mpirun (repeat for several words)\n"
    "  --results-json FILE write every rank's result as JSON\n"
    "  --verbose           print the mpirun command and progress\n"
    "  --quiet             no results table at the end (a failure is still named)\n"
    "  --help, -h          this text\n"
    "  --version, -v       hvd-driver's version\n"
    "\n"
    "Environment: the job secret is created here and passed only in the environment\n"
    "(HVD_SECRET) and in a 0600 file; it never appears on a command line.\n"
    "  HVD_BIN_DIR       where hvd-rsh, hvd-exec and hvd-task are (default: the directory of\n"
    "                    this hvd-driver)\n"
    "  HVD_NET_TIMEOUT   the default of --net-timeout, in seconds\n"
    "  HVD_KEEPER        the program that keeps each command (mpirun, local task services):\n"
    "                    default hvd-keeper in HVD_BIN_DIR or beside hvd-driver; 'none': a\n"
    "                    forked copy of hvd-driver\n"
    "  HVD_WARM_PYTHON, HVD_WARM_IMPORTS\n"
    "                    a warm interpreter in every task service (hvd-task --warm-python,\n"
    "                    --warm-imports): the local ones inherit them, --ssh passes them on\n"
    "                    hvd-task's command line (docs/elastic.md)\n"
    "\n"
    "Exit status: 0 if every rank succeeded; else the first failed rank's status (or 1), with\n"
    "a line naming that rank, its task, its host and its error text.\n"
    "\n"
    "Example:\n"
    "  hvd-driver run -np 4 --local 2 -- hostname\n"
    "  hvd-driver run -np 4 --ssh-hosts node1:2,node2:2 --entry ./train.so:train\n";

enum {
    OPT_NP = 1000,
    OPT_LOCAL,
    OPT_TIMEOUT,
    OPT_START_TIMEOUT,
    OPT_NET_TIMEOUT,
    OPT_RESULTS_JSON,
    OPT_ENV_FILE,
    OPT_JOBS,
    OPT_MPI_ARG,
    OPT_MPI,
    OPT_MPIRUN,
    OPT_NICS,
    OPT_BIND,
    OPT_ENTRY,
    OPT_ENTRY_ARG,
    OPT_SSH_HOSTS,
    OPT_SSH_PORT,
    OPT_SSH_USER,
    OPT_SSH_IDENTITY,
    OPT_SSH_KNOWN_HOSTS,
    OPT_SSH_ACCEPT_NEW,
    OPT_SSH_BIN_DIR,
    OPT_SSH_FAKE_HOSTS,
    OPT_SSH_O,
    OPT_VERBOSE,
    OPT_QUIET,
    OPT_PAYLOAD,
    OPT_LIFELINE_FD,
    OPT_LIFELINE_DIR,
    OPT_HELP,
};

static const struct option LONG_OPTS[] = {
    {"np", required_argument, NULL, OPT_NP},
    {"num-proc", required_argument, NULL, OPT_NP}, /* horovodrun's long name */
    {"local", required_argument, NULL, OPT_LOCAL},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"start-timeout", required_argument, NULL, OPT_START_TIMEOUT},
    {"net-timeout", required_argument, NULL, OPT_NET_TIMEOUT},
    {"results-json", required_argument, NULL, OPT_RESULTS_JSON},
    {"env-file", required_argument, NULL, OPT_ENV_FILE},
    {"jobs", required_argument, NULL, OPT_JOBS},
    {"mpi-arg", required_argument, NULL, OPT_MPI_ARG},
    {"mpi", required_argument, NULL, OPT_MPI},
    {"mpirun", required_argument, NULL, OPT_MPIRUN},
    {"nics", required_argument, NULL, OPT_NICS},
    {"bind", required_argument, NULL, OPT_BIND},
    {"entry", required_argument, NULL, OPT_ENTRY},
    {"entry-arg", required_argument, NULL, OPT_ENTRY_ARG},
    {"ssh-hosts", required_argument, NULL, OPT_SSH_HOSTS},
    {"ssh-port", required_argument, NULL, OPT_SSH_PORT},
    {"ssh-user", required_argument, NULL, OPT_SSH_USER},
    {"ssh-identity", required_argument, NULL, OPT_SSH_IDENTITY},
    {"ssh-identity-file", required_argument, NULL, OPT_SSH_IDENTITY}, /* horovodrun's */
    {"i", required_argument, NULL, OPT_SSH_IDENTITY},
    {"ssh-known-hosts", required_argument, NULL, OPT_SSH_KNOWN_HOSTS},
    {"ssh-accept-new", no_argument, NULL, OPT_SSH_ACCEPT_NEW},
    {"ssh-bin-dir", required_argument, NULL, OPT_SSH_BIN_DIR},
    {"ssh-fake-hosts", no_argument, NULL, OPT_SSH_FAKE_HOSTS},
    /* ssh's -o: refused by name (as a prefix it would be taken for --output-filename) */
    {"o", required_argument, NULL, OPT_SSH_O},
    {"verbose", no_argument, NULL, OPT_VERBOSE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"payload", required_argument, NULL, OPT_PAYLOAD},
    {"lifeline-fd", required_argument, NULL, OPT_LIFELINE_FD},
    {"lifeline-dir", required_argument, NULL, OPT_LIFELINE_DIR},
    {"help", no_argument, NULL, OPT_HELP},
    {"h", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static void print_usage(void) {
    fputs(USAGE, stdout);
    fputs(ELASTIC_USAGE, stdout);
}

/* LONG_OPTS followed by launcher_elastic_opts.c's and launcher_horovodrun.c's options; NULL
 * if they do not fit (a bug, said by the caller). */
static const struct option *all_options(void) {
    static struct option all[sizeof LONG_OPTS / sizeof LONG_OPTS[0] + 128];
    const struct option *parts[] = {LONG_OPTS, ELASTIC_LONG_OPTS, horovodrun_flag_options()};
    size_t n = 0;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (size_t i = 0; parts[p][i].name; i++) {
            if (n + 1 >= sizeof all / sizeof all[0]) return NULL;
            all[n++] = parts[p][i];
        }
    all[n] = (struct option){NULL, 0, NULL, 0};
    return all;
}

static int usage_error(const char *what) {
    fprintf(stderr, "hvd-driver: %s (see hvd-driver --help)\n", what);
    return 2;
}

/* A number option: validated, or a usage error naming it. */
static int number(const char *opt, const char *text, int min, int max, int *out) {
    hvd_err err;
    return hvd_parse_int(text, min, max, opt, out, &err) == 0 ? 0 : usage_error(err.msg);
}

/* --mpi IMPL, or horovodrun's flag --mpi ("use MPI", what hvd-bridge always does) when the
 * word after it names no MPI: that word is then read again, as an option or as the command
 * (horovodrun -np 4 --mpi python train.py). A word that looks like a misspelt MPI is refused. */
static int take_mpi(const char *v, char **argv, launch_opts *o) {
    if (hvd_mpi_impl_parse(v, &o->mpi) == 0) return 0;
    bool separate = v == argv[optind - 1]; /* not --mpi=WORD */
    static const char *const mpi_words[] = {"openmpi", "open-mpi", "open_mpi", "ompi", "mpich",
                                            "mvapich", "intel",    "impi",     "hpcx", "spectrum"};
    bool mpi_like = false; /* an MPI's name, not the command after horovodrun's bare --mpi */
    for (size_t i = 0; i < sizeof mpi_words / sizeof *mpi_words; i++)
        mpi_like |= !strncasecmp(v, mpi_words[i], strlen(mpi_words[i]));
    if (!separate || mpi_like)
        return usage_error("--mpi must be openmpi4, openmpi5, mpich (also Intel MPI and MVAPICH, "
                           "Hydra's) or auto");
    optind--;
    return 0;
}

/* One option. Returns 0, or the exit status. */
static int take(int c, const char *v, int argc, char **argv, launch_opts *o) {
    switch (c) {
    case OPT_NP:
        return number("-np", v, 1, 1 << 20, &o->np);
    case OPT_LOCAL:
        return number("--local", v, 1, 1 << 20, &o->local_hosts);
    case OPT_TIMEOUT:
        return number("--timeout", v, 0, 1 << 30, &o->timeout_s);
    case OPT_START_TIMEOUT:
        return number("--start-timeout", v, 1, 1 << 30, &o->start_timeout_s);
    case OPT_NET_TIMEOUT:
        return number("--net-timeout", v, 1, HVD_NET_TIMEOUT_MAX_S, &o->net_timeout_s);
    case OPT_SSH_PORT:
        return number("--ssh-port", v, 1, 65535, &o->ssh_port);
    case OPT_MPI_ARG:
        hvd_strb_add(&o->mpi_argb, v);
        return 0;
    case OPT_MPI:
        return take_mpi(v, argv, o);
    case OPT_MPIRUN:
        o->mpirun = v;
        return 0;
    case OPT_RESULTS_JSON:
        o->results_json = v;
        return 0;
    case OPT_ENV_FILE:
        o->env_file = v;
        return 0;
    case OPT_JOBS:
        return number("--jobs", v, 0, 1 << 30, &o->jobs);
    case OPT_NICS:
        o->nics = v;
        return 0;
    case OPT_BIND:
        o->bind = v;
        return 0;
    case OPT_ENTRY:
        o->entry = v;
        return 0;
    case OPT_ENTRY_ARG:
        o->entry_arg = v;
        return 0;
    case OPT_SSH_HOSTS:
        o->ssh_hosts = v;
        return 0;
    case OPT_SSH_USER:
        o->ssh_user = v;
        return 0;
    case OPT_SSH_IDENTITY:
        o->ssh_identity = v;
        return 0;
    case OPT_SSH_KNOWN_HOSTS:
        o->ssh_known_hosts = v;
        return 0;
    case OPT_SSH_BIN_DIR:
        o->ssh_bin_dir = v;
        return 0;
    case OPT_SSH_ACCEPT_NEW:
        o->ssh_accept_new = true;
        return 0;
    case OPT_SSH_O:
        return usage_error("-o is ssh's (and hvd-rsh's) option; hvd-driver's ssh settings are "
                           "--ssh-port, --ssh-user, --ssh-identity, --ssh-known-hosts and "
                           "--ssh-accept-new");
    case OPT_SSH_FAKE_HOSTS:
        o->ssh_fake_hosts = true;
        return 0;
    case OPT_VERBOSE:
        o->verbose = true;
        return 0;
    case OPT_QUIET:
        o->quiet = true;
        return 0;
    case OPT_PAYLOAD:
        o->payload = v;
        return 0;
    case OPT_LIFELINE_FD:
        if (number("--lifeline-fd", v, 3, 1 << 20, &o->lifeline_fd) != 0) return 2;
        if (fcntl(o->lifeline_fd, F_SETFD, FD_CLOEXEC) != 0)
            return usage_error("--lifeline-fd N: descriptor N is not open");
        return 0;
    case OPT_LIFELINE_DIR:
        o->lifeline_dir = v;
        return 0;
    default:
        if (c >= OPT_HOROVODRUN_FLAG) return horovodrun_flag_take(c, o); /* launcher_horovodrun.c */
        /* elastic jobs and horovodrun's host flags: launcher_elastic_opts.c */
        return elastic_opts_take(c, v, argc, argv, o);
    }
}

/* The combinations that make no sense. Returns 0, or the exit status. */
static int check(launch_opts *o) {
    if (o->ssh_hosts) {
        hvd_err err;
        if (ssh_hosts_check(o, &err) != 0) return usage_error(err.msg);
    }
    if (o->np < 1) return usage_error("-np N is required");
    if (o->local_hosts > o->np) return usage_error("--local H must be between 1 and N");
    if (!o->entry == !o->command)
        return usage_error("give either --entry LIB.so:SYMBOL or -- COMMAND");
    if (o->entry_arg && !o->entry) return usage_error("--entry-arg goes with --entry");
    if (o->payload && !o->command) return usage_error("--payload goes with -- COMMAND");
    if (o->lifeline_dir && o->lifeline_fd < 0)
        return usage_error("--lifeline-dir goes with --lifeline-fd");
    if (o->serve && !o->env_file) return usage_error("serve needs --env-file FILE");
    if (o->serve && o->local_hosts) return usage_error("serve does not start local tasks");
    if (!o->serve && o->jobs != 1) return usage_error("--jobs goes with serve");
    o->many_commands = o->elastic || o->jobs != 1;
    if (o->ssh_hosts && o->local_hosts)
        return usage_error("--local and --ssh-hosts exclude each other");
    if (!o->ssh_hosts && !o->ssh_discovered &&
        (o->ssh_port || o->ssh_user || o->ssh_identity || o->ssh_known_hosts || o->ssh_accept_new ||
         o->ssh_bin_dir || o->ssh_fake_hosts))
        return usage_error("the --ssh-* options go with --ssh-hosts (or --ssh)");
    return 0;
}

/* An option getopt did not take: unknown, or a prefix of several (getopt_long_only takes a
 * prefix of one option for it), which are listed. Returns the exit status. */
static int unknown_option(const char *arg, const struct option *opts) {
    const char *name = arg + strspn(arg, "-");
    size_t len = strcspn(name, "="), n = 0;
    char list[512] = "";
    for (size_t i = 0; opts[i].name && len; i++) {
        if (strncmp(opts[i].name, name, len) != 0) continue;
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s--%s", n++ ? ", " : "", opts[i].name);
    }
    if (n > 1) {
        fprintf(stderr, "hvd-driver: option %s is ambiguous: %s (see hvd-driver --help)\n", arg,
                list);
        return 2;
    }
    fprintf(stderr, "hvd-driver: unknown option %s (see hvd-driver --help)\n", arg);
    return 2;
}

/* The defaults, the network timeout from the environment first. */
static int defaults(launch_opts *o) {
    o->start_timeout_s = HVD_START_TIMEOUT_DEFAULT_S;
    o->jobs = 1;
    o->lifeline_fd = -1;
    o->net_timeout_s = HVD_NET_TIMEOUT_DEFAULT_S;
    if (elastic_opts_defaults(o)) return 2;
    const char *nt = getenv(HVD_NET_TIMEOUT_ENV);
    if (nt && *nt)
        return number(HVD_NET_TIMEOUT_ENV, nt, 1, HVD_NET_TIMEOUT_MAX_S, &o->net_timeout_s);
    return 0;
}

int launch_opts_parse(int argc, char **argv, launch_opts *o) {
    memset(o, 0, sizeof *o);
    if (argc < 2) return usage_error("missing the subcommand: run or serve");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "-help")) {
        print_usage();
        return -1;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-v")) {
        horovodrun_print_version();
        return -1;
    }
    if (!strcmp(argv[1], "serve"))
        o->serve = true;
    else if (strcmp(argv[1], "run") != 0)
        return usage_error("the subcommand must be run or serve");
    int rc = defaults(o);
    /* After the subcommand; '+': stop at the first word that is no option (the command). */
    optind = 2;
    opterr = 0;
    int c;
    const struct option *opts = all_options();
    if (!opts) return usage_error("too many options for the table (a bug in hvd-driver)");
    while (rc == 0 && (c = getopt_long_only(argc, argv, "+:", opts, NULL)) != -1) {
        if (c == OPT_HELP) {
            print_usage();
            return -1;
        }
        if (c == OPT_HOROVODRUN_VERSION) {
            horovodrun_print_version();
            return -1;
        }
        if (c == ':') {
            fprintf(stderr, "hvd-driver: %s needs a value (see hvd-driver --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        if (c == '?') return unknown_option(argv[optind - 1], opts);
        rc = take(c, optarg, argc, argv, o);
    }
    if (rc != 0) return rc;
    if (optind < argc) { /* after --, or right after the options as with horovodrun */
        o->command = &argv[optind];
    } else if (optind > 2 && !strcmp(argv[optind - 1], "--")) {
        return usage_error("-- must be followed by a command");
    }
    if ((rc = elastic_opts_finish(o)) != 0) return rc;
    if (o->mpi_argb.failed || o->rank_envb.failed) return usage_error("out of memory");
    o->mpi_args = (const char *const *)o->mpi_argb.v;
    o->rank_env = (const char *const *)o->rank_envb.v;
    return check(o);
}

void launch_opts_free(launch_opts *o) {
    hvd_strb_free(&o->mpi_argb);
    hvd_strb_free(&o->rank_envb);
    o->mpi_args = o->rank_env = NULL;
    elastic_opts_free(o);
}

/* ---- shared with launcher_elastic_opts.c ---- */

int launch_opts_usage_error(const char *what) {
    return usage_error(what);
}

int launch_opts_number(const char *opt, const char *text, int min, int max, int *out) {
    return number(opt, text, min, max, out);
}
