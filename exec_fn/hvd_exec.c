/* hvd-exec (also installed as mpirun_exec_fn): the rank bootstrap that the MPI daemon (orted,
 * prted, hydra_pmi_proxy) starts once per rank (DESIGN.md section 2, step 7).
 *
 * It tells the driver (host hash, local rank, rank) and learns which task it represents,
 * takes that task's GPUs, changes into the executor's work dir, fetches the entry point from
 * the driver and runs it: a program (argv), or a shared object shipped as bytes and loaded
 * from memory. The rank's status, result bytes and error text go to the driver and to the
 * rank's task service. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/env.h"
#include "common/io.h"
#include "common/clock.h"
#include "common/proc.h"
#include "common/proctree.h"
#include "common/sig.h"
#include "common/strv.h"
#include "hvd/defaults.h"
#include "hvd/entry.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "warm.h"

static const char USAGE[] =
    "usage: hvd-exec\n"
    "\n"
    "The rank bootstrap of hvd-bridge: the MPI daemon (orted, prted, hydra_pmi_proxy) starts it\n"
    "once per rank, as in\n"
    "  mpirun -H <host hashes> -mca plm_rsh_agent hvd-rsh ... hvd-exec\n"
    "It asks the driver which task service this rank stands for, takes that task's GPUs,\n"
    "changes into the executor's work dir, fetches the job's entry point from the driver and\n"
    "runs it:\n"
    "  a program: run with the rank in its environment; its exit status is the rank's, and\n"
    "    what it leaves running is stopped when it exits (SIGTERM, SIGKILL 5 s later; a warm\n"
    "    Python rank: the task service's grace period);\n"
    "  a shared object: loaded from memory (the executor needs no copy of the file) and its\n"
    "    hvd_entry_fn called (include/hvd/entry.h); what it leaves running is stopped the\n"
    "    same way once it returns and the rank has reported.\n"
    "The rank's status, result bytes and error text are reported to the driver and to the\n"
    "rank's task service. hvd-exec dies with its parent.\n"
    "\n"
    "Environment read:\n"
    "  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (Open MPI 4 and 5), or PMI_RANK,\n"
    "  PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH's Hydra), or HOROVOD_RANK,\n"
    "  HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE; HOROVOD_HOSTNAME (the host hash);\n"
    "  HOROVOD_SPARK_WORK_DIR; HVD_DRIVER_ADDRS; HVD_SECRET or HVD_SECRET_FILE; HVD_KEEPER (the\n"
    "  program that keeps a program entry point: default hvd-keeper in HVD_BIN_DIR or beside\n"
    "  hvd-exec; 'none': a forked copy of hvd-exec).\n"
    "Environment given to a program entry point, besides its own:\n"
    "  HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HVD_TASK_INDEX,\n"
    "  HVD_GPUS (comma-separated GPU ids of the rank's task, maybe empty), and, when that\n"
    "  task has GPUs, CUDA_VISIBLE_DEVICES with the same ids; torch.distributed's RANK,\n"
    "  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (MASTER_ADDR and MASTER_PORT come from\n"
    "  mpirun). A program that takes a payload (ARGV_IO: the Python package's functions)\n"
    "  reads it from descriptor HVD_PAYLOAD_FD (3) and may write its result bytes to\n"
    "  HVD_RESULT_FD (4).\n"
    "A program that is the task service's warm Python interpreter (hvd-task --warm-python\n"
    "  sets HVD_WARM_PYTHON to it and HVD_WARM_SOCKET to where it listens) is forked from\n"
    "  that interpreter instead, with the same arguments, environment, directory and\n"
    "  descriptors (docs/elastic.md, \"Warm Python ranks\"); when it cannot be, the program\n"
    "  starts as usual.\n"
    "Every entry point also gets HVD_TASK_INDEX and HVD_TASK_ADDRS (the rank's task service,\n"
    "where an elastic rank commits its state: include/hvd/elastic.h).\n"
    "In an elastic job (HVD_ELASTIC_EPOCH set) a rank that ends with status 75 (a reset) tells\n"
    "the driver so and exits 0, and SIGTERM ends a shared-object entry point at once.\n"
    "\n"
    "Exit status: the entry point's status (0-255); 1 if hvd-exec itself failed, with a\n"
    "one-line reason on stderr.\n";

/* What this rank is. */
typedef struct rank_info {
    int rank, size, local_rank, local_size;
    const char *host_hash;
    uint32_t index;
    hvd_task_info task;
    hvd_client *driver; /* kept from fetching the job to reporting its result */
    hvd_secret secret;
} rank_info;

/* The first of the variables (a NULL-terminated list) that is set, as a number. */
static int env_int(const char *const *names, int *out) {
    const char *v = NULL;
    for (size_t i = 0; names[i] && (!v || !*v); i++)
        v = getenv(names[i]);
    if (!v || !*v) return -1;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 0 || n > 1 << 30) return -1;
    *out = (int)n;
    return 0;
}

static int fail(const char *fmt, const char *what) {
    /* One write: stderr is unbuffered, and mpirun tags every piece it reads as a line of its
     * own ("[1,0]<stderr>:hvd-exec: [1,0]<stderr>:driver at ..."). */
    char line[HVD_ERR_MAX + 128];
    int n = snprintf(line, sizeof line, "hvd-exec: ");
    snprintf(line + n, sizeof line - (size_t)n - 1, fmt, what);
    size_t len = strlen(line);
    line[len++] = '\n';
    fwrite(line, 1, len, stderr);
    return 1;
}

