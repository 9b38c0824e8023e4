/* Tests of the process runner (task_service/command.c) with real processes: exit codes,
 * output through the formatter, environment, working directory, stdin, descriptor hygiene,
 * abort of process trees (trapped SIGTERM, setsid, re-parented daemons) with the grace
 * period, the lifeline when the owner is SIGKILLed, daemons that outlive the shell (or, for a
 * rank's program, are stopped when it exits), back-pressure, and the fallbacks for old
 * kernels. Everything runs twice: with the keeper program hvd-keeper (HVD_KEEPER, what every
 * program and library finds beside it) and with the keeper in place (HVD_KEEPER=none, a
 * forked copy of this process).
 *
 * Processes of a command are found by a unique marker variable in their environment
 * (HVD_TEST_MARK), so the checks see every process the command left, wherever it went. Waits
 * are bounded (to avoid hangs); the only timing assertion is a lower bound: an abort must
 * not SIGKILL before the grace period is over. */
#include "common/proc.h"
#include "common/env.h"
#include "output.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Generous bound for anything that should take milliseconds. */
#define WAIT_MS 10000

/* ---------------------------------------------------------------------------------------- */
/* Helpers */

typedef struct buf {
    char *data;
    size_t len, cap;
} buf;

static void buf_add(buf *b, const void *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->data = realloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_free(buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

static bool buf_is(const buf *b, const char *want, size_t want_len) {
    return b->len == want_len && (want_len == 0 || memcmp(b->data, want, want_len) == 0);
}

#define S(lit) lit, sizeof(lit) - 1

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool readable(int fd, int timeout_ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r;
    while ((r = poll(&pf, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    return r > 0;
}

static bool file_exists(const char *dir, const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void make_file(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static bool file_has(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX], got[256] = "";
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    fclose(f);
    return strstr(got, text) != NULL;
}

/* A fresh temporary directory and a marker value unique to this run and call. */
struct scene {
    char dir[64];
    char mark[128]; /* "HVD_TEST_MARK=<unique>" */
    char **envp;    /* environ + HVD_TEST_MARK + HVD_TEST_DIR */
};

static void scene_init(struct scene *s) {
    static int counter;
    snprintf(s->dir, sizeof s->dir, "/tmp/hvd-task-test-XXXXXX");
    CHECK(mkdtemp(s->dir) != NULL);
    char value[80];
    snprintf(value, sizeof value, "m%d-%lld-%d", (int)getpid(), (long long)test_now_ms(),
             ++counter);
    snprintf(s->mark, sizeof s->mark, "HVD_TEST_MARK=%s", value);
    hvd_env_change ch[] = {{"HVD_TEST_MARK", value}, {"HVD_TEST_DIR", s->dir}};
    hvd_err err = {0};
    s->envp = hvd_env_build(environ, ch, 2, &err);
    CHECK_MSG(s->envp != NULL, "%s", err.msg);
}

static void scene_free(struct scene *s) {
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    CHECK(system(cmd) == 0);
    hvd_env_free(s->envp);
}

/* Number of live processes whose environment holds s->mark (zombies have none). */
static int count_marked(const struct scene *s) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    size_t mlen = strlen(s->mark) + 1; /* with the NUL that ends an environ entry */
    char *data = malloc(1 << 20);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid()) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        size_t len = 0;
        ssize_t n;
        while (len < (1 << 20) && (n = read(fd, data + len, (1 << 20) - len)) > 0)
            len += (size_t)n;
        close(fd);
        if (len >= mlen && memmem(data, len, s->mark, mlen)) count++;
    }
    free(data);
    closedir(d);
    return count;
}

/* Waits (bounded) until count_marked(s) satisfies `want_at_least` (>= n) or `== n`. */
static int wait_marked(const struct scene *s, int n, bool at_least) {
    int64_t deadline = test_now_ms() + WAIT_MS;
    int c;
    while ((c = count_marked(s)), at_least ? c < n : c != n) {
        if (test_now_ms() > deadline) break;
        sleep_ms(20);
    }
    return c;
}

static bool wait_files(const char *dir, const char *const *names) {
    int64_t deadline = test_now_ms() + WAIT_MS;
    for (; *names; names++)
        while (!file_exists(dir, *names))
            if (test_now_ms() > deadline)
                return false;
            else
                sleep_ms(10);
    return true;
}

static hvd_proc *start(const char *command, char *const *envp, const char *cwd, int grace_ms) {
    hvd_proc_spec spec = {.command = command, .envp = envp, .cwd = cwd, .grace_ms = grace_ms};
    hvd_err err = {0};
    hvd_proc *c = hvd_proc_start(&spec, &err);
    CHECK_MSG(c != NULL, "start '%s': %s", command, err.msg);
    return c;
}

struct result {
    buf out, err; /* formatted stdout and stderr */
    int code;     /* exit code, or -1000 if not known */
    int signal;   /* hvd_proc_exit_signal */
};

static void result_free(struct result *r) {
    buf_free(&r->out);
    buf_free(&r->err);
}

/* Formats bytes through f into b, with a small output buffer to exercise partial calls. */
static void format_into(hvd_output *f, const char *in, size_t n, buf *b) {
    char out[1000];
    for (size_t off = 0; off < n;) {
        size_t used;
        size_t w = hvd_output_format(f, in + off, n - off, out, sizeof out, &used);
        buf_add(b, out, w);
        off += used;
    }
}

/* Drives a started command like an event loop would: reads stdout and stderr through
 * formatters (index < 0: pass-through) until both are at end-of-file and the exit descriptor
 * is readable, then reaps it. Aborts the command if that takes longer than WAIT_MS. */
static void drive(hvd_proc *c, int index, struct result *r) {
    memset(r, 0, sizeof *r);
    r->code = -1000;
    if (!c) return;
    hvd_output fmt[2];
    hvd_output_opts o_out = {.index = index, .stream = HVD_OUTPUT_STDOUT};
    hvd_output_opts o_err = {.index = index, .stream = HVD_OUTPUT_STDERR};
    hvd_output_init(&fmt[0], &o_out);
    hvd_output_init(&fmt[1], &o_err);
    buf *dst[2] = {&r->out, &r->err};
    int fds[2] = {hvd_proc_stdout_fd(c), hvd_proc_stderr_fd(c)};
    bool eof[2] = {false, false}, ended = false;
    int64_t deadline = test_now_ms() + WAIT_MS;
    while (!(eof[0] && eof[1] && ended)) {
        struct pollfd pf[3];
        int map[3], n = 0;
        for (int i = 0; i < 2; i++)
            if (!eof[i]) {
                pf[n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
                map[n++] = i;
            }
        if (!ended) {
            pf[n] = (struct pollfd){.fd = hvd_proc_exit_fd(c), .events = POLLIN};
            map[n++] = 2;
        }
        int64_t left = deadline - test_now_ms();
        if (left <= 0) {
            CHECK_MSG(0, "command did not end within %d ms", WAIT_MS);
            hvd_proc_abort(c);
            break;
        }
        if (poll(pf, (nfds_t)n, (int)left) < 0) continue;
        for (int k = 0; k < n; k++) {
            if (!pf[k].revents) continue;
            if (map[k] == 2) {
                ended = true;
                continue;
            }
            char chunk[4096];
            ssize_t got = read(pf[k].fd, chunk, sizeof chunk);
            if (got > 0)
                format_into(&fmt[map[k]], chunk, (size_t)got, dst[map[k]]);
            else if (got == 0 || errno != EAGAIN)
                eof[map[k]] = true;
        }
    }
    if (ended) CHECK(hvd_proc_reap(c, &r->code) == 0);
}

static void run(const char *command, char *const *envp, const char *cwd, int index,
                struct result *r) {
    hvd_proc *c = start(command, envp, cwd, 0);
    drive(c, index, r);
    r->signal = c ? hvd_proc_exit_signal(c) : -1;
    hvd_proc_free(c);
}

/* The tree of processes the abort and lifeline tests kill: processes that ignore SIGTERM
 * (exec'd, in a new session, double-forked away to be re-parented), one that handles SIGTERM
 * gracefully, one that handles it but has stopped itself (it needs the SIGCONT that follows
 * SIGTERM to run its handler), and a plain setsid'd sleep. Each reports readiness by creating
 * a file once its trap is set. Stable process count: 8. The graceful ones' stderr goes to
 * /dev/null: when a `sleep` dies of SIGTERM, dash reports "Terminated" on stderr, and once
 * the owner is dead the output pipes have no reader, so that write would end it with SIGPIPE
 * before its trap runs. */
static const char tree_script[] =
    "sh -c 'trap \"\" TERM; touch \"$HVD_TEST_DIR/r1\"; exec sleep 1000' &\n"
    "setsid sh -c 'trap \"\" TERM; touch \"$HVD_TEST_DIR/r2\"; sleep 1000' &\n"
    "(sh -c 'trap \"\" TERM; touch \"$HVD_TEST_DIR/r3\"; exec sleep 1000' &)\n"
    "sh -c 'trap \"echo graceful > \\\"$HVD_TEST_DIR/graceful\\\"; exit 0\" TERM;"
    " touch \"$HVD_TEST_DIR/r4\"; while :; do sleep 0.05; done' 2>/dev/null &\n"
    "sh -c 'trap \"echo resumed > \\\"$HVD_TEST_DIR/resumed\\\"; exit 0\" TERM;"
    " echo $$ > \"$HVD_TEST_DIR/r5.tmp\"; mv \"$HVD_TEST_DIR/r5.tmp\" \"$HVD_TEST_DIR/r5\";"
    " kill -STOP $$; while :; do sleep 0.05; done' 2>/dev/null &\n"
    "setsid sleep 1000 &\n"
    "echo ready\n"
    "wait\n";
#define TREE_PROCS 8

static const char *const tree_ready[] = {"r1", "r2", "r3", "r4", "r5", NULL};

/* Waits (bounded) until the tree's self-stopping process is stopped. */
static bool tree_stopped(const struct scene *s) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/r5", s->dir);
    FILE *f = fopen(path, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1) pid = 0;
        fclose(f);
    }
    if (pid <= 0) return false;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int64_t deadline = test_now_ms() + WAIT_MS; test_now_ms() < deadline; sleep_ms(10)) {
        char stat[512] = "";
        f = fopen(path, "r");
        if (!f) return false;
        size_t n = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[n] = '\0';
        char *paren = strrchr(stat, ')');
        if (paren && paren[1] == ' ' && paren[2] == 'T') return true;
    }
    return false;
}

/* Writes the tree script into the scene's directory; returns the command that runs it. */
static void tree_command(const struct scene *s, char *cmd, size_t cap) {
    make_file(s->dir, "tree.sh", tree_script);
    snprintf(cmd, cap, ". '%s/tree.sh'", s->dir);
}

/* ---------------------------------------------------------------------------------------- */
/* Tests */

static void test_exit_codes(void) {
    static const struct {
        const char *cmd;
        int code, signal; /* killed by a signal, or exited with a code that looks like it */
    } cases[] = {
        {"exit 0", 0, 0},
        {"exit 3", 3, 0},
        {"kill -TERM $$", 143, 15},
        {"kill -KILL $$", 137, 9},
        {"exit 255", 255, 0},
        {"true", 0, 0},
        {"no_such_command_hvd", 127, 0},
        {"exit 137", 137, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct result r;
        run(cases[i].cmd, NULL, NULL, -1, &r);
        CHECK_MSG(r.code == cases[i].code, "'%s': exit code %d, want %d", cases[i].cmd, r.code,
                  cases[i].code);
        CHECK_MSG(r.signal == cases[i].signal, "'%s': signal %d, want %d", cases[i].cmd, r.signal,
                  cases[i].signal);
        result_free(&r);
    }
}

static void test_exit_fd_readable_when_ended(void) {
    hvd_proc *c = start("exit 9", NULL, NULL, 0);
    if (!c) return;
    CHECK(readable(hvd_proc_exit_fd(c), 5000));
    int code = -1;
    CHECK(hvd_proc_reap(c, &code) == 0);
    CHECK(code == 9);
    CHECK(hvd_proc_reap(c, &code) == 0 && code == 9); /* again: same answer */
    hvd_proc_abort(c);                                /* ended: a no-op */
    hvd_proc_abort(c);
    CHECK(hvd_proc_reap(c, &code) == 0 && code == 9);
    hvd_proc_free(c);

    /* Abort after the end but before reaping: still a no-op, and no SIGPIPE here. */
    c = start("exit 4", NULL, NULL, 0);
    if (!c) return;
    CHECK(readable(hvd_proc_exit_fd(c), 5000));
    hvd_proc_abort(c);
    CHECK(hvd_proc_wait(c, 5000, &code) == 0);
    CHECK(code == 4);
    hvd_proc_free(c);
}

static void test_output_streams(void) {
    const char *cmd = "echo out; echo err >&2; printf 'partial'";
    struct result r;
    run(cmd, NULL, NULL, -1, &r);
    CHECK(buf_is(&r.out, S("out\npartial")));
    CHECK(buf_is(&r.err, S("err\n")));
    CHECK(r.code == 0);
    result_free(&r);
    run(cmd, NULL, NULL, 3, &r);
    CHECK(buf_is(&r.out, S("[3]<stdout>:out\n[3]<stdout>:partial")));
    CHECK(buf_is(&r.err, S("[3]<stderr>:err\n")));
    result_free(&r);
}

static void test_binary_and_cr(void) {
    /* dash's printf understands octal escapes: NUL, 0x01, 0xff, then CR-terminated lines. */
    const char *cmd = "printf 'a\\000b\\001\\377\\nx\\ry\\r\\nz'";
    struct result r;
    run(cmd, NULL, NULL, -1, &r);
    CHECK(buf_is(&r.out, S("a\0b\x01\xff\nx\ry\r\nz")));
    result_free(&r);
    run(cmd, NULL, NULL, 0, &r);
    CHECK(buf_is(&r.out, S("[0]<stdout>:a\0b\x01\xff\n[0]<stdout>:x\r[0]<stdout>:y\r"
                           "[0]<stdout>:\n[0]<stdout>:z")));
    CHECK(r.code == 0);
    result_free(&r);
}

static void test_long_line(void) {
    const char *cmd = "head -c 1048576 /dev/zero | tr '\\000' x; echo";
    size_t n = 1 << 20;
    for (int index = -1; index <= 5; index += 6) {
        struct result r;
        run(cmd, NULL, NULL, index, &r);
        const char *prefix = index < 0 ? "" : "[5]<stdout>:";
        size_t plen = strlen(prefix);
        bool ok = r.out.len == plen + n + 1 && memcmp(r.out.data, prefix, plen) == 0 &&
                  r.out.data[plen + n] == '\n';
        for (size_t i = 0; ok && i < n; i++)
            ok = r.out.data[plen + i] == 'x';
        CHECK_MSG(ok, "index %d: %zu bytes", index, r.out.len);
        CHECK(r.code == 0);
        result_free(&r);
    }
}

static void test_env_cwd_stdin(void) {
    char dir[] = "/tmp/hvd-task-cwd-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char real[PATH_MAX];
    CHECK(realpath(dir, real) != NULL);
    char *base[] = {"PATH=/usr/bin:/bin", "HVD_KEEP=k", "HVD_DROP=d", NULL};
    hvd_env_change ch[] = {{"HVD_KEEP", "kept value"}, {"HVD_DROP", NULL}, {"HVD_NEW", "n e w"}};
    char **envp = hvd_env_build(base, ch, 3, NULL);
    struct result r;
    run("echo \"$HVD_KEEP|${HVD_DROP-unset}|$HVD_NEW\"; pwd -P; cat; echo \"cat=$?\";"
        " readlink /proc/self/fd/0",
        envp, dir, -1, &r);
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "kept value|unset|n e w\n%s\ncat=0\n/dev/null\n", real);
    CHECK_MSG(buf_is(&r.out, want, strlen(want)), "got '%s'", r.out.data ? r.out.data : "");
    CHECK(r.code == 0);
    result_free(&r);
    hvd_env_free(envp);
    rmdir(dir);
}

/* The command inherits no descriptor but 0, 1 and 2, even ones not marked close-on-exec. */
static void test_no_descriptor_leak(void) {
    int leaky = open("/dev/null", O_RDONLY); /* deliberately without O_CLOEXEC */
    int p[2];
    CHECK(pipe(p) == 0);
    hvd_proc *other = start("sleep 1000", NULL, NULL, 0); /* its fds must not leak either */
    struct result r;
    /* ls lists its own descriptors: 0-2 and the one it reads the directory with. */
    run("ls /proc/self/fd", NULL, NULL, -1, &r);
    CHECK_MSG(buf_is(&r.out, S("0\n1\n2\n3\n")), "got '%s'", r.out.data ? r.out.data : "");
    result_free(&r);
    hvd_proc_free(other);
    close(leaky);
    close(p[0]);
    close(p[1]);
}

static void test_session_and_group(void) {
    hvd_proc *c = start("sleep 1000", NULL, NULL, 0);
    if (!c) return;
    pid_t shell = hvd_proc_pid(c), keeper = hvd_proc_keeper_pid(c);
    CHECK(shell > 0 && keeper > 0 && shell != keeper);
    CHECK(hvd_proc_pgid(c) == shell);
    CHECK(getpgid(shell) == shell);
    CHECK(getsid(shell) == shell);
    /* The keeper is out of our process group and session, so signals to our group miss it. */
    CHECK(getpgid(keeper) != getpgid(0));
    CHECK(getsid(keeper) != getsid(0));
    CHECK(hvd_proc_reap(c, NULL) == 1); /* running */
    int64_t t0 = test_now_ms();
    hvd_proc_free(c); /* aborts: sleep dies on SIGTERM, no grace wait needed */
    CHECK(test_now_ms() - t0 < HVD_PROC_DEFAULT_GRACE_MS);
}

/* The keeper killed: the shell dies with it (PR_SET_PDEATHSIG), and reaping the keeper takes
 * down what the shell left (its background sleep), which counts as killed by SIGKILL. */
static void test_keeper_killed(void) {
    struct scene s;
    scene_init(&s);
    hvd_proc *c = start("sleep 1000 & wait", s.envp, NULL, 0);
    pid_t shell = c ? hvd_proc_pid(c) : 0;
    if (c) {
        CHECK(wait_marked(&s, 2, true) >= 2); /* the shell and its sleep */
        CHECK(kill(hvd_proc_keeper_pid(c), SIGKILL) == 0);
        CHECK(readable(hvd_proc_exit_fd(c), WAIT_MS));
        int code = -1;
        CHECK(hvd_proc_reap(c, &code) == 0);
        CHECK_MSG(code == 137 && hvd_proc_exit_signal(c) == SIGKILL, "exit code %d, signal %d",
                  code, hvd_proc_exit_signal(c));
        int left = wait_marked(&s, 0, false);
        CHECK_MSG(left == 0, "%d processes of the command outlived its keeper", left);
        hvd_proc_free(c);
    }
    if (shell > 0) kill(-shell, SIGKILL); /* clean up even if a check failed */
    scene_free(&s);
}

/* What a stopped tree leaves: nothing, once its TERM handler ran and the process that had
 * stopped itself was resumed (SIGCONT). */
static void check_tree_gone(struct scene *s) {
    int left = count_marked(s);
    CHECK_MSG(left == 0, "%d processes left", left);
    CHECK(file_has(s->dir, "graceful", "graceful"));
    CHECK(file_has(s->dir, "resumed", "resumed"));
}

/* Abort: everything is gone afterwards, TERM handlers ran, and SIGKILL came no earlier than
 * the grace period. */
static void check_abort_tree(int grace_ms) {
    struct scene s;
    scene_init(&s);
    char cmd[PATH_MAX];
    tree_command(&s, cmd, sizeof cmd);
    hvd_proc *c = start(cmd, s.envp, NULL, grace_ms);
    if (c) {
        CHECK(wait_files(s.dir, tree_ready));
        CHECK(tree_stopped(&s));
        int n = wait_marked(&s, TREE_PROCS, true);
        CHECK_MSG(n >= TREE_PROCS, "%d processes", n);
        CHECK(!readable(hvd_proc_exit_fd(c), 0));
        int64_t t0 = test_now_ms();
        hvd_proc_abort(c);
        hvd_proc_abort(c); /* twice: harmless */
        CHECK(readable(hvd_proc_exit_fd(c), WAIT_MS));
        int64_t elapsed = test_now_ms() - t0;
        int code = -1;
        CHECK(hvd_proc_reap(c, &code) == 0);
        CHECK_MSG(code == 143, "exit code %d", code); /* the shell, in `wait`, died of TERM */
        CHECK_MSG(elapsed >= grace_ms - 5, "ended %lld ms after abort, grace %d ms",
                  (long long)elapsed, grace_ms);
        check_tree_gone(&s);
        hvd_proc_free(c);
    }
    CHECK(wait_marked(&s, 0, false) == 0); /* clean up even if a check failed */
    scene_free(&s);
}

static void test_abort_tree(void) {
    check_abort_tree(1000);
}

/* An abort that turns urgent: a command that ignores SIGTERM, aborted with a long grace
 * period, then again with a short one, is killed after the short one; a later abort with a
 * longer grace does not lengthen it. */
static void test_abort_within(void) {
    hvd_proc_spec spec = {.command = "trap '' TERM; while :; do sleep 0.05; done",
                          .grace_ms = 20000};
    hvd_proc *c = hvd_proc_start(&spec, NULL);
    CHECK(c != NULL);
    if (!c) return;
    int code = 0;
    CHECK(hvd_proc_wait(c, 200, &code) == 1); /* running */
    int64_t t0 = test_now_ms();
    hvd_proc_abort(c);
    CHECK(hvd_proc_wait(c, 300, &code) == 1); /* SIGTERM ignored: still running */
    hvd_proc_abort_within(c, 200);
    hvd_proc_abort_within(c, 60000);
    CHECK(hvd_proc_wait(c, 5000, &code) == 0);
    int64_t took = test_now_ms() - t0;
    CHECK_MSG(took < 3000, "ended %lld ms after the abort (grace cut to 200 ms)", (long long)took);
    CHECK_MSG(code == 128 + SIGKILL, "exit code %d", code);
    hvd_proc_free(c);
}

/* hvd_proc_kill: the whole tree (which ignores and handles SIGTERM) is gone at once, long
 * before the grace period; the shell died of SIGKILL. */
static void test_kill_tree(void) {
    struct scene s;
    scene_init(&s);
    char cmd[PATH_MAX];
    tree_command(&s, cmd, sizeof cmd);
    hvd_proc *c = start(cmd, s.envp, NULL, 20000);
    if (c) {
        CHECK(wait_files(s.dir, tree_ready));
        CHECK(wait_marked(&s, TREE_PROCS, true) >= TREE_PROCS);
        int64_t t0 = test_now_ms();
        hvd_proc_kill(c);
        hvd_proc_abort(c); /* an abort after the kill changes nothing */
        CHECK(readable(hvd_proc_exit_fd(c), WAIT_MS));
        int64_t elapsed = test_now_ms() - t0;
        int code = -1;
        CHECK(hvd_proc_reap(c, &code) == 0);
        CHECK_MSG(code == 137, "exit code %d", code);
        CHECK_MSG(elapsed < 10000, "ended %lld ms after the kill (grace 20 s)", (long long)elapsed);
        CHECK_MSG(count_marked(&s) == 0, "%d processes left", count_marked(&s));
        hvd_proc_free(c);
    }
    CHECK(wait_marked(&s, 0, false) == 0);
    scene_free(&s);
}

/* Starts the tree as a forked "owner" process, SIGKILLs the owner, and checks that every
 * process of the command is gone soon after. With hold_lifeline the owner first forks a
 * child that keeps a copy of the lifeline socket open: only PR_SET_PDEATHSIG can tell. */
static void check_owner_killed(bool hold_lifeline) {
    struct scene s;
    scene_init(&s);
    char cmd[PATH_MAX];
    tree_command(&s, cmd, sizeof cmd);
    int report[2];
    CHECK(pipe(report) == 0);
    pid_t owner = fork();
    if (owner == 0) {
        close(report[0]);
        hvd_proc_spec spec = {.command = cmd, .envp = s.envp, .grace_ms = 500};
        hvd_proc *c = hvd_proc_start(&spec, NULL);
        pid_t pids[2] = {c ? hvd_proc_keeper_pid(c) : -1, -1};
        if (c && hold_lifeline) {
            pids[1] = fork();
            if (pids[1] == 0) {
                for (;;)
                    pause(); /* holds every descriptor of the owner */
            }
        }
        if (write(report[1], pids, sizeof pids) != sizeof pids) _exit(2);
        for (;;)
            pause();
    }
    close(report[1]);
    pid_t pids[2] = {-1, -1};
    CHECK(read(report[0], pids, sizeof pids) == sizeof pids);
    close(report[0]);
    CHECK(pids[0] > 0);
    CHECK(wait_files(s.dir, tree_ready));
    CHECK(tree_stopped(&s));
    CHECK(wait_marked(&s, TREE_PROCS, true) >= TREE_PROCS);
    CHECK(kill(owner, SIGKILL) == 0);
    CHECK(waitpid(owner, NULL, 0) == owner);
    int left = wait_marked(&s, 0, false);
    CHECK_MSG(left == 0, "%d processes left %d ms after the owner was killed", left, WAIT_MS);
    CHECK(file_has(s.dir, "graceful", "graceful")); /* SIGTERM came first */
    CHECK(file_has(s.dir, "resumed", "resumed"));
    if (pids[1] > 0) kill(pids[1], SIGKILL); /* reparented to init, which reaps it */
    scene_free(&s);
}

static void test_owner_killed(void) {
    check_owner_killed(false);
}

static void test_owner_killed_lifeline_held(void) {
    check_owner_killed(true);
}

/* PR_SET_PDEATHSIG fires when the thread that forked the keeper exits; the keeper must not
 * take that for the owner's death. */
static void *start_in_thread(void *arg) {
    hvd_proc_spec spec = {.command = arg}; /* no CHECK here: the counters are not atomic */
    return hvd_proc_start(&spec, NULL);
}

static void test_starting_thread_exits(void) {
    struct scene s;
    scene_init(&s);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "while [ ! -e '%s/go' ]; do sleep 0.02; done; exit 7", s.dir);
    pthread_t t;
    void *ret = NULL;
    CHECK(pthread_create(&t, NULL, start_in_thread, cmd) == 0);
    CHECK(pthread_join(t, &ret) == 0);
    hvd_proc *c = ret;
    CHECK(c != NULL);
    if (c) {
        /* If the keeper aborted, the command would end now with 143. */
        CHECK(!readable(hvd_proc_exit_fd(c), 300));
        make_file(s.dir, "go", "");
        int code = -1;
        CHECK(hvd_proc_wait(c, WAIT_MS, &code) == 0);
        CHECK_MSG(code == 7, "exit code %d", code);
        hvd_proc_free(c);
    }
    scene_free(&s);
}

