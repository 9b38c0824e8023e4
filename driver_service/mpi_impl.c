/* Which MPI a launcher belongs to (include/hvd/launch.h): the names of the implementations
 * hvd-bridge drives, and the answer of `mpirun --version`. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/proc.h"
#include "hvd/launch.h"

#define DETECT_TIMEOUT_MS 10000 /* `mpirun --version` reads no network: seconds are plenty */
#define DETECT_OUTPUT_MAX 8192  /* the first lines name the implementation */

static const char *const NAMES[] = {
    [HVD_MPI_AUTO] = "auto",
    [HVD_MPI_OPENMPI4] = "openmpi4",
    [HVD_MPI_OPENMPI5] = "openmpi5",
    [HVD_MPI_MPICH] = "mpich",
};

const char *hvd_mpi_impl_name(hvd_mpi_impl mpi) {
    return (unsigned)mpi < sizeof NAMES / sizeof NAMES[0] ? NAMES[mpi] : "?";
}

int hvd_mpi_impl_parse(const char *name, hvd_mpi_impl *out) {
    for (size_t i = 0; name && i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (strcmp(name, NAMES[i]) == 0) {
            *out = (hvd_mpi_impl)i;
            return 0;
        }
    return -1;
}

/* The first word of digits and dots after `after` in text, into out; "" if none. */
static void version_after(const char *text, const char *after, char *out, size_t cap) {
    const char *p = strstr(text, after);
    out[0] = '\0';
    if (!p) return;
    p += strlen(after);
    p += strspn(p, " \t:");
    size_t n = strspn(p, "0123456789.");
    snprintf(out, cap, "%.*s", (int)n, p);
}

int hvd_mpi_parse_version(const char *text, hvd_mpi_impl *out, char *version, size_t cap) {
    char num[32];
    if (strstr(text, "(Open MPI)")) { /* "mpirun (Open MPI) 5.0.11": ORTE up to 4.x */
        version_after(text, "(Open MPI)", num, sizeof num);
        *out = atoi(num) >= 5 ? HVD_MPI_OPENMPI5 : HVD_MPI_OPENMPI4;
        snprintf(version, cap, "Open MPI %s", num);
        return num[0] ? 0 : -1;
    }
    if (strstr(text, "(PRRTE)")) { /* PRRTE's own prterun: Open MPI 5's dialect */
        version_after(text, "(PRRTE)", num, sizeof num);
        *out = HVD_MPI_OPENMPI5;
        snprintf(version, cap, "PRRTE %s", num);
        return 0;
    }
    if (strstr(text, "Intel(R) MPI Library")) { /* Hydra inside */
        version_after(text, "Version", num, sizeof num);
        *out = HVD_MPI_MPICH;
        snprintf(version, cap, "Intel MPI %s (Hydra)", num);
        return 0;
    }
    if (strstr(text, "HYDRA build details")) {
        version_after(text, "Version:", num, sizeof num);
        *out = HVD_MPI_MPICH;
        snprintf(version, cap, "MPICH %s (Hydra)", num);
        return 0;
    }
    return -1;
}

/* Reads the command's stdout until end-of-file, the size limit or the deadline. */
static size_t read_output(hvd_proc *p, char *buf, size_t cap, int64_t deadline) {
    int fd = hvd_proc_stdout_fd(p);
    size_t len = 0;
    while (len + 1 < cap) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = hvd_ms_left(deadline);
        if (left <= 0 || poll(&pf, 1, left) <= 0) break;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

int hvd_mpi_detect(const char *mpirun, hvd_mpi_impl *out, char *version, size_t cap, hvd_err *err) {
    const char *prog = mpirun && *mpirun ? mpirun : "mpirun";
    char *argv[] = {(char *)prog, "--version", NULL};
    hvd_proc_spec spec = {
        .argv = argv, .grace_ms = 1000, .pass_stderr = true, .stderr_fd = STDERR_FILENO};
    hvd_proc *p = hvd_proc_start(&spec, err);
    if (!p)
        return hvd_err_prefix(err,
                              "cannot ask %s which MPI it belongs to (is MPI installed?): ", prog);
    char *text = malloc(DETECT_OUTPUT_MAX);
    if (!text) {
        hvd_proc_free(p);
        return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    }
    read_output(p, text, DETECT_OUTPUT_MAX, hvd_now_ms() + DETECT_TIMEOUT_MS);
    int code = -1;
    if (hvd_proc_wait(p, 1000, &code) != 0) hvd_proc_abort(p); /* its output ended: it is ending */
    hvd_proc_free(p);
    int rc = 0;
    if (hvd_mpi_parse_version(text, out, version, cap) != 0) {
        char first[120];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(text, "\n"), text);
        rc = hvd_err_set(err, HVD_E_NOT_FOUND,
                         "%s --version (exit %d) names no MPI that hvd-bridge drives ('%s'): "
                         "give --mpi openmpi4, openmpi5 or mpich",
                         prog, code, first);
    }
    free(text);
    return rc;
}

int hvd_mpi_check_named(hvd_mpi_impl mpi, const char *mpirun, hvd_err *err) {
    hvd_mpi_impl found;
    char version[64];
    hvd_err why;
    if (mpi == HVD_MPI_AUTO) return 0;
    if (hvd_mpi_detect(mpirun, &found, version, sizeof version, &why) != 0) {
        if (why.code == HVD_E_NOT_FOUND) return 0; /* it ran, and named no MPI we know */
        *err = why;                                /* it cannot run at all */
        return -1;
    }
    if (found == mpi) return 0;
    const char *prog = mpirun && *mpirun ? mpirun : "mpirun";
    return hvd_err_set(err, HVD_E_INVALID,
                       "--mpi %s, but %s is %s: give --mpirun with %s's launcher, or --mpi %s "
                       "(or leave --mpi out: it is asked)",
                       hvd_mpi_impl_name(mpi), prog, version, hvd_mpi_impl_name(mpi),
                       hvd_mpi_impl_name(found));
}