/* ---- Running a program ------------------------------------------------------------------ */

/* Keeps the last bytes written to stderr so a failure can quote them. */
typedef struct tail {
    char buf[1024];
    size_t len;
} tail;

static void tail_add(tail *t, const char *p, size_t n) {
    if (n >= sizeof t->buf) {
        memcpy(t->buf, p + n - sizeof t->buf, sizeof t->buf);
        t->len = sizeof t->buf;
        return;
    }
    if (t->len + n > sizeof t->buf) {
        size_t drop = t->len + n - sizeof t->buf;
        memmove(t->buf, t->buf + drop, t->len - drop);
        t->len -= drop;
    }
    memcpy(t->buf + t->len, p, n);
    t->len += n;
}

/* The last non-empty line of the tail, trimmed, into out. */
static void tail_last_line(const tail *t, char *out, size_t cap) {
    size_t end = t->len;
    while (end > 0 && (t->buf[end - 1] == '\n' || t->buf[end - 1] == '\r'))
        end--;
    size_t start = end;
    while (start > 0 && t->buf[start - 1] != '\n' && t->buf[start - 1] != '\r')
        start--;
    size_t n = end - start < cap - 1 ? end - start : cap - 1;
    memcpy(out, t->buf + start, n);
    out[n] = '\0';
}

/* Hydra's proxy (MPICH, Intel MPI) hands each rank its PMI connection as an inherited
 * descriptor named in PMI_FD; the process runner passes a program no descriptor it is not told
 * of, so without this MPI_Init fails there ("PMI_Init returned -1"). Returns that descriptor,
 * or -1 when there is none (Open MPI's ranks find their PMIx server by address). */
static int pmi_fd(void) {
    const char *v = getenv("PMI_FD");
    char *end;
    long fd = v && *v ? strtol(v, &end, 10) : -1;
    if (fd < 0 || *end || fd > 1 << 20 || fcntl((int)fd, F_GETFD) < 0) return -1;
    return (int)fd;
}

/* The program's environment: ours, with the rank's variables under Horovod's names and
 * torch.distributed's (MASTER_ADDR and MASTER_PORT come from mpirun), the task's GPUs as the
 * only visible ones, an ARGV_IO program's descriptors, and the number the PMI connection has
 * in the program (pmi: "" if it has none). NULL on out of memory. */
static char **program_env(const rank_info *ri, bool io, const char *pmi) {
    char rank[16], size[16], lrank[16], lsize[16], index[16], pfd[8], rfd[8];
    snprintf(rank, sizeof rank, "%d", ri->rank);
    snprintf(size, sizeof size, "%d", ri->size);
    snprintf(lrank, sizeof lrank, "%d", ri->local_rank);
    snprintf(lsize, sizeof lsize, "%d", ri->local_size);
    snprintf(index, sizeof index, "%u", ri->index);
    snprintf(pfd, sizeof pfd, "%d", HVD_PAYLOAD_FD);
    snprintf(rfd, sizeof rfd, "%d", HVD_RESULT_FD);
    char *gpus = hvd_strv_join((const char *const *)ri->task.gpus.v, ",");
    if (!gpus) return NULL;
    hvd_env_change ch[16] = {{"HOROVOD_RANK", rank},
                             {"HOROVOD_SIZE", size},
                             {"HOROVOD_LOCAL_RANK", lrank},
                             {"HOROVOD_LOCAL_SIZE", lsize},
                             {"RANK", rank},
                             {"WORLD_SIZE", size},
                             {"LOCAL_RANK", lrank},
                             {"LOCAL_WORLD_SIZE", lsize},
                             {HVD_TASK_INDEX_ENV, index},
                             {"HVD_GPUS", gpus}};
    size_t n = 10;
    /* No GPUs of its own: CUDA_VISIBLE_DEVICES stays as the executor has it. */
    if (gpus[0]) ch[n++] = (hvd_env_change){"CUDA_VISIBLE_DEVICES", gpus};
    if (io) {
        ch[n++] = (hvd_env_change){"HVD_PAYLOAD_FD", pfd};
        ch[n++] = (hvd_env_change){"HVD_RESULT_FD", rfd};
    }
    if (pmi[0]) ch[n++] = (hvd_env_change){"PMI_FD", pmi};
    extern char **environ;
    char **envp = hvd_env_build(environ, ch, n, NULL);
    free(gpus);
    return envp;
}

/* What a running program sends back: its stderr's tail, and an ARGV_IO program's result. */
typedef struct program_out {
    tail t;
    int stop_signal;   /* a signal to us that aborted the program, or 0 */
    pid_t stop_sender; /* ... and who sent it */
    int result_fd;     /* read end of the result pipe, or -1 */
    hvd_buf result;
    bool too_big; /* the result passed RESULT_MAX: the rest was dropped */
} program_out;

/* A result must fit in one frame to the driver, with room for the rest of the message. */
#define RESULT_MAX (HVD_DEFAULT_MAX_FRAME - 64 * 1024)