/* A daemon that outlives the shell keeps the command running; the code is the shell's. */
static void check_daemon_outlives_shell(void) {
    struct scene s;
    scene_init(&s);
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd,
             "setsid sh -c 'while [ ! -e \"$HVD_TEST_DIR/release\" ]; do sleep 0.02; done;"
             " echo done > \"$HVD_TEST_DIR/daemon_done\"' </dev/null >/dev/null 2>&1 &\n"
             "echo started; exit 5");
    hvd_proc *c = start(cmd, s.envp, NULL, 0);
    if (c) {
        /* The pipes reach end-of-file when the shell exits (the daemon holds neither). */
        buf out = {0};
        int fds[2] = {hvd_proc_stdout_fd(c), hvd_proc_stderr_fd(c)};
        for (int i = 0; i < 2; i++) {
            int64_t deadline = test_now_ms() + WAIT_MS;
            for (;;) {
                char chunk[256];
                ssize_t n = read(fds[i], chunk, sizeof chunk);
                if (n > 0 && i == 0) buf_add(&out, chunk, (size_t)n);
                if (n == 0 || test_now_ms() > deadline) break;
                if (n < 0) readable(fds[i], 100);
            }
        }
        CHECK(buf_is(&out, S("started\n")));
        buf_free(&out);
        CHECK(!file_exists(s.dir, "daemon_done"));
        CHECK(!readable(hvd_proc_exit_fd(c), 200));
        CHECK(hvd_proc_reap(c, NULL) == 1); /* still running: the daemon lives */
        make_file(s.dir, "release", "");
        int code = -1;
        CHECK(hvd_proc_wait(c, WAIT_MS, &code) == 0);
        CHECK_MSG(code == 5, "exit code %d", code);
        CHECK(file_exists(s.dir, "daemon_done"));
        CHECK(count_marked(&s) == 0);
        hvd_proc_free(c);
    }
    scene_free(&s);
}

