/* Tests of the launcher's command line per MPI (include/hvd/launch.h): the version texts of
 * Open MPI 4 and 5, MPICH's Hydra and Intel MPI, detection through a stand-in `mpirun`, and
 * the argv and parts of each dialect over a driver with two registered tasks. The real
 * launchers run these command lines in tests/e2e. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/strv.h"
#include "dtest.h"
#include "hvd/launch.h"

/* ---- names and versions -------------------------------------------------------------------- */

static void test_names(void) {
    for (int m = HVD_MPI_AUTO; m <= HVD_MPI_MPICH; m++) {
        hvd_mpi_impl back;
        CHECK(hvd_mpi_impl_parse(hvd_mpi_impl_name((hvd_mpi_impl)m), &back) == 0);
        CHECK(back == (hvd_mpi_impl)m);
    }
    hvd_mpi_impl out = HVD_MPI_MPICH;
    CHECK(hvd_mpi_impl_parse("openmpi", &out) == -1);
    CHECK(hvd_mpi_impl_parse(NULL, &out) == -1);
    CHECK(out == HVD_MPI_MPICH);
}

static void test_versions(void) {
    static const struct {
        const char *text;
        hvd_mpi_impl mpi;
        const char *version;
    } cases[] = {
        {"mpirun (Open MPI) 4.1.4\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
         HVD_MPI_OPENMPI4, "Open MPI 4.1.4"},
        {"mpirun (Open MPI) 5.0.11\n\nReport bugs to ...\n", HVD_MPI_OPENMPI5, "Open MPI 5.0.11"},
        {"mpiexec (Open MPI) 3.1.6\n", HVD_MPI_OPENMPI4, "Open MPI 3.1.6"},
        {"prterun (PRRTE) 3.0.13\n", HVD_MPI_OPENMPI5, "PRRTE 3.0.13"},
        {"HYDRA build details:\n    Version:                                 5.0.2\n"
         "    Release Date:                            Fri Sep 25\n",
         HVD_MPI_MPICH, "MPICH 5.0.2 (Hydra)"},
        {"Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n",
         HVD_MPI_MPICH, "Intel MPI 2021.10 (Hydra)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hvd_mpi_impl mpi = HVD_MPI_AUTO;
        char version[64] = "";
        CHECK_MSG(hvd_mpi_parse_version(cases[i].text, &mpi, version, sizeof version) == 0,
                  "case %zu", i);
        CHECK_MSG(mpi == cases[i].mpi, "case %zu: %s", i, hvd_mpi_impl_name(mpi));
        CHECK_MSG(strcmp(version, cases[i].version) == 0, "case %zu: '%s'", i, version);
    }
    hvd_mpi_impl mpi;
    char version[64];
    CHECK(hvd_mpi_parse_version("mpirun: command not found\n", &mpi, version, sizeof version) ==
          -1);
    CHECK(hvd_mpi_parse_version("", &mpi, version, sizeof version) == -1);
}

/* A stand-in `mpirun` in dir that prints text for --version. */
static void fake_mpirun(const char *dir, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/mpirun", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "#!/bin/sh\ncat <<'EOF'\n%sEOF\n", text);
    fclose(f);
    chmod(path, 0755);
}

static void test_detect(void) {
    char dir[] = "/tmp/hvd-test-launch.XXXXXX", path[128], version[64];
    CHECK(mkdtemp(dir) != NULL);
    hvd_mpi_impl mpi = HVD_MPI_AUTO;
    hvd_err err = {0};
    fake_mpirun(dir, "mpirun (Open MPI) 5.0.11\n", path, sizeof path);
    CHECK_MSG(hvd_mpi_detect(path, &mpi, version, sizeof version, &err) == 0, "%s", err.msg);
    CHECK(mpi == HVD_MPI_OPENMPI5 && strcmp(version, "Open MPI 5.0.11") == 0);

    fake_mpirun(dir, "some other launcher 1.0\n", path, sizeof path);
    CHECK(hvd_mpi_detect(path, &mpi, version, sizeof version, &err) == -1);
    CHECK_MSG(strstr(err.msg, "names no MPI") && strstr(err.msg, "some other launcher") &&
                  strstr(err.msg, "--mpi openmpi4, openmpi5 or mpich"),
              "%s", err.msg);

    snprintf(path, sizeof path, "%s/no-such-mpirun", dir);
    CHECK(hvd_mpi_detect(path, &mpi, version, sizeof version, &err) == -1);
    CHECK_MSG(strstr(err.msg, "no-such-mpirun") && strstr(err.msg, "is MPI installed?"), "%s",
              err.msg);
    snprintf(path, sizeof path, "%s/mpirun", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- the dialects -------------------------------------------------------------------------- */

/* The argv joined with spaces, for substring checks. */
static char *joined(char **argv) {
    return hvd_strv_join((const char *const *)argv, " ");
}

/* Whether words appears in argv as consecutive words. */
static bool has_words(char **argv, const char *const *words) {
    for (size_t i = 0; argv[i]; i++) {
        size_t k = 0;
        while (words[k] && argv[i + k] && strcmp(argv[i + k], words[k]) == 0)
            k++;
        if (!words[k]) return true;
    }
    return false;
}
#define HAS(argv, ...) has_words((argv), (const char *const[]){__VA_ARGS__, NULL})

/* A driver whose two tasks registered on hosts "host-b" (task 0) and "host-a". */
static hvd_driver *two_tasks(void) {
    hvd_driver *d = start_driver(2, NULL, NULL, NULL);
    hvd_client *c = driver_client(d);
    hvd_err err;
    hvd_addr addrs[2] = {{"lo", "127.0.0.1", 4000}, {"eth9", "10.9.9.1", 4000}};
    CHECK(register_addrs(c, 0, "host-b", addrs, 2, &err) == 0);
    CHECK(register_addrs(c, 1, "host-a", addrs, 2, &err) == 0);
    hvd_client_close(c);
    return d;
}

static char *const IFACES[] = {"lo", "eth9", NULL};

static char **argv_for(hvd_driver *d, hvd_mpi_impl mpi) {
    static const char *const extra[] = {"--extra", NULL};
    hvd_launch_config cfg = {.np = 2,
                             .mpi = mpi,
                             .mpirun = "/opt/mpi/bin/mpirun",
                             .bin_dir = "/opt/hvd/bin",
                             .exec_bin_dir = "/srv/hvd/bin",
                             .mpi_args = extra};
    hvd_err err = {0};
    char **argv = hvd_launch_argv(d, &cfg, IFACES, &err);
    CHECK_MSG(argv != NULL, "%s: %s", hvd_mpi_impl_name(mpi), err.msg);
    return argv;
}

/* What every dialect shares: the launcher first, hvd-exec last, the user's words before it. */
static void common_checks(char **argv, const char *name) {
    size_t n = hvd_strv_len((const char *const *)argv);
    CHECK_MSG(n > 3 && strcmp(argv[0], "/opt/mpi/bin/mpirun") == 0, "%s: %s", name, argv[0]);
    CHECK_MSG(n > 3 && strcmp(argv[n - 1], "/srv/hvd/bin/hvd-exec") == 0, "%s", name);
    CHECK_MSG(n > 3 && strcmp(argv[n - 2], "--extra") == 0, "%s", name);
    CHECK_MSG(HAS(argv, "-np", "2"), "%s", name);
}

static void test_openmpi4(void) {
    hvd_driver *d = two_tasks();
    char **argv = argv_for(d, HVD_MPI_OPENMPI4);
    if (!argv) goto out;
    common_checks(argv, "openmpi4");
    char *line = joined(argv);
    CHECK(HAS(argv, "-H", "host-b:1,host-a:1"));
    CHECK(HAS(argv, "-mca", "plm_rsh_agent", "/opt/hvd/bin/hvd-rsh"));
    CHECK(HAS(argv, "-mca", "if_base_do_not_resolve", "1"));
    CHECK(HAS(argv, "--stdin", "none"));
    /* The TCP transport without loopback beside another interface (launch.c, btl_list). */
    CHECK(HAS(argv, "-mca", "btl_tcp_if_include", "eth9"));
    CHECK(HAS(argv, "-mca", "oob_tcp_if_include", "lo,eth9"));
    CHECK(HAS(argv, "-x", "NCCL_SOCKET_IFNAME==lo,eth9"));
    CHECK_MSG(!strstr(line, "prtemca") && !strstr(line, "-genv"), "%s", line);
    free(line);
out:
    hvd_launch_free_argv(argv);
    hvd_driver_stop(d);
}

static void test_openmpi5(void) {
    hvd_driver *d = two_tasks();
    char **argv = argv_for(d, HVD_MPI_OPENMPI5);
    if (!argv) goto out;
    common_checks(argv, "openmpi5");
    char *line = joined(argv);
    CHECK(HAS(argv, "-H", "host-b:1,host-a:1"));
    CHECK(HAS(argv, "--prtemca", "plm_ssh_agent", "/opt/hvd/bin/hvd-rsh"));
    CHECK(HAS(argv, "--prtemca", "prte_do_not_resolve", "1"));
    CHECK(HAS(argv, "--stdin", "none"));
    CHECK(HAS(argv, "--mca", "btl_tcp_if_include", "eth9"));
    /* PRRTE's daemons never use loopback, and crash on a name they do not have. */
    CHECK_MSG(HAS(argv, "--prtemca", "oob_tcp_if_include", "eth9"), "%s", line);
    CHECK(HAS(argv, "-x", "NCCL_SOCKET_IFNAME==lo,eth9"));
    CHECK_MSG(!strstr(line, " -mca ") && !strstr(line, "plm_rsh_agent"), "%s", line);
    free(line);
    hvd_launch_free_argv(argv);
    /* Only loopback in common: no daemon interface option at all. */
    char *const lo_only[] = {"lo", NULL};
    hvd_launch_config cfg = {.np = 2, .mpi = HVD_MPI_OPENMPI5, .bin_dir = "/b"};
    hvd_err err;
    argv = hvd_launch_argv(d, &cfg, lo_only, &err);
    CHECK(argv != NULL);
    if (!argv) goto out;
    line = joined(argv);
    CHECK_MSG(!strstr(line, "oob_tcp_if_include") && strstr(line, "btl_tcp_if_include lo"), "%s",
              line);
    CHECK_MSG(strcmp(argv[0], "mpirun") == 0, "%s", argv[0]);
    free(line);
out:
    hvd_launch_free_argv(argv);
    hvd_driver_stop(d);
}

static void test_mpich(void) {
    hvd_driver *d = two_tasks();
    char **argv = argv_for(d, HVD_MPI_MPICH);
    if (!argv) goto out;
    common_checks(argv, "mpich");
    char *line = joined(argv);
    CHECK(HAS(argv, "-hosts", "host-b:1,host-a:1"));
    CHECK(HAS(argv, "-launcher", "ssh", "-launcher-exec", "/opt/hvd/bin/hvd-rsh"));
    CHECK(HAS(argv, "-genvnone"));
    CHECK_MSG(HAS(argv, "-localhost", "127.0.0.1"), "%s", line); /* the driver's lo address */
    CHECK(HAS(argv, "-genv", "UCX_NET_DEVICES", "lo,eth9"));
    CHECK(HAS(argv, "-genv", "NCCL_SOCKET_IFNAME", "=lo,eth9"));
    CHECK_MSG(!strstr(line, "-mca") && !strstr(line, " -x ") && !strstr(line, "allow-run-as-root"),
              "%s", line);
    free(line);
    hvd_launch_parts parts;
    hvd_launch_config cfg = {.np = 2, .mpi = HVD_MPI_MPICH, .bin_dir = "/b"};
    hvd_err err;
    CHECK(hvd_launch_parts_make(d, &cfg, IFACES, &parts, &err) == 0);
    CHECK(parts.mpi == HVD_MPI_MPICH && parts.version[0] == '\0');
    CHECK(parts.env && parts.env[0] && strcmp(parts.env[0], "HYDRA_LAUNCHER_AUTOFORK=0") == 0);
    CHECK(HAS(parts.agent, "-launcher-exec", "/b/hvd-rsh"));
    hvd_launch_parts_free(&parts);
out:
    hvd_launch_free_argv(argv);
    hvd_driver_stop(d);
}

/* An MCA parameter the user's mpirun arguments set as well (Horovod users pass
 * "-mca oob_tcp_if_include lo"), or --bind-to/--map-by: theirs is the only one, so that mpirun
 * does not refuse it as "listed multiple times"; the others stay. */
static void test_user_mca_wins(void) {
    hvd_driver *d = two_tasks();
    static const char *const user4[] = {"-mca", "oob_tcp_if_include", "lo", "--mca",
                                        "btl",  "self,tcp",           NULL};
    static const char *const user5[] = {"--prtemca", "oob_tcp_if_include", "eth9", NULL};
    const struct {
        hvd_mpi_impl mpi;
        const char *const *user;
        const char *gone, *kept;
    } cases[] = {{HVD_MPI_OPENMPI4, user4, "btl", "btl_tcp_if_include"},
                 {HVD_MPI_OPENMPI5, user5, NULL, "btl_tcp_if_include"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        hvd_launch_config cfg = {
            .np = 2, .mpi = cases[k].mpi, .bin_dir = "/b", .mpi_args = cases[k].user};
        hvd_err err;
        char **argv = hvd_launch_argv(d, &cfg, IFACES, &err);
        CHECK_MSG(argv != NULL, "%s", err.msg);
        if (!argv) continue;
        int oob = 0, btl = 0, kept = 0;
        for (size_t i = 0; argv[i]; i++) {
            oob += strcmp(argv[i], "oob_tcp_if_include") == 0;
            btl += strcmp(argv[i], "btl") == 0;
            kept += strcmp(argv[i], cases[k].kept) == 0;
        }
        char *line = joined(argv);
        CHECK_MSG(oob == 1 && kept == 1, "%s", line);
        if (cases[k].gone) CHECK_MSG(btl == 1 && HAS(argv, "--mca", "btl", "self,tcp"), "%s", line);
        CHECK_MSG(HAS(argv, cases[k].user[0], "oob_tcp_if_include", cases[k].user[2]), "%s", line);
        free(line);
        hvd_launch_free_argv(argv);
    }
    /* The same for the placement options: PRRTE refuses --bind-to given twice. */
    static const char *const place[] = {"-bind-to", "core", "--map-by=node", NULL};
    for (int m = HVD_MPI_OPENMPI4; m <= HVD_MPI_OPENMPI5; m++) {
        hvd_launch_config cfg = {.np = 2, .mpi = m, .bin_dir = "/b", .mpi_args = place};
        hvd_err err;
        char **argv = hvd_launch_argv(d, &cfg, IFACES, &err);
        CHECK_MSG(argv != NULL, "%s", err.msg);
        if (!argv) continue;
        int bind = 0, map = 0;
        for (size_t i = 0; argv[i]; i++) {
            bind += strstr(argv[i], "bind-to") != NULL;
            map += strstr(argv[i], "map-by") != NULL;
        }
        char *line = joined(argv);
        CHECK_MSG(bind == 1 && map == 1 && HAS(argv, "-bind-to", "core") &&
                      !HAS(argv, "-map-by", "slot") && !HAS(argv, "--map-by", "slot"),
                  "%s", line);
        free(line);
        hvd_launch_free_argv(argv);
    }
    /* ... but not the launch agent: without hvd-rsh no task service is reached. */
    static const char *const agent[] = {"-mca", "plm_rsh_agent", "ssh", NULL};
    hvd_launch_config cfg = {.np = 2, .mpi = HVD_MPI_OPENMPI4, .bin_dir = "/b", .mpi_args = agent};
    hvd_err err;
    CHECK(hvd_launch_argv(d, &cfg, IFACES, &err) == NULL && err.code == HVD_E_INVALID &&
          strstr(err.msg, "set plm_rsh_agent, which hvd-bridge sets to its own agent"));
    hvd_driver_stop(d);
}

/* HVD_MPI_AUTO asks the launcher. */
static void test_auto(void) {
    char dir[] = "/tmp/hvd-test-launch.XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    fake_mpirun(dir, "HYDRA build details:\n    Version:    4.2.1\n", path, sizeof path);
    hvd_driver *d = two_tasks();
    hvd_launch_parts parts;
    hvd_launch_config cfg = {.np = 2, .mpirun = path, .bin_dir = "/b"};
    hvd_err err = {0};
    CHECK_MSG(hvd_launch_parts_make(d, &cfg, IFACES, &parts, &err) == 0, "%s", err.msg);
    CHECK(parts.mpi == HVD_MPI_MPICH && strcmp(parts.version, "MPICH 4.2.1 (Hydra)") == 0);
    hvd_launch_parts_free(&parts);
    hvd_driver_stop(d);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    dtest_init();
    RUN(test_names);
    RUN(test_versions);
    RUN(test_detect);
    RUN(test_openmpi4);
    RUN(test_openmpi5);
    RUN(test_mpich);
    RUN(test_user_mca_wins);
    RUN(test_auto);
    return test_finish();
}