/* Reads what fd has; returns false at end-of-file (or an error). */
static bool drain_fd(int fd, program_out *o, bool is_stderr) {
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return false;
    if (is_stderr) {
        (void)hvd_write_all(STDERR_FILENO, buf, (size_t)n);
        tail_add(&o->t, buf, (size_t)n);
    } else if (o->result.len + (size_t)n > RESULT_MAX ||
               hvd_buf_append(&o->result, buf, (size_t)n)) {
        o->too_big = true;
    }
    return true;
}

/* A running program: started by the process runner, or forked by the task service's warm
 * interpreter (warm.h). */
typedef struct rank_proc {
    hvd_proc *cold; /* the process runner's, or NULL: */
    int warm;       /* the connection to the warm interpreter that forked it */
    int err_fd;     /* read end of its stderr */
} rank_proc;

/* Aborts the program: SIGTERM to all of it, SIGKILL after the grace period. */
static void rank_abort(rank_proc *rp) {
    if (rp->cold)
        hvd_proc_abort(rp->cold);
    else
        warm_stop(rp->warm);
}

/* Passes the program's stderr through as it comes, keeping its tail, and collects its result;
 * a signal to us aborts the program. Returns once both reach end-of-file: the program and its
 * children closed them. */
static void pump_program(rank_proc *rp, int sig_fd, program_out *o) {
    int efd = rp->err_fd, rfd = o->result_fd;
    while (efd >= 0 || rfd >= 0) {
        struct pollfd pf[3] = {{.fd = efd, .events = POLLIN},
                               {.fd = rfd, .events = POLLIN},
                               {.fd = sig_fd, .events = POLLIN}};
        if (poll(pf, 3, -1) < 0) continue;
        int sig;
        pid_t from = 0;
        if (pf[2].revents && (sig = hvd_signals_next_from(sig_fd, &from)) != 0) {
            if (!o->stop_signal) {
                o->stop_signal = sig;
                o->stop_sender = from;
            }
            rank_abort(rp);
        }
        if (pf[0].revents && !drain_fd(efd, o, true)) efd = -1;
        if (pf[1].revents && !drain_fd(rfd, o, false)) rfd = -1;
    }
}

/* An ARGV_IO program's descriptors: the payload in a memory file (fds[0]) and the write end of
 * the result pipe (fds[1]); *result_r gets the read end. Returns 0, or -1 with error. */
static int open_io(const hvd_bytes *payload, int fds[2], int *result_r, char *error, size_t cap) {
    int pipefd[2] = {-1, -1};
    fds[0] = memfd_create("hvd-payload", MFD_CLOEXEC);
    if (fds[0] < 0 || hvd_write_all(fds[0], payload->data, payload->len) != 0 ||
        lseek(fds[0], 0, SEEK_SET) != 0 || pipe2(pipefd, O_CLOEXEC) != 0) {
        snprintf(error, cap, "cannot pass the payload to the program: %s", strerror(errno));
        hvd_close_fd(&fds[0]);
        return -1;
    }
    fds[1] = pipefd[1];
    *result_r = pipefd[0];
    return 0;
}

/* "SIGTERM"-style name of the signals hvd-exec takes (hvd_signals_install). */
static const char *signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "?";
}

/* The parent of pid, from /proc; 0 if unknown. */
static pid_t parent_of(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold anything; the fields follow it */
    int ppid = 0;
    if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1) return 0;
    return ppid;
}

/* Whether pid is one of the processes that end ranks when the job ends: orted (our parent) and,
 * up to the task service that runs it ($HVD_TASK_PID), what lies between (the process
 * runner's keeper). Not what is above the task service (an executor, a test harness). */
static bool is_job_ancestor(pid_t pid) {
    pid_t p = getppid();
    if (p == pid) return true;
    int task = 0;
    if (env_int((const char *const[]){HVD_TASK_PID_ENV, NULL}, &task) != 0 || task <= 1)
        return false;
    for (int depth = 0; depth < 8 && p > 1; depth++) {
        p = parent_of(p);
        if (p == pid) return true;
        if (p == task) return false;
    }
    return false;
}

/* The MPI daemon that started this rank (our parent's /proc comm: orted, prted,
 * hydra_pmi_proxy), read at the start: by the time a signal comes it may be gone. */
static char g_daemon[32] = "the MPI daemon";

static void note_daemon(void) {
    char path[64], name[sizeof g_daemon];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)getppid());
    FILE *f = fopen(path, "r");
    if (f && fgets(name, sizeof name, f) && name[0] != '\n' && name[0]) {
        name[strcspn(name, "\n")] = '\0';
        snprintf(g_daemon, sizeof g_daemon, "%s", name);
    }
    if (f) fclose(f);
}

/* A signal from orted or the task service above it (our ancestors) is the job ending: the rank
 * is stopped, it did not fail. One from anyone else killed the rank: that is its own failure.
 * Says which in error; returns true for a stop. */
static bool stop_or_kill(int sig, pid_t sender, char *error, size_t cap) {
    bool stop = sender > 0 && is_job_ancestor(sender);
    if (stop)
        snprintf(error, cap,
                 "stopped by %s from %s before the entry point finished (the job was ending)",
                 signal_name(sig), sender == getppid() ? g_daemon : "its task service");
    else if (sender > 0)
        snprintf(error, cap, "killed by %s from process %d (not %s, which started it)",
                 signal_name(sig), (int)sender, g_daemon);
    else
        snprintf(error, cap, "killed by %s", signal_name(sig));
    return stop;
}