static void test_daemon_outlives_shell(void) {
    check_daemon_outlives_shell();
}

/* With end_with_program (a rank's program), the tree the program leaves is stopped as soon as
 * the program exits, as in an abort (SIGTERM and SIGCONT, SIGKILL after the grace period),
 * and the command ends then, with the program's code. */
static void check_end_with_program(void) {
    struct scene s;
    scene_init(&s);
    char script[sizeof tree_script + 512];
    size_t keep = strlen(tree_script) - strlen("wait\n"); /* the tree, without waiting for it */
    snprintf(script, sizeof script,
             "%.*sfor f in r1 r2 r3 r4 r5; do"
             " while [ ! -e \"$HVD_TEST_DIR/$f\" ]; do sleep 0.02; done; done\n"
             "stopped=$(cat \"$HVD_TEST_DIR/r5\")\n" /* until it has stopped itself */
             "while [ \"$(cut -d' ' -f3 /proc/$stopped/stat)\" != T ]; do sleep 0.02; done\n"
             "touch \"$HVD_TEST_DIR/exiting\"; exit 5\n",
             (int)keep, tree_script);
    make_file(s.dir, "tree.sh", script);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, ". '%s/tree.sh'", s.dir);
    const int grace_ms = 300;
    hvd_proc_spec spec = {
        .command = cmd, .envp = s.envp, .grace_ms = grace_ms, .end_with_program = true};
    hvd_err err = {0};
    hvd_proc *c = hvd_proc_start(&spec, &err);
    CHECK_MSG(c != NULL, "start: %s", err.msg);
    if (c) {
        static const char *const exiting[] = {"exiting", NULL};
        CHECK(wait_files(s.dir, exiting));
        int64_t t0 = test_now_ms(); /* at most one poll (10 ms) after the program's exit */
        int code = -1;
        CHECK(hvd_proc_wait(c, WAIT_MS, &code) == 0);
        int64_t elapsed = test_now_ms() - t0;
        CHECK_MSG(code == 5, "exit code %d", code);
        /* The processes that ignore SIGTERM need the SIGKILL at the grace period's end. */
        CHECK_MSG(elapsed >= grace_ms - 20, "ended %lld ms after the program, grace %d ms",
                  (long long)elapsed, grace_ms);
        check_tree_gone(&s);
        hvd_proc_free(c);
    }
    CHECK(wait_marked(&s, 0, false) == 0); /* clean up even if a check failed */
    scene_free(&s);
}

static void test_end_with_program(void) {
    check_end_with_program();
}

/* Output nobody reads blocks the command: the pipe is the only buffer. Reading it then
 * through the formatter uses no memory that grows with the output. */
static void test_slow_reader(void) {
    hvd_proc *c = start("head -c 8388608 /dev/zero; echo finished >&2", NULL, NULL, 0);
    if (!c) return;
    int out = hvd_proc_stdout_fd(c);
    sleep_ms(300);
    CHECK(hvd_proc_reap(c, NULL) == 1); /* blocked on the full pipe, not ended */
    int queued = -1, size = fcntl(out, F_GETPIPE_SZ);
    CHECK(ioctl(out, FIONREAD, &queued) == 0);
    CHECK_MSG(queued > 0 && queued <= size, "%d bytes queued, pipe holds %d", queued, size);

    long rss0 = test_rss_kib();
    hvd_output f;
    hvd_output_opts opts = {.index = 0, .stream = HVD_OUTPUT_STDOUT};
    hvd_output_init(&f, &opts);
    size_t raw = 0, formatted = 0;
    char in[65536], fmt[65536];
    int64_t deadline = test_now_ms() + WAIT_MS;
    for (;;) {
        ssize_t n = read(out, in, sizeof in);
        if (n == 0) break;
        if (n < 0) {
            if (errno != EAGAIN || test_now_ms() > deadline) break;
            readable(out, 100);
            continue;
        }
        raw += (size_t)n;
        for (size_t off = 0; off < (size_t)n;) {
            size_t used;
            formatted += hvd_output_format(&f, in + off, (size_t)n - off, fmt, sizeof fmt, &used);
            off += used;
        }
    }
    long rss1 = test_rss_kib();
    CHECK(raw == 8388608);
    CHECK(formatted == raw + strlen("[0]<stdout>:"));
    CHECK_MSG(rss1 - rss0 < 2048, "RSS grew by %ld KiB", rss1 - rss0);
    struct result r;
    drive(c, -1, &r);
    CHECK(buf_is(&r.err, S("finished\n")));
    CHECK(r.code == 0);
    result_free(&r);
    hvd_proc_free(c);
}