/* The name of the program argv runs, for messages: for a shell's `sh -c COMMAND NAME` the NAME
 * (the shell's $0, what the command calls itself: hvd_bridge's ranks are `sh -c 'exec
 * "$HVD_PYTHON" ...' python`) unless it is a placeholder, else argv[0]. */
static const char *program_name(const hvd_strv *argv) {
    const char *base = strrchr(argv->v[0], '/') ? strrchr(argv->v[0], '/') + 1 : argv->v[0];
    bool shell = !strcmp(base, "sh") || !strcmp(base, "bash") || !strcmp(base, "dash");
    if (!shell || argv->n < 4 || strcmp(argv->v[1], "-c") != 0) return argv->v[0];
    const char *name = argv->v[3]; /* not a placeholder ("sh -c 'cmd "$@"' _ args") */
    bool placeholder = !name[0] || !strcmp(name, "_") || !strcmp(name, "-") ||
                       !strcmp(name, "--") || !strcmp(name, base) || !strcmp(name, argv->v[0]);
    return placeholder ? argv->v[0] : name;
}

/* The error text of a program that failed: how it ended and its last line on stderr. */
static void program_error(const char *prog, int status, const tail *t, char *error, size_t cap) {
    char last[512];
    tail_last_line(t, last, sizeof last);
    if (status > 128 && status < 128 + 65)
        snprintf(error, cap, "%s was killed by signal %d%s%s", prog, status - 128,
                 *last ? ": " : "", last);
    else
        snprintf(error, cap, "%s exited with status %d%s%s", prog, status, *last ? ": " : "", last);
}

/* Starts the program in the task service's warm interpreter ($HVD_WARM_SOCKET) if there is
 * one and the program is that interpreter. Returns 1 if it did (rp->warm, rp->err_fd set), 0
 * if it is to start cold, -1 if a signal came first (o->stop_signal set). */
static int start_warm(rank_proc *rp, char *const *argv, char **envp, const int *fds, int nfds,
                      int sig_fd, program_out *o) {
    const char *path = getenv(HVD_WARM_SOCKET_ENV), *python = getenv(HVD_WARM_PYTHON_ENV);
    int err[2];
    if (!path || !*path || !python || !warm_may_run(python, argv, envp) ||
        pipe2(err, O_CLOEXEC) != 0)
        return 0;
    char why[512];
    int conn = warm_request(path, argv, envp, 1, err[1], fds, nfds, why, sizeof why);
    close(err[1]);
    int got = 0;
    pid_t pid = 0;
    if (conn >= 0) { /* the interpreter may still be importing: a signal must not wait */
        struct pollfd pf[2] = {{.fd = conn, .events = POLLIN}, {.fd = sig_fd, .events = POLLIN}};
        while (poll(pf, 2, -1) < 0 && errno == EINTR) {
        }
        if (pf[1].revents && (o->stop_signal = hvd_signals_next_from(sig_fd, &o->stop_sender)))
            got = -1;
        else
            got = warm_answer(conn, &pid, why, sizeof why);
    }
    /* "cold": not its interpreter (a C rank, another Python), said nothing of; any other
     * reason to start cold is worth a line. */
    if (got == -1 && !o->stop_signal) got = 0;
    if ((conn < 0 || got == -1) && !o->stop_signal)
        fprintf(stderr, "hvd-exec: warning: %s; starting the rank without it\n", why);
    if (got != 1) {
        if (conn >= 0) close(conn); /* a rank forked meanwhile is stopped by the close */
        close(err[0]);
        return got;
    }
    rp->warm = conn;
    rp->err_fd = err[0];
    return 1;
}

/* Starts the program: warm (start_warm), else through the process runner. Returns 0, or -1
 * with error (or a stop signal in o). */
static int start_rank(rank_proc *rp, char *const *argv, char **envp, const int *fds, int nfds,
                      int sig_fd, program_out *o, char *error, size_t cap) {
    *rp = (rank_proc){.warm = -1, .err_fd = -1};
    int warm = start_warm(rp, argv, envp, fds, nfds, sig_fd, o);
    if (warm != 0) return warm > 0 ? 0 : -1;
    /* A payload the warm interpreter may have begun to read (it went away) starts over. */
    if (nfds > 0) (void)lseek(fds[0], 0, SEEK_SET);
    hvd_proc_spec spec = {.argv = argv,
                          .envp = envp,
                          .pass_stdout = true,
                          .stdout_fd = 1,
                          .extra_fds = fds,
                          .n_extra_fds = nfds,
                          .end_with_program = true};
    hvd_err err;
    rp->cold = hvd_proc_start(&spec, &err);
    if (!rp->cold) {
        snprintf(error, cap, "%s", err.msg);
        return -1;
    }
    rp->err_fd = hvd_proc_stderr_fd(rp->cold);
    return 0;
}

/* Waits for the program's end: its status (128 + N: killed by signal N). */
static void rank_wait(rank_proc *rp, int *status, char *error, size_t cap) {
    if (rp->cold) {
        while (hvd_proc_wait(rp->cold, -1, status) > 0) {
        }
        hvd_proc_free(rp->cold);
        return;
    }
    close(rp->err_fd);
    if (warm_wait(rp->warm, status, error, cap) != 0) *status = 1;
    close(rp->warm);
}