static void test_free_running(void) {
    struct scene s;
    scene_init(&s);
    hvd_proc *c = start("sleep 1000 & sleep 1000", s.envp, NULL, 0);
    if (c) {
        CHECK(wait_marked(&s, 2, true) >= 2);
        hvd_proc_free(c);
        CHECK(count_marked(&s) == 0);
    }
    scene_free(&s);
}

static void test_start_errors(void) {
    hvd_err err = {0};
    hvd_proc_spec none = {.command = NULL};
    CHECK(hvd_proc_start(&none, &err) == NULL);
    CHECK(err.code == HVD_E_INVALID);
    CHECK(hvd_proc_start(NULL, NULL) == NULL);

    hvd_proc_spec missing = {.command = "true", .cwd = "/nonexistent/hvd-dir"};
    memset(&err, 0, sizeof err);
    CHECK(hvd_proc_start(&missing, &err) == NULL);
    CHECK(err.code == HVD_E_INVALID);
    CHECK(strstr(err.msg, "/nonexistent/hvd-dir") != NULL);

    hvd_proc_spec file = {.command = "true", .cwd = "/etc/hostname"};
    memset(&err, 0, sizeof err);
    CHECK(hvd_proc_start(&file, &err) == NULL);
    CHECK(strstr(err.msg, "not a directory") != NULL);

    hvd_proc_spec negative = {.command = "true", .grace_ms = -1};
    CHECK(hvd_proc_start(&negative, &err) == NULL);
}

/* With SIGCHLD ignored the kernel reaps the keeper itself; the code still arrives. */
static void test_sigchld_ignored(void) {
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGCHLD, &ign, &old);
    hvd_proc *c = start("exit 6", NULL, NULL, 0);
    if (c) {
        int code = -1;
        CHECK(hvd_proc_wait(c, WAIT_MS, &code) == 0);
        CHECK_MSG(code == 6, "exit code %d", code);
        hvd_proc_free(c);
    }
    sigaction(SIGCHLD, &old, NULL);
}

/* Several threads start and drive commands at once (for TSan). */
struct thread_job {
    int id;
    int ok; /* commands that gave the expected output and code */
};

static void *thread_main(void *arg) {
    struct thread_job *job = arg;
    char value[32], want[64];
    snprintf(value, sizeof value, "thread-%d", job->id);
    hvd_env_change ch[] = {{"HVD_T", value}};
    char **envp = hvd_env_build(environ, ch, 1, NULL);
    for (int i = 0; i < 6; i++) {
        hvd_proc_spec spec = {.command = "echo \"$HVD_T\"; exit 2", .envp = envp};
        hvd_proc *c = hvd_proc_start(&spec, NULL);
        if (!c) continue;
        buf out = {0};
        int fd = hvd_proc_stdout_fd(c);
        for (int64_t deadline = test_now_ms() + WAIT_MS; test_now_ms() < deadline;) {
            char chunk[256];
            ssize_t n = read(fd, chunk, sizeof chunk);
            if (n > 0) buf_add(&out, chunk, (size_t)n);
            if (n == 0) break;
            if (n < 0) readable(fd, 100);
        }
        int code = -1;
        snprintf(want, sizeof want, "%s\n", value);
        if (hvd_proc_wait(c, WAIT_MS, &code) == 0 && code == 2 && buf_is(&out, want, strlen(want)))
            job->ok++;
        buf_free(&out);
        hvd_proc_free(c);
    }
    hvd_env_free(envp);
    return NULL;
}