/* Runs a program entry point (stdout passed through, stderr watched; an ARGV_IO program also
 * gets the payload and a result pipe). Returns 0 with its status, its result bytes (ARGV_IO)
 * and error text when it failed, or -1 if it could not be started. */
static int run_program(const rank_info *ri, hvd_code_msg *code, int sig_fd, int *status,
                       bool *stopped, hvd_entry_result *res) {
    bool io = code->kind == HVD_CODE_ARGV_IO;
    program_out o = {.result_fd = -1};
    int fds[3] = {-1, -1, -1}, nfds = io ? 2 : 0;
    if (io && open_io(&code->object, fds, &o.result_fd, res->error, sizeof res->error) != 0)
        return -1;
    if (io) { /* the memory file holds it now (up to 2 GiB): not twice for the whole job */
        free(code->object.data);
        code->object = (hvd_bytes){0};
    }
    /* The PMI connection follows the ARGV_IO descriptors (3, 4) as the program's next one. */
    char pmi[16] = "";
    int pmi_at = pmi_fd();
    if (pmi_at >= 0) {
        fds[nfds] = pmi_at;
        snprintf(pmi, sizeof pmi, "%d", 3 + nfds++);
    }
    char **envp = program_env(ri, io, pmi);
    rank_proc rp;
    int rc = -1;
    if (!envp)
        snprintf(res->error, sizeof res->error, "out of memory");
    else
        rc = start_rank(&rp, code->argv.v, envp, fds, nfds, sig_fd, &o, res->error,
                        sizeof res->error);
    hvd_env_free(envp);
    /* The program holds them now. Not the PMI connection: Hydra's proxy takes its end (EOF
     * without PMI finalize) for a rank that died and kills every process of the job at once,
     * this one too, before it reports the rank's status; it sees the end when we exit. */
    for (int i = 0; i < nfds; i++)
        if (fds[i] != pmi_at) hvd_close_fd(&fds[i]);
    if (rc != 0 && o.stop_signal) { /* stopped while the warm interpreter was busy */
        hvd_close_fd(&o.result_fd);
        *status = 128 + o.stop_signal;
        *stopped = stop_or_kill(o.stop_signal, o.stop_sender, res->error, sizeof res->error);
        return 0;
    }
    if (rc != 0) {
        hvd_close_fd(&o.result_fd);
        return -1;
    }
    pump_program(&rp, sig_fd, &o);
    hvd_close_fd(&o.result_fd);
    rank_wait(&rp, status, res->error, sizeof res->error);
    if (o.stop_signal && *status != 0)
        *stopped = stop_or_kill(o.stop_signal, o.stop_sender, res->error, sizeof res->error);
    else if (*status != 0 && !res->error[0])
        program_error(program_name(&code->argv), *status, &o.t, res->error, sizeof res->error);
    if (o.too_big && *status == 0) {
        *status = 1;
        snprintf(res->error, sizeof res->error,
                 "the result is larger than %d bytes (the most a rank can return: write a larger "
                 "one to a file and return its path)",
                 RESULT_MAX);
    }
    if (o.too_big || o.result.len == 0) {
        hvd_buf_free(&o.result);
    } else { /* handed over: freed with free() like a shared object's result */
        res->data = o.result.data;
        res->len = o.result.len;
    }
    return 0;
}

/* ---- Running a shared object ------------------------------------------------------------- */

static int run_object(const rank_info *ri, const hvd_code_msg *code, int *status,
                      hvd_entry_result *res) {
    int fd = memfd_create("hvd-entry", MFD_CLOEXEC);
    if (fd < 0) {
        snprintf(res->error, sizeof res->error, "memfd_create: %s", strerror(errno));
        return -1;
    }
    size_t off = 0;
    while (off < code->object.len) {
        ssize_t n = write(fd, code->object.data + off, code->object.len - off);
        if (n <= 0) {
            snprintf(res->error, sizeof res->error, "writing the entry point to memory: %s",
                     strerror(errno));
            close(fd);
            return -1;
        }
        off += (size_t)n;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(res->error, sizeof res->error, "cannot load the entry point: %s", dlerror());
        close(fd);
        return -1;
    }
    hvd_entry_fn fn;
    *(void **)&fn = dlsym(h, code->symbol);
    if (!fn) {
        snprintf(res->error, sizeof res->error, "the entry point has no symbol %s: %s",
                 code->symbol, dlerror());
        close(fd);
        return -1;
    }
    const char **gpus = calloc(ri->task.gpus.n + 1, sizeof *gpus);
    for (size_t i = 0; i < ri->task.gpus.n; i++)
        gpus[i] = ri->task.gpus.v[i];
    static const uint8_t empty[1];
    hvd_entry_ctx ctx = {.abi_version = HVD_ENTRY_ABI_VERSION,
                         .rank = ri->rank,
                         .size = ri->size,
                         .local_rank = ri->local_rank,
                         .local_size = ri->local_size,
                         .task_index = (int)ri->index,
                         .arg = code->arg.len ? code->arg.data : empty,
                         .arg_len = code->arg.len,
                         .gpus = gpus,
                         .ngpus = ri->task.gpus.n};
    *status = fn(&ctx, res);
    if (*status != 0 && !res->error[0])
        snprintf(res->error, sizeof res->error, "%s returned %d", code->symbol, *status);
    if (*status == 0) res->error[0] = '\0';
    free(gpus);
    /* The library stays loaded: its destructors may belong to runtimes still in use. */
    return 0;
}

/* ---- Reporting ----------------------------------------------------------------------------- */

/* The rank's task service, at the addresses its entry gave (no round trip to the driver),
 * else at those the driver gives now. */
static hvd_client *task_connect(const rank_info *ri, hvd_err *err) {
    char name[HVD_SERVICE_NAME_MAX];
    hvd_task_service_name(ri->index, name);
    hvd_client_config cc = {.service = name,
                            .secret = ri->secret,
                            .addrs = ri->task.addrs.v,
                            .naddrs = ri->task.addrs.n,
                            .stagger_ms = HVD_CONNECT_STAGGER_MS};
    hvd_client *c = cc.naddrs ? hvd_client_connect(&cc, err) : NULL;
    hvd_secret_wipe(&cc.secret);
    return c ? c : hvd_task_connect(ri->driver, &ri->secret, ri->index, err);
}

/* Hands the result to the driver (on the connection kept since the start: a call with
 * HVD_CALL_RETRY reconnects if the driver closed it meanwhile) and to the rank's task. */
static void report(const rank_info *ri, int status, bool stopped, const uint8_t *data, size_t len,
                   const char *error) {
    hvd_result_msg r = {.rank = ri->rank,
                        .index = ri->index,
                        .present = true,
                        .status = status,
                        .result = {(uint8_t *)data, len},
                        .error = error && *error ? (char *)error : NULL,
                        .stopped = stopped};
    hvd_err err;
    if (hvd_client_call(ri->driver, &hvd_report_result_desc, &r, &hvd_ack_desc, NULL, 0,
                        HVD_CALL_RETRY, &err) != 0)
        fprintf(stderr, "hvd-exec: rank %d: the driver did not take the result: %s\n", ri->rank,
                err.msg);
    /* A rank stopped as the job ends has a second at most before orted's SIGKILL: the driver
     * must hear it; its task, which keeps results for later readers, need not. */
    if (stopped) return;
    hvd_client *task = task_connect(ri, &err);
    if (!task || hvd_client_call(task, &hvd_register_result_desc, &r, &hvd_ack_desc, NULL, 0,
                                 HVD_CALL_RETRY, &err) != 0)
        fprintf(stderr, "hvd-exec: rank %d: task %u did not take the result: %s\n", ri->rank,
                ri->index, err.msg);
    hvd_client_close(task);
}

/* ---- What a shared object leaves running ---------------------------------------------------- */

/* A shared object's entry point runs in this process, which is its children's child subreaper
 * (run_entry): what it started and left running (a background child, a setsid daemon, a
 * double-forked process) is re-parented here, not to init. Its output is the rank's, so it
 * would hold orted, and the job, until it ended by itself. */
static hvd_proctree leftovers; /* one walk at a time: main, or the stop watcher (claimed) */

#define LEFTOVER_POLL_MS 20

/* Reaps what has ended; returns whether a descendant still lives (a walk with signal 0). */
static bool leftovers_alive(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    return hvd_proctree_signal(&leftovers, 0) > 0;
}

/* Stops what the entry point left running, as a program's keeper does when its program exits:
 * SIGTERM (and SIGCONT to stopped ones), SIGKILL after the grace period, until nothing is left.
 * What SIGKILL has not ended a grace period later (a process stuck in the kernel) is left to the
 * keeper of orted's command, which stops what is left when the job ends: the rank itself ends. */
static void stop_leftovers(int rank) {
    leftovers.root = getpid();
    if (!leftovers_alive()) return;
    (void)hvd_proctree_signal(&leftovers, SIGTERM);
    (void)hvd_proctree_signal(&leftovers, SIGCONT);
    int64_t kill_at = hvd_now_ms() + HVD_PROC_DEFAULT_GRACE_MS;
    int64_t give_up = kill_at + HVD_PROC_DEFAULT_GRACE_MS;
    const struct timespec poll_ts = {0, LEFTOVER_POLL_MS * 1000000L};
    while (leftovers_alive()) {
        int64_t now = hvd_now_ms();
        if (now >= give_up) {
            fprintf(stderr,
                    "hvd-exec: rank %d: what the entry point left running did not end %d ms "
                    "after SIGKILL; the rank ends without it\n",
                    rank, HVD_PROC_DEFAULT_GRACE_MS);
            return;
        }
        if (now >= kill_at) (void)hvd_proctree_signal(&leftovers, SIGKILL);
        nanosleep(&poll_ts, NULL);
    }
}

/* ---- A shared object stopped from outside -------------------------------------------------- */

/* A shared object runs on the main thread and cannot be interrupted: a signal (orted's
 * SIGTERM when mpirun ends the job, or anyone else's) is watched by this thread, which reports
 * how the rank ended (stopped by orted, or killed by someone else: stop_or_kill) and ends the
 * process, so that the driver learns whether this rank failed on its own.
 * Whoever claims the report first (the watcher, or the main thread once the entry point
 * returned) sends it; the other stands back. */
#define STOP_REPORT_MAX_S 2 /* a stopped rank's report, then SIGALRM ends it */