static void test_concurrent_starts(void) {
    enum { N = 4 };
    pthread_t t[N];
    struct thread_job jobs[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = (struct thread_job){.id = i};
        CHECK(pthread_create(&t[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(jobs[i].ok == 6, "thread %d: %d of 6 commands right", i, jobs[i].ok);
    }
}

/* The same behaviour without pidfd_open and close_range (kernels before 5.4 / 5.9). */
static void test_fallbacks(void) {
    hvd_proc_force_fallbacks(1);
    test_exit_codes();
    test_exit_fd_readable_when_ended();
    test_no_descriptor_leak();
    check_abort_tree(500);
    check_daemon_outlives_shell();
    check_end_with_program();
    test_sigchld_ignored();
    hvd_proc_force_fallbacks(0);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED_BUILD 1
#endif
#endif
#ifndef SANITIZED_BUILD
#define SANITIZED_BUILD 0
#endif

/* The process's VmRSS in KiB, or -1. */
static long vmrss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

/* The keeper of a command started now, with HVD_KEEPER set to `keeper`: its program (the
 * target of /proc/PID/exe) and VmRSS. */
static void keeper_seen(const char *keeper, char *exe, size_t cap, long *rss_kib) {
    setenv("HVD_KEEPER", keeper, 1);
    exe[0] = '\0';
    *rss_kib = -1;
    hvd_proc *c = start("sleep 1000", NULL, NULL, 0);
    if (!c) return;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)hvd_proc_keeper_pid(c));
    /* The forked child is the keeper once it has reported the command's pid (start returned),
     * so what runs now is the keeper itself. */
    ssize_t n = readlink(path, exe, cap - 1);
    exe[n > 0 ? n : 0] = '\0';
    *rss_kib = vmrss_kib(hvd_proc_keeper_pid(c));
    hvd_proc_free(c);
}

/* A large owner (an executor's JVM) is not duplicated by its keeper: with the keeper program,
 * the keeper's VmRSS is its own few MiB; in place it carries a copy of the owner's touched heap,
 * which YARN's process-tree memory check (the sum of VmRSS) counts a second time. */
static void test_keeper_program(void) {
    /* A private anonymous mapping, not malloc: a sanitizer's allocator may keep large blocks
     * out of forks (ASan's did: the in-place keeper then carried 47 MB, not 256). */
    const size_t ballast_bytes = (size_t)256 << 20;
    char *ballast =
        mmap(NULL, ballast_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ballast == MAP_FAILED) return;
    memset(ballast, 1, ballast_bytes);
    char exe[PATH_MAX];
    long exec_rss, inplace_rss;
    keeper_seen(HVD_TEST_KEEPER, exe, sizeof exe, &exec_rss);
    CHECK_MSG(strstr(exe, "/hvd-keeper") != NULL, "the keeper runs %s", exe);
    keeper_seen("none", exe, sizeof exe, &inplace_rss);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    CHECK_MSG(strcmp(exe, self) == 0, "in place, the keeper runs %s", exe);
    fprintf(stderr, "     keeper VmRSS with a 256 MiB owner: %ld KiB exec'd, %ld KiB in place\n",
            exec_rss, inplace_rss);
    /* The sizes are the plain build's: a sanitizer's runtime and allocator change both. */
    if (!SANITIZED_BUILD) {
        CHECK_MSG(exec_rss > 0 && exec_rss < 32 * 1024, "exec'd keeper VmRSS %ld KiB", exec_rss);
        CHECK_MSG(inplace_rss > 256 * 1024, "in-place keeper VmRSS %ld KiB", inplace_rss);
    }
    munmap(ballast, ballast_bytes);
}

/* A keeper program that cannot start fails the start with an error that names it. */
static void test_keeper_program_missing(void) {
    setenv("HVD_KEEPER", "/nonexistent/hvd-keeper", 1);
    hvd_err err = {0};
    hvd_proc_spec spec = {.command = "true"};
    hvd_proc *c = hvd_proc_start(&spec, &err);
    CHECK(c == NULL);
    CHECK_MSG(strstr(err.msg, "/nonexistent/hvd-keeper") && strstr(err.msg, "HVD_KEEPER"), "%s",
              err.msg);
    hvd_proc_free(c);
}

static void run_all(void) {
    RUN(test_exit_codes);
    RUN(test_exit_fd_readable_when_ended);
    RUN(test_output_streams);
    RUN(test_binary_and_cr);
    RUN(test_long_line);
    RUN(test_env_cwd_stdin);
    RUN(test_no_descriptor_leak);
    RUN(test_session_and_group);
    RUN(test_start_errors);
    RUN(test_abort_tree);
    RUN(test_abort_within);
    RUN(test_kill_tree);
    RUN(test_owner_killed);
    RUN(test_owner_killed_lifeline_held);
    RUN(test_keeper_killed);
    RUN(test_daemon_outlives_shell);
    RUN(test_end_with_program);
    RUN(test_slow_reader);
    RUN(test_free_running);
    RUN(test_sigchld_ignored);
    RUN(test_starting_thread_exits);
    RUN(test_concurrent_starts);
    RUN(test_fallbacks);
}

int main(void) {
    /* The tests send signals to their own children only; make a stray SIGPIPE visible. */
    signal(SIGPIPE, SIG_DFL);
    fprintf(stderr, "-- keeper program %s\n", HVD_TEST_KEEPER);
    setenv("HVD_KEEPER", HVD_TEST_KEEPER, 1);
    run_all();
    fprintf(stderr, "-- keeper in place (HVD_KEEPER=none)\n");
    setenv("HVD_KEEPER", "none", 1);
    run_all();
    RUN(test_keeper_program);
    RUN(test_keeper_program_missing);
    return test_finish();
}