typedef struct stop_watch {
    const rank_info *ri;
    int sig_fd;
    int quit[2]; /* main -> watcher: the entry point returned */
    atomic_bool claimed;
    pthread_t thread;
    bool running;
} stop_watch;

static void *stop_watch_main(void *arg) {
    stop_watch *w = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = w->sig_fd, .events = POLLIN},
                               {.fd = w->quit[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) continue;
        if (pf[1].revents) return NULL;
        pid_t from = 0;
        int sig = hvd_signals_next_from(w->sig_fd, &from);
        if (!sig || atomic_exchange(&w->claimed, true)) continue;
        char error[HVD_ENTRY_ERROR_MAX];
        bool stop = stop_or_kill(sig, from, error, sizeof error);
        /* orted may exit right after its SIGTERM, and its death would SIGKILL us before the
         * driver hears how we ended: outlive it for the report, two seconds at most. */
        prctl(PR_SET_PDEATHSIG, 0);
        alarm(STOP_REPORT_MAX_S);
        fprintf(stderr, "hvd-exec: rank %d: %s\n", w->ri->rank, error);
        /* What the entry point started goes with it (what ignores this, the keeper of orted's
         * command stops when the job ends). */
        leftovers.root = getpid();
        (void)hvd_proctree_signal(&leftovers, SIGTERM);
        report(w->ri, 128 + sig, stop, NULL, 0, error);
        _exit(128 + sig);
    }
}

static void stop_watch_start(stop_watch *w, const rank_info *ri, int sig_fd) {
    *w = (stop_watch){.ri = ri, .sig_fd = sig_fd, .quit = {-1, -1}};
    atomic_init(&w->claimed, false);
    if (sig_fd < 0 || pipe2(w->quit, O_CLOEXEC) != 0) return;
    w->running = pthread_create(&w->thread, NULL, stop_watch_main, w) == 0;
}

/* The entry point returned: ends the watcher, unless it already took a signal, in which case
 * it reports and ends the process while this thread waits. */
static void stop_watch_end(stop_watch *w) {
    if (w->running && atomic_exchange(&w->claimed, true)) {
        for (;;)
            pause();
    }
    if (w->running) {
        (void)!write(w->quit[1], "q", 1);
        pthread_join(w->thread, NULL);
    }
    hvd_close_fd(&w->quit[0]);
    hvd_close_fd(&w->quit[1]);
}

/* ---- The rank's life --------------------------------------------------------------------- */

/* Where each launcher puts the rank's numbers: Open MPI (orted and prted), Hydra's proxy
 * (MPICH, Intel MPI), or by hand. */
static const char *const RANK_VARS[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK", NULL};
static const char *const SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE", NULL};
static const char *const LOCAL_RANK_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                              "HOROVOD_LOCAL_RANK", NULL};
static const char *const LOCAL_SIZE_VARS[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                              "HOROVOD_LOCAL_SIZE", NULL};

/* The rank's numbers and host hash from the environment the MPI daemon (orted, prted,
 * hydra_pmi_proxy) gives it. Returns 0, or the exit status after printing why. */
static int rank_from_env(rank_info *ri) {
    if (env_int(RANK_VARS, &ri->rank) != 0)
        return fail("%s is not set: hvd-exec must be started by mpirun or mpiexec (or with "
                    "HOROVOD_RANK)",
                    "OMPI_COMM_WORLD_RANK (Open MPI) or PMI_RANK (MPICH)");
    if (env_int(LOCAL_RANK_VARS, &ri->local_rank) != 0)
        return fail("%s is not set", "OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID (MPICH) or "
                                     "HOROVOD_LOCAL_RANK");
    if (env_int(SIZE_VARS, &ri->size) != 0) ri->size = 0;
    if (env_int(LOCAL_SIZE_VARS, &ri->local_size) != 0) ri->local_size = 0;
    ri->host_hash = getenv(HVD_HOSTNAME_ENV);
    if (!ri->host_hash || !*ri->host_hash)
        return fail("%s is not set: hvd-exec must run under a task service's orted",
                    HVD_HOSTNAME_ENV);
    return 0;
}

/* Tells the driver which rank this is, learns its task and the task's entry (GPUs, work
 * dir), fetches the job's entry point and leaves a RANK_WATCH on the connection, which
 * stays open for the report (the held watch keeps it from the driver's idle timeout; a broken
 * one is reconnected by the report). Returns 0, or the exit status. */
#define CODE_TIMEOUT_MS (10 * 60 * 1000)

static int fetch_job(rank_info *ri, hvd_code_msg *code) {
    hvd_err err;
    hvd_client *driver = ri->driver = hvd_driver_connect_env(&ri->secret, &err);
    if (!driver) return fail("%s", err.msg);
    hvd_local_rank_msg lr = {.host_hash = (char *)ri->host_hash,
                             .local_rank = (uint32_t)ri->local_rank,
                             .rank = (uint32_t)ri->rank};
    hvd_index_msg idx, iq;
    int rc = hvd_client_call(driver, &hvd_set_local_rank_desc, &lr, &hvd_index_desc, &idx, 0,
                             HVD_CALL_RETRY, &err);
    if (rc == 0) {
        ri->index = iq.index = idx.index;
        rc = hvd_client_call(driver, &hvd_task_info_req_desc, &iq, &hvd_task_info_desc, &ri->task,
                             0, HVD_CALL_RETRY, &err);
    }
    if (rc == 0) { /* a payload of up to 2 GiB, which takes its time with many ranks */
        hvd_client_set_max_frame(driver, HVD_CODE_MAX_FRAME);
        rc = hvd_client_call(driver, &hvd_code_req_desc, NULL, &hvd_code_desc, code,
                             CODE_TIMEOUT_MS, HVD_CALL_RETRY, &err);
        hvd_client_set_max_frame(driver, 0);
    }
    if (rc != 0) return fail("%s", err.msg);
    /* Held, never answered, for as long as this process lives: if it dies before its report,
     * the driver learns when (which silent rank went first). Best effort. */
    hvd_rank_msg watch = {.rank = (uint32_t)ri->rank};
    (void)hvd_client_send(driver, &hvd_rank_watch_desc, &watch, &err);
    return 0;
}

/* Tells the entry point which task service it stands for (HVD_TASK_INDEX; orted's is its
 * host's first task's) and where it is (HVD_TASK_ADDRS): an elastic rank commits its state
 * there. */
static void export_task_addrs(const rank_info *ri) {
    char index[16];
    snprintf(index, sizeof index, "%u", ri->index);
    setenv(HVD_TASK_INDEX_ENV, index, 1);
    char *text = hvd_addrs_format(ri->task.addrs.v, ri->task.addrs.n);
    if (text) setenv(HVD_TASK_ADDRS_ENV, text, 1);
    free(text);
}

/* Runs the entry point. Returns its status, with result bytes and error text in res, and
 * whether a signal to this rank stopped it. */
static int run_entry(const rank_info *ri, hvd_code_msg *code, int sig_fd, bool *stopped,
                     hvd_entry_result *res) {
    int status = 1;
    *stopped = false;
    if ((code->kind == HVD_CODE_ARGV || code->kind == HVD_CODE_ARGV_IO) && code->argv.n > 0) {
        if (run_program(ri, code, sig_fd, &status, stopped, res) != 0) status = 127;
    } else if (code->kind == HVD_CODE_SHARED_OBJECT && code->symbol) {
        (void)prctl(PR_SET_CHILD_SUBREAPER, 1); /* what it leaves is ours to stop */
        stop_watch w;
        stop_watch_start(&w, ri, sig_fd);
        if (run_object(ri, code, &status, res) != 0) status = 127;
        stop_watch_end(&w);
    } else {
        snprintf(res->error, sizeof res->error, "the driver sent an empty entry point (kind %u)",
                 code->kind);
    }
    return status;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            fputs(USAGE, stdout);
            return 0;
        }
        return fail("unexpected argument %s (hvd-exec takes none; see --help)", argv[1]);
    }
    /* Die with orted: the parent death signal, and a check that it has not died already. */
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) return 1;
    note_daemon();

    rank_info ri = {0};
    hvd_code_msg code = {0};
    int rc = rank_from_env(&ri);
    if (rc == 0) rc = fetch_job(&ri, &code);
    if (rc != 0) {
        hvd_client_close(ri.driver);
        hvd_secret_wipe(&ri.secret);
        hvd_msg_free(&hvd_task_info_desc, &ri.task);
        return rc;
    }
    /* The executor's work dir: orted starts ranks in mpirun's directory. */
    const char *wd = getenv(HVD_WORK_DIR_ENV);
    if (!wd || !*wd) wd = ri.task.work_dir;
    if (wd && *wd && chdir(wd) != 0)
        fprintf(stderr, "hvd-exec: rank %d: cannot change into %s: %s\n", ri.rank, wd,
                strerror(errno));
    export_task_addrs(&ri);
    bool elastic = getenv(HVD_ELASTIC_EPOCH_ENV) != NULL;
    /* orted aborts ranks with SIGTERM: passed on to a program entry point. An elastic rank's
     * shared object is restartable from its last commit: SIGTERM ends it at once. */
    int sig_fd = elastic && code.kind == HVD_CODE_SHARED_OBJECT ? -1 : hvd_signals_install(NULL);
    hvd_entry_result res = {.data = NULL};
    bool stopped;
    int status = run_entry(&ri, &code, sig_fd, &stopped, &res);
    bool reset = elastic && status == HVD_ELASTIC_EXIT_RESET;
    if (status != 0 && !reset) fprintf(stderr, "hvd-exec: rank %d: %s\n", ri.rank, res.error);
    report(&ri, status, stopped, res.data, res.len, res.error);
    if (code.kind == HVD_CODE_SHARED_OBJECT) stop_leftovers(ri.rank);
    if (elastic && !reset && !stopped && status > 0 && status < 128) {
        /* Let the ranks failing alike report too before mpirun aborts them. */
        struct timespec ts = {HVD_ELASTIC_FAIL_LINGER_MS / 1000,
                              (HVD_ELASTIC_FAIL_LINGER_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    hvd_client_close(ri.driver);
    hvd_secret_wipe(&ri.secret);
    free(res.data);
    hvd_msg_free(&hvd_code_desc, &code);
    hvd_msg_free(&hvd_task_info_desc, &ri.task);
    /* A rank ending for a reset told the driver so; mpirun need not abort the others. */
    if (reset) return 0;
    return status > 255 ? 255 : status;
}
