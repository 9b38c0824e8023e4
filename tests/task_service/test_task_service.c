/* Tests of libhvd_task and the hvd-task daemon against the real driver library (in this
 * process) with real hvd-task processes: registration of 16 tasks on 8 host hashes and
 * their probing, first tasks and siblings with their exit codes (signals included), the
 * command's environment, output streaming (1 MiB lines, binary bytes, CR; with and without
 * prefixes; two subscribers), one command per lifetime, abort of process trees that ignore
 * SIGTERM, SIGKILL of hvd-task, back-pressure from a subscriber that stops reading (memory
 * stays bounded, the command blocks), WAIT_EXIT at the end and within the minimum lifetime,
 * the driver's shutdown, start-up timeouts, the command line, the library in-process, and
 * elastic task services (commands one after another, STOP_COMMAND, commits).
 *
 * argv[1] is the hvd-task binary. Processes of a command are found by a marker variable in
 * their environment (HVD_TEST_MARK). Each hvd-task writes its stderr (and stdout, unless
 * the test discards it) to a log file that is checked for messages and for sanitizer
 * reports. Waits are bounded; timing assertions are only coarse bounds. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "hvd/driver.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"
#include "hvd/task.h"

extern char **environ;

#define WAIT_MS 30000 /* generous bound for what should take a moment */

static const char *g_bin;
static hvd_secret g_secret;
static char g_secret_b64[45];
static char g_dir[64];

/* ---- Small helpers --------------------------------------------------------------------------- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

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

static bool buf_eq(const buf *a, const buf *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

/* Horovod's line format, written independently of task_service/output.c: the prefix before
 * the first byte of every line; '\n' and '\r' end lines. */
static void expect_prefixed(buf *out, const char *data, size_t n, const char *prefix) {
    bool at_start = true;
    size_t i = 0;
    while (i < n) {
        if (at_start) buf_add(out, prefix, strlen(prefix));
        size_t j = i;
        while (j < n && data[j] != '\n' && data[j] != '\r')
            j++;
        if (j < n) j++; /* the terminator belongs to the line */
        buf_add(out, data + i, j - i);
        at_start = data[j - 1] == '\n' || data[j - 1] == '\r';
        i = j;
    }
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

/* A marker unique to this run and call: "HVD_TEST_MARK=<value>". */
static void make_mark(char *out, size_t len) {
    static int counter;
    snprintf(out, len, "HVD_TEST_MARK=tsvc-%d-%d", (int)getpid(), ++counter);
}

/* How many live processes have `mark` ("NAME=VALUE") in their environment. */
static int count_marked(const char *mark) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int n = 0;
    size_t ml = strlen(mark) + 1; /* with the NUL that ends the entry */
    struct dirent *e;
    static char env[1 << 16];
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, env, sizeof env);
        close(fd);
        for (ssize_t i = 0; len > 0 && i + (ssize_t)ml <= len;) {
            if (memcmp(env + i, mark, ml) == 0) {
                n++;
                break;
            }
            const char *z = memchr(env + i, '\0', (size_t)(len - i));
            if (!z) break;
            i = z - env + 1;
        }
    }
    closedir(d);
    return n;
}

static bool wait_marked(const char *mark, int at_least, int timeout_ms) {
    int64_t deadline = test_now_ms() + timeout_ms;
    while (test_now_ms() < deadline) {
        int n = count_marked(mark);
        if (at_least == 0 ? n == 0 : n >= at_least) return true;
        sleep_ms(20);
    }
    return false;
}

static long rss_kib_of(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1) break;
    fclose(f);
    return v;
}

/* ---- hvd-task processes ---------------------------------------------------------------------- */

typedef struct tproc {
    int out_fd; /* > 0 before spawn: the task's stdout (else its log) */
    pid_t pid;
    uint32_t index;
    char log[128];
    int status; /* exit code (128+N for signal N) once reaped, else -1 */
} tproc;

/* Starts hvd-task --driver DRV --index I EXTRA... with HVD_HOST_HASH=host; stderr (and
 * stdout unless discard_stdout) to a log file. env_add: one more "NAME=VALUE" (replacing
 * that variable), or NULL. */
static void spawn(tproc *p, uint32_t index, const char *host, const char *drv,
                  const char *const *extra, bool discard_stdout, const char *env_add) {
    static int counter;
    p->index = index;
    p->status = -1;
    snprintf(p->log, sizeof p->log, "%s/task-%u-%d.log", g_dir, index, ++counter);
    const char *argv[32];
    char idx[16];
    snprintf(idx, sizeof idx, "%u", index);
    size_t n = 0;
    argv[n++] = g_bin;
    argv[n++] = "--driver";
    argv[n++] = drv;
    argv[n++] = "--index";
    argv[n++] = idx;
    for (size_t i = 0; extra && extra[i] && n < 30; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 3, sizeof *envp);
    size_t k = 0;
    size_t add_name = env_add ? strcspn(env_add, "=") + 1 : 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "HVD_HOST_HASH=", 14) != 0 &&
            (!env_add || strncmp(environ[i], env_add, add_name) != 0))
            envp[k++] = environ[i];
    char hh[160];
    snprintf(hh, sizeof hh, "HVD_HOST_HASH=%s", host);
    envp[k++] = hh;
    if (env_add) envp[k++] = (char *)env_add;
    envp[k] = NULL;
    int log = open(p->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    p->pid = fork();
    if (p->pid == 0) {
        dup2(log, 2);
        dup2(p->out_fd > 0 ? p->out_fd : discard_stdout ? null : log, 1);
        execve(g_bin, (char *const *)argv, envp);
        _exit(127);
    }
    close(log);
    close(null);
    free(envp);
    CHECK(p->pid > 0);
}

/* Waits up to timeout_ms for p to exit; returns its status (also in p->status), or -1. */
static int reap(tproc *p, int timeout_ms) {
    if (p->status >= 0) return p->status;
    int64_t deadline = test_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return p->status;
        }
        if (r < 0 || test_now_ms() >= deadline) return -1;
        sleep_ms(10);
    }
}

static bool running(tproc *p) {
    return p->status < 0 && waitpid(p->pid, NULL, WNOHANG) == 0;
}

static void kill_and_reap(tproc *p) {
    if (p->status >= 0) return;
    kill(p->pid, SIGKILL);
    reap(p, WAIT_MS);
}

static char *read_log(const tproc *p) {
    FILE *f = fopen(p->log, "r");
    if (!f) return strdup("");
    buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        buf_add(&b, chunk, n);
    fclose(f);
    return b.data ? b.data : strdup("");
}

static bool log_has(const tproc *p, const char *text) {
    char *s = read_log(p);
    bool found = strstr(s, text) != NULL;
    free(s);
    return found;
}

/* No sanitizer report in the log; prints the log when there is one. */
static void check_log_clean(const tproc *p) {
    char *s = read_log(p);
    bool clean = !strstr(s, "Sanitizer") && !strstr(s, "runtime error:");
    CHECK_MSG(clean, "sanitizer report in %s:\n%s", p->log, s);
    free(s);
}

static void dump_log_if(bool cond, const tproc *p) {
    if (!cond) return;
    char *s = read_log(p);
    fprintf(stderr, "---- %s ----\n%s---- end ----\n", p->log, s);
    free(s);
}

/* ---- The driver ------------------------------------------------------------------------------ */

typedef struct drv {
    hvd_driver *d;
    hvd_addr *addrs;
    size_t naddrs;
    char *text;
} drv;

static bool drv_up(drv *x, uint32_t n) {
    memset(x, 0, sizeof *x);
    char *argv0[] = {"true", NULL};
    hvd_code_msg code = {.kind = HVD_CODE_ARGV, .argv = {argv0, 1}};
    hvd_driver_config dc = {.num_tasks = n, .secret = g_secret, .code = &code};
    hvd_err err;
    x->d = hvd_driver_start(&dc, &err);
    CHECK_MSG(x->d != NULL, "%s", err.msg);
    if (!x->d) return false;
    CHECK(hvd_driver_addrs(x->d, &x->addrs, &x->naddrs, &err) == 0);
    x->text = hvd_addrs_format(x->addrs, x->naddrs);
    return x->text != NULL;
}

static void drv_down(drv *x) {
    hvd_driver_stop(x->d);
    free(x->addrs);
    free(x->text);
    memset(x, 0, sizeof *x);
}

/* Waits for every registration and has the tasks probe each other. */
static bool drv_ready(drv *x) {
    hvd_err err;
    int rc = hvd_driver_wait_registration(x->d, WAIT_MS, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc != 0) return false;
    char **ifaces = NULL;
    rc = hvd_driver_common_interfaces(x->d, WAIT_MS, &ifaces, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    for (size_t i = 0; ifaces && ifaces[i]; i++)
        free(ifaces[i]);
    free(ifaces);
    return rc == 0;
}

static hvd_client *drv_client(drv *x) {
    hvd_client_config cc = {
        .service = HVD_DRIVER_SERVICE, .secret = g_secret, .addrs = x->addrs, .naddrs = x->naddrs};
    hvd_err err;
    hvd_client *c = hvd_client_connect(&cc, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    return c;
}

static hvd_client *task_client(drv *x, uint32_t index) {
    hvd_client *d = drv_client(x);
    if (!d) return NULL;
    hvd_err err;
    hvd_client *c = hvd_task_connect(d, &g_secret, index, &err);
    CHECK_MSG(c != NULL, "task %u: %s", index, err.msg);
    hvd_client_close(d);
    return c;
}

/* RUN_COMMAND without attaching. Returns 0, or -1 with err. */
static int run_detached(hvd_client *c, const char *command, const char *mark, const char *unset,
                        hvd_err *err) {
    char *set[] = {(char *)mark, NULL};
    char *uns[] = {(char *)unset, NULL};
    hvd_run_msg run = {.command = (char *)command,
                       .env_set = {set, mark ? 1 : 0},
                       .env_unset = {uns, unset ? 1 : 0}};
    return hvd_client_call(c, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, err);
}

/* ---- Subscribers ----------------------------------------------------------------------------- */

typedef struct sink {
    buf out, err;
    atomic_size_t bytes; /* received so far, both channels */
} sink;

static int sink_chunk(uint32_t channel, const uint8_t *data, size_t len, void *user) {
    sink *s = user;
    buf_add(channel == HVD_CHANNEL_STDERR ? &s->err : &s->out, data, len);
    atomic_fetch_add(&s->bytes, len);
    return 0;
}

/* A subscriber on its own thread: RUN_COMMAND (attach) if run is set, else ATTACH. */
typedef struct sub_thread {
    pthread_t th;
    drv *x;
    uint32_t index;
    hvd_run_msg *run;      /* NULL: ATTACH */
    hvd_chunk_fn on_chunk; /* NULL: sink_chunk */
    void *user;            /* NULL: &sink */
    sink sink;
    atomic_bool connected;
    int rc;
    int exit_code;
    hvd_err err;
} sub_thread;

static void *sub_main(void *arg) {
    sub_thread *s = arg;
    hvd_client *c = task_client(s->x, s->index);
    atomic_store(&s->connected, true);
    if (!c) {
        s->rc = -1;
        return NULL;
    }
    hvd_exit_msg ex = {0};
    const hvd_msg_desc *desc = s->run ? &hvd_run_desc : &hvd_attach_desc;
    s->rc = hvd_client_call_stream(c, desc, s->run, s->on_chunk ? s->on_chunk : sink_chunk,
                                   s->user ? s->user : &s->sink, -1, NULL, &hvd_exit_desc, &ex, -1,
                                   &s->err);
    s->exit_code = ex.exit_code;
    hvd_client_close(c);
    return NULL;
}

static void sub_start(sub_thread *s, drv *x, uint32_t index, hvd_run_msg *run) {
    s->x = x;
    s->index = index;
    s->run = run;
    atomic_init(&s->connected, false);
    atomic_init(&s->sink.bytes, 0);
    CHECK(pthread_create(&s->th, NULL, sub_main, s) == 0);
    while (!atomic_load(&s->connected))
        sleep_ms(5);
}

static void sub_join(sub_thread *s) {
    pthread_join(s->th, NULL);
}

static void sub_free(sub_thread *s) {
    buf_free(&s->sink.out);
    buf_free(&s->sink.err);
}

/* ---- 16 tasks on 8 hosts --------------------------------------------------------------------- */

static void test_cluster(void) {
    enum { N = 16, HOSTS = 8 };
    drv x;
    if (!drv_up(&x, N)) return;
    tproc p[N] = {0};
    char hosts[HOSTS][16];
    for (int h = 0; h < HOSTS; h++)
        snprintf(hosts[h], sizeof hosts[h], "host%c", 'A' + h);
    for (uint32_t i = 0; i < N; i++) {
        const char *base[] = {
            "--min-lifetime",         "1",   "--grace", "1", "--start-timeout", "60",
            i == 8 ? "--gpus" : NULL, "0,1", NULL};
        /* Index i is on host i % 8: host h has tasks h (the first) and h + 8. */
        spawn(&p[i], i, hosts[i % HOSTS], x.text, base, false, "HVD_TEST_UNSET_ME=1");
    }
    bool ready = drv_ready(&x);
    for (uint32_t i = 0; i < N && !ready; i++)
        dump_log_if(i < 2, &p[i]);
    hvd_err err;
    char *hl = hvd_driver_host_list(x.d, &err);
    CHECK_MSG(hl && strcmp(hl, "hostA:2,hostB:2,hostC:2,hostD:2,hostE:2,hostF:2,hostG:2,hostH:2") ==
                        0,
              "%s", hl ? hl : err.msg);
    free(hl);

    /* Every host's first task is its lowest index. */
    hvd_client *dc = drv_client(&x);
    for (int h = 0; dc && h < HOSTS; h++) {
        hvd_host_msg hq = {.host_hash = hosts[h]};
        hvd_indices_msg hi;
        CHECK(hvd_client_call(dc, &hvd_host_indices_desc, &hq, &hvd_indices_desc, &hi, 0, 0,
                              &err) == 0);
        CHECK(hi.indices.n == 2 && hi.indices.v[0] == (uint32_t)h &&
              hi.indices.v[1] == (uint32_t)h + 8);
        hvd_msg_free(&hvd_indices_desc, &hi);
    }
    hvd_client_close(dc);

    /* A sibling's resources, and results kept (and replaced) by a sibling; before the
     * commands, since a sibling ends with its host's command. */
    hvd_client *t8 = task_client(&x, 8);
    if (t8) {
        hvd_task_info info;
        CHECK(hvd_client_call(t8, &hvd_resources_desc, NULL, &hvd_task_info_desc, &info, 0, 0,
                              &err) == 0);
        CHECK(info.index == 8 && info.host_hash && strcmp(info.host_hash, "hostA") == 0);
        CHECK(info.gpus.n == 2 && strcmp(info.gpus.v[0], "0") == 0 &&
              strcmp(info.gpus.v[1], "1") == 0);
        CHECK(info.addrs.n > 0 && info.work_dir && info.work_dir[0] == '/');
        hvd_msg_free(&hvd_task_info_desc, &info);
        hvd_result_msg r;
        CHECK(hvd_client_call(t8, &hvd_get_result_desc, NULL, &hvd_result_desc, &r, 0, 0, &err) ==
              0);
        CHECK(!r.present && r.index == 8);
        hvd_msg_free(&hvd_result_desc, &r);
        for (int round = 0; round < 2; round++) {
            uint8_t bytes[3] = {'a', 0, (uint8_t)('x' + round)};
            hvd_result_msg put = {.rank = 5,
                                  .index = 8,
                                  .present = true,
                                  .status = round,
                                  .result = {bytes, sizeof bytes}};
            CHECK(hvd_client_call(t8, &hvd_register_result_desc, &put, &hvd_ack_desc, NULL, 0, 0,
                                  &err) == 0);
        }
        CHECK(hvd_client_call(t8, &hvd_get_result_desc, NULL, &hvd_result_desc, &r, 0, 0, &err) ==
              0);
        CHECK(r.present && r.rank == 5 && r.status == 1 && r.result.len == 3 &&
              r.result.data[2] == 'y');
        hvd_msg_free(&hvd_result_desc, &r);
        hvd_result_msg wrong = {.rank = 1, .index = 3, .present = true};
        CHECK(hvd_client_call(t8, &hvd_register_result_desc, &wrong, &hvd_ack_desc, NULL, 0, 0,
                              &err) == -1 &&
              err.code == HVD_E_INVALID);
        hvd_client_close(t8);
    }

    /* One command per host. */
    char envcheck[512];
    snprintf(envcheck, sizeof envcheck,
             "[ \"$HVD_SECRET\" = '%s' ] && [ \"$HOROVOD_HOSTNAME\" = hostC ] && "
             "[ \"$HVD_TASK_INDEX\" = 2 ] && [ \"$(pwd)\" = \"$HOROVOD_SPARK_WORK_DIR\" ] && "
             "[ -n \"$HVD_DRIVER_ADDRS\" ] && [ -z \"${HVD_TEST_UNSET_ME+x}\" ] && "
             "[ \"$MARK_ME\" = yes ] && exit 0; exit 9",
             g_secret_b64);
    char mark6[128], mark7[128];
    make_mark(mark6, sizeof mark6);
    make_mark(mark7, sizeof mark7);
    const char *cmds[HOSTS] = {"exit 3",
                               "kill -TERM $$",
                               envcheck,
                               "exit 42",
                               "sleep 0.2; exit 7",
                               "kill -KILL $$",
                               "trap '' TERM; sleep 1000 & sleep 1000 & wait",
                               "sleep 1000 & wait"};
    const int want[HOSTS] = {3, 143, 0, 42, 7, 137, -1, -1};
    for (uint32_t h = 0; h < HOSTS; h++) {
        hvd_client *tc = task_client(&x, h);
        if (!tc) continue;
        const char *mark = h == 2 ? "MARK_ME=yes" : h == 6 ? mark6 : h == 7 ? mark7 : NULL;
        int rc = run_detached(tc, cmds[h], mark, h == 2 ? "HVD_TEST_UNSET_ME" : NULL, &err);
        CHECK_MSG(rc == 0, "host %u: %s", h, err.msg);
        if (h == 0) {
            /* One command per lifetime. */
            rc = run_detached(tc, "exit 1", NULL, NULL, &err);
            CHECK(rc == -1 && err.code == HVD_E_STATE);
            CHECK_MSG(strstr(err.msg, "task 0 already ran a command"), "%s", err.msg);
        }
        hvd_client_close(tc);
    }

    /* Hosts 0-5: the first task and its sibling end with the command's status. */
    for (int h = 0; h < 6; h++) {
        for (int k = 0; k < 2; k++) {
            tproc *q = &p[h + 8 * k];
            int st = reap(q, WAIT_MS);
            CHECK_MSG(st == want[h], "task %u (host %c) exited %d, want %d", q->index, 'A' + h, st,
                      want[h]);
            dump_log_if(st != want[h], q);
        }
    }
    CHECK(log_has(&p[12], "task 12 runs nothing: task 4 runs the command of host hostE"));

    /* Host 6: SIGTERM to its first task aborts the command; the sibling follows. */
    CHECK(wait_marked(mark6, 3, WAIT_MS));
    CHECK(wait_marked(mark7, 2, WAIT_MS));
    CHECK(running(&p[6]) && running(&p[14]) && running(&p[7]) && running(&p[15]));
    kill(p[6].pid, SIGTERM);
    /* The task reports the signal; the command (SIGKILLed after ignoring SIGTERM) 137, which
     * is what the sibling gets. */
    CHECK(reap(&p[6], WAIT_MS) == 143);
    CHECK(reap(&p[14], WAIT_MS) == 137);
    CHECK(count_marked(mark6) == 0);

    /* Host 7: the driver shuts the job down. */
    CHECK(running(&p[7]) && running(&p[15]) && count_marked(mark7) == 2);
    hvd_driver_shutdown_tasks(x.d);
    CHECK(reap(&p[7], WAIT_MS) == 1);
    CHECK(reap(&p[15], WAIT_MS) == 1);
    CHECK(log_has(&p[7], "the driver shut the job down"));
    CHECK(log_has(&p[15], "the driver shut the job down"));
    CHECK(count_marked(mark7) == 0);

    for (int i = 0; i < N; i++) {
        kill_and_reap(&p[i]);
        check_log_clean(&p[i]);
    }
    drv_down(&x);
}

/* ---- Output ---------------------------------------------------------------------------------- */

/* Bytes the output tests print: a 1 MiB line, every byte value, CR line ends, a partial last
 * line; and some stderr. */
static void output_fixture(buf *out, buf *err) {
    char *line = malloc(1 << 20);
    memset(line, 'x', 1 << 20);
    buf_add(out, line, 1 << 20);
    free(line);
    buf_add(out, "\n", 1);
    for (int i = 0; i < 256; i++) {
        char c = (char)i;
        buf_add(out, &c, 1);
    }
    const char *tail = "after\rcarriage\r\n\nlast line without end";
    const char *warn = "warning one\nwarning\rtwo\n";
    buf_add(out, tail, strlen(tail));
    buf_add(err, warn, strlen(warn));
}

/* One task; the command prints the fixture. With prefixes: two subscribers (an ATTACH held
 * before the command, and RUN_COMMAND's own). */
static void run_output_case(bool prefix) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--min-lifetime", "0.3", NULL};
    spawn(&p, 0, prefix ? "outP" : "outR", x.text, extra, false, NULL);
    if (!drv_ready(&x)) {
        dump_log_if(true, &p);
        kill_and_reap(&p);
        drv_down(&x);
        return;
    }
    buf out = {0}, err = {0};
    output_fixture(&out, &err);
    char fout[160], ferr[160], cmd[512];
    snprintf(fout, sizeof fout, "%s/out-%d.bin", g_dir, prefix);
    snprintf(ferr, sizeof ferr, "%s/err-%d.bin", g_dir, prefix);
    write_file(fout, out.data, out.len);
    write_file(ferr, err.data, err.len);
    /* The pause lets the ATTACH arrive first; it is held until the command starts anyway. */
    snprintf(cmd, sizeof cmd, "sleep 0.3; cat '%s'; cat '%s' >&2", fout, ferr);

    sub_thread a = {0}, b = {0};
    if (prefix) sub_start(&a, &x, 0, NULL);
    sleep_ms(200);
    hvd_run_msg run = {.command = cmd, .prefix_output = prefix, .attach = true};
    sub_start(&b, &x, 0, &run);
    sub_join(&b);
    CHECK_MSG(b.rc == 0 && b.exit_code == 0, "%s", b.err.msg);
    buf want_out = {0}, want_err = {0};
    if (prefix) {
        expect_prefixed(&want_out, out.data, out.len, "[0]<stdout>:");
        expect_prefixed(&want_err, err.data, err.len, "[0]<stderr>:");
    } else {
        buf_add(&want_out, out.data, out.len);
        buf_add(&want_err, err.data, err.len);
    }
    CHECK_MSG(buf_eq(&b.sink.out, &want_out), "stdout: got %zu bytes, want %zu", b.sink.out.len,
              want_out.len);
    CHECK_MSG(buf_eq(&b.sink.err, &want_err), "stderr: got %zu bytes, want %zu: %s", b.sink.err.len,
              want_err.len, b.sink.err.data ? b.sink.err.data : "");
    if (prefix) {
        sub_join(&a);
        CHECK_MSG(a.rc == 0 && a.exit_code == 0, "%s", a.err.msg);
        CHECK(buf_eq(&a.sink.out, &b.sink.out));
        CHECK(buf_eq(&a.sink.err, &b.sink.err));
    }

    /* After the end: status, an immediate WAIT_EXIT, ATTACH answered at once, no 2nd run. */
    hvd_client *c = task_client(&x, 0);
    if (c) {
        hvd_err e;
        hvd_status_msg st;
        CHECK(hvd_client_call(c, &hvd_command_status_desc, NULL, &hvd_status_desc, &st, 0, 0, &e) ==
              0);
        CHECK(st.started && st.ended && st.exit_code == 0);
        hvd_exit_msg ex;
        CHECK(hvd_client_call(c, &hvd_wait_exit_desc, NULL, &hvd_exit_desc, &ex, 0, 0, &e) == 0 &&
              ex.exit_code == 0);
        CHECK(hvd_client_call_stream(c, &hvd_attach_desc, NULL, NULL, NULL, -1, NULL,
                                     &hvd_exit_desc, &ex, 0, &e) == 0 &&
              ex.exit_code == 0);
        CHECK(run_detached(c, "true", NULL, NULL, &e) == -1 && e.code == HVD_E_STATE);
        hvd_client_close(c);
    }
    CHECK(reap(&p, WAIT_MS) == 0);
    check_log_clean(&p);
    buf_free(&out);
    buf_free(&err);
    buf_free(&want_out);
    buf_free(&want_err);
    sub_free(&a);
    sub_free(&b);
    drv_down(&x);
}

static void test_output_prefixed_two_subscribers(void) {
    run_output_case(true);
}

static void test_output_raw(void) {
    run_output_case(false);
}

/* Timestamps: asctime() text glued to the prefix. */
static void test_output_timestamps(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--min-lifetime", "0.1", NULL};
    spawn(&p, 0, "outT", x.text, extra, false, NULL);
    if (drv_ready(&x)) {
        hvd_run_msg run = {.command = "echo hi; echo there",
                           .prefix_output = true,
                           .timestamps = true,
                           .attach = true};
        sub_thread b = {0};
        sub_start(&b, &x, 0, &run);
        sub_join(&b);
        CHECK(b.rc == 0 && b.exit_code == 0);
        /* "Mon Jan 20 12:00:01 2020[0]<stdout>:hi\n" */
        const char *s = b.sink.out.data ? b.sink.out.data : "";
        char wd[4], mon[4];
        int day, hh, mm, ss, year, used = 0;
        CHECK_MSG(sscanf(s, "%3s %3s %d %d:%d:%d %d%n", wd, mon, &day, &hh, &mm, &ss, &year,
                         &used) == 7 &&
                      strncmp(s + used, "[0]<stdout>:hi\n", 15) == 0,
                  "%s", s);
        const char *second = strchr(s, '\n');
        CHECK(second && strstr(second + 1, "[0]<stdout>:there\n"));
        sub_free(&b);
    }
    CHECK(reap(&p, WAIT_MS) == 0);
    check_log_clean(&p);
    drv_down(&x);
}

/* ---- Abort, SIGKILL -------------------------------------------------------------------------- */

/* ABORT of a command whose grandchildren ignore SIGTERM: all gone, after the grace period. */
static void test_abort_tree(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--grace", "1", "--min-lifetime", "0.1", NULL};
    spawn(&p, 0, "abort", x.text, extra, false, NULL);
    if (drv_ready(&x)) {
        char mark[128];
        make_mark(mark, sizeof mark);
        char *set[] = {mark, NULL};
        hvd_run_msg run = {.command = "sh -c 'trap \"\" TERM; sleep 1000' & "
                                      "sh -c 'trap \"\" TERM; sleep 1000 & wait' & wait",
                           .env_set = {set, 1},
                           .attach = true};
        sub_thread s = {0};
        sub_start(&s, &x, 0, &run);
        CHECK(wait_marked(mark, 4, WAIT_MS));
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        int64_t t0 = test_now_ms();
        CHECK(c && hvd_client_call(c, &hvd_abort_desc, NULL, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
        sub_join(&s);
        int64_t took = test_now_ms() - t0;
        CHECK_MSG(s.rc == 0 && s.exit_code == 143, "rc %d exit %d: %s", s.rc, s.exit_code,
                  s.err.msg);
        CHECK_MSG(took >= 900 && took < 10000, "abort took %lld ms", (long long)took);
        CHECK(count_marked(mark) == 0); /* the end is reported only once all are gone */
        hvd_client_close(c);
        sub_free(&s);
    }
    CHECK(reap(&p, WAIT_MS) == 143);
    check_log_clean(&p);
    drv_down(&x);
}

/* kill -9 of hvd-task: its lifeline takes the command down. */
static void test_sigkill_task(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--grace", "1", NULL};
    spawn(&p, 0, "killed", x.text, extra, false, NULL);
    if (drv_ready(&x)) {
        char mark[128];
        make_mark(mark, sizeof mark);
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        CHECK(c && run_detached(c, "trap '' TERM; sleep 1000 & sleep 1000 & wait", mark, NULL,
                                &err) == 0);
        hvd_client_close(c);
        CHECK(wait_marked(mark, 3, WAIT_MS));
        kill(p.pid, SIGKILL);
        CHECK(reap(&p, WAIT_MS) == 137);
        CHECK_MSG(wait_marked(mark, 0, WAIT_MS), "%d processes of the command survived",
                  count_marked(mark));
    }
    kill_and_reap(&p);
    drv_down(&x);
}

/* ---- Back-pressure --------------------------------------------------------------------------- */

typedef struct stall {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool got_first, release;
    size_t bytes;
} stall;

/* Takes one chunk, then stops reading until released, then abandons the call. */
static int stall_chunk(uint32_t channel, const uint8_t *data, size_t len, void *user) {
    (void)channel;
    (void)data;
    stall *s = user;
    pthread_mutex_lock(&s->mu);
    s->bytes += len;
    s->got_first = true;
    pthread_cond_broadcast(&s->cv);
    while (!s->release)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return 1;
}

static void test_slow_subscriber(void) {
    enum { TOTAL = 64 << 20 };
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--min-lifetime", "0.1", NULL};
    /* In sanitizer builds, freed memory waits in ASan's quarantine (256 MiB by default) and
     * would count as the task's: keep it small so that the bound below measures buffering. */
    char asan[512];
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%squarantine_size_mb=1", old ? old : "",
             old && *old ? ":" : "");
    spawn(&p, 0, "slow", x.text, extra, true, asan);
    if (drv_ready(&x)) {
        long rss0 = rss_kib_of(p.pid);
        /* A fast subscriber first, then the command with a subscriber that stalls. */
        sub_thread fast = {0}, slow = {0};
        sub_start(&fast, &x, 0, NULL);
        sleep_ms(200);
        stall st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        char cmd[64];
        snprintf(cmd, sizeof cmd, "head -c %d /dev/zero", TOTAL);
        hvd_run_msg run = {.command = cmd, .attach = true};
        slow.on_chunk = stall_chunk;
        slow.user = &st;
        sub_start(&slow, &x, 0, &run);
        pthread_mutex_lock(&st.mu);
        while (!st.got_first)
            pthread_cond_wait(&st.cv, &st.mu);
        pthread_mutex_unlock(&st.mu);

        sleep_ms(1500);
        long rss1 = rss_kib_of(p.pid);
        size_t fast1 = atomic_load(&fast.sink.bytes);
        sleep_ms(1500);
        long rss2 = rss_kib_of(p.pid);
        size_t fast2 = atomic_load(&fast.sink.bytes);
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        hvd_status_msg status = {0};
        CHECK(c && hvd_client_call(c, &hvd_command_status_desc, NULL, &hvd_status_desc, &status, 0,
                                   0, &err) == 0);
        /* Without back-pressure `head` would be done in well under a second. */
        CHECK_MSG(status.started && !status.ended, "the command was not held back");
        CHECK_MSG(fast2 == fast1 && fast2 < TOTAL / 2,
                  "the fast subscriber got %zu then %zu bytes while the slow one stalled", fast1,
                  fast2);
        fprintf(stderr, "  task RSS: %ld KiB idle, %ld then %ld KiB with a stalled subscriber\n",
                rss0, rss1, rss2);
        CHECK_MSG(rss2 - rss1 < 1024, "RSS grew from %ld to %ld KiB while stalled", rss1, rss2);
        CHECK_MSG(rss2 - rss0 < 16 * 1024, "RSS grew from %ld to %ld KiB", rss0, rss2);

        /* The stalled one goes away: the rest flows to the fast one, nothing lost. */
        pthread_mutex_lock(&st.mu);
        st.release = true;
        pthread_cond_broadcast(&st.cv);
        pthread_mutex_unlock(&st.mu);
        sub_join(&slow);
        CHECK(slow.rc == -1);
        sub_join(&fast);
        CHECK_MSG(fast.rc == 0 && fast.exit_code == 0, "%s", fast.err.msg);
        CHECK_MSG(fast.sink.out.len == TOTAL, "fast subscriber got %zu of %d bytes",
                  fast.sink.out.len, TOTAL);
        hvd_client_close(c);
        sub_free(&fast);
        sub_free(&slow);
    }
    CHECK(reap(&p, WAIT_MS) == 0);
    check_log_clean(&p);
    drv_down(&x);
}

/* ---- Exit codes on time ---------------------------------------------------------------------- */

static void test_wait_exit(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--min-lifetime", "2", NULL};
    spawn(&p, 0, "waitx", x.text, extra, false, NULL);
    if (drv_ready(&x)) {
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        hvd_exit_msg ex = {0};
        int64_t t0 = test_now_ms();
        /* Nobody attached: the output goes to the task's own stdout/stderr (its log). */
        hvd_run_msg run = {.command = "echo out-line; echo err-line >&2; sleep 0.3; exit 5",
                           .prefix_output = true};
        CHECK(c && hvd_client_call(c, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
        CHECK(c &&
              hvd_client_call(c, &hvd_wait_exit_desc, NULL, &hvd_exit_desc, &ex, -1, 0, &err) == 0);
        int64_t t_end = test_now_ms();
        CHECK(ex.exit_code == 5);
        CHECK_MSG(t_end - t0 >= 280 && t_end - t0 < 1500, "WAIT_EXIT answered after %lld ms",
                  (long long)(t_end - t0));
        hvd_client_close(c);
        /* A new connection within the minimum lifetime is answered at once. */
        sleep_ms(800);
        c = task_client(&x, 0);
        int64_t t1 = test_now_ms();
        CHECK(c &&
              hvd_client_call(c, &hvd_wait_exit_desc, NULL, &hvd_exit_desc, &ex, -1, 0, &err) ==
                  0 &&
              ex.exit_code == 5);
        CHECK(test_now_ms() - t1 < 500);
        hvd_client_close(c);
        CHECK(reap(&p, WAIT_MS) == 5);
        CHECK_MSG(test_now_ms() - t_end >= 1800, "the service ended %lld ms after the command",
                  (long long)(test_now_ms() - t_end));
        CHECK(log_has(&p, "[0]<stdout>:out-line\n") && log_has(&p, "[0]<stderr>:err-line\n"));
    }
    kill_and_reap(&p);
    check_log_clean(&p);
    drv_down(&x);
}

/* An ATTACH subscriber that stops reading while the agent that ran the command reads on: it is
 * dropped after TASK_SUB_STALL_MS (2 s), and the output goes on to the agent. Before, the
 * command waited for the server's write timeout, 120 s here, to drop the stalled one. */
static void test_stalled_watcher(void) {
    enum { TOTAL = 16 << 20, DEADLINE_MS = 20000 };
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--min-lifetime", "0.1", "--net-timeout", "120", NULL};
    spawn(&p, 0, "watched", x.text, extra, true, NULL);
    if (drv_ready(&x)) {
        sub_thread watcher = {0}, runner = {0};
        stall st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        watcher.on_chunk = stall_chunk;
        watcher.user = &st;
        sub_start(&watcher, &x, 0, NULL); /* ATTACH: held until the command starts */
        sleep_ms(200);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "head -c %d /dev/zero", TOTAL);
        hvd_run_msg run = {.command = cmd, .attach = true};
        sub_start(&runner, &x, 0, &run);

        /* The command ends while the watcher is still stuck in its first chunk. */
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        bool ended = false;
        int64_t t0 = test_now_ms();
        while (c && !ended && test_now_ms() - t0 < DEADLINE_MS) {
            hvd_status_msg status = {0};
            ended = hvd_client_call(c, &hvd_command_status_desc, NULL, &hvd_status_desc, &status, 0,
                                    0, &err) == 0 &&
                    status.ended;
            if (!ended) sleep_ms(100);
        }
        int64_t took = test_now_ms() - t0;
        pthread_mutex_lock(&st.mu);
        bool stuck = st.got_first && !st.release;
        st.release = true;
        pthread_cond_broadcast(&st.cv);
        pthread_mutex_unlock(&st.mu);
        CHECK_MSG(ended && stuck, "the command %s after %lld ms with a stalled ATTACH subscriber",
                  ended ? "ended" : "had not ended", (long long)took);
        fprintf(stderr, "  with a stalled watcher the command ended after %lld ms\n",
                (long long)took);
        sub_join(&runner);
        CHECK_MSG(runner.rc == 0 && runner.exit_code == 0, "%s", runner.err.msg);
        CHECK_MSG(runner.sink.out.len == TOTAL, "the agent got %zu of %d bytes",
                  runner.sink.out.len, TOTAL);
        sub_join(&watcher);
        CHECK(watcher.rc == -1);
        CHECK_MSG(log_has(&p, "dropped the subscriber"), "the task's log says why");
        hvd_client_close(c);
        sub_free(&runner);
        sub_free(&watcher);
    }
    CHECK(reap(&p, WAIT_MS) == 0);
    check_log_clean(&p);
    drv_down(&x);
}

/* Nobody attached and nobody reading the task's own stdout: the command blocks, and gets
 * going again once the reader does. */
static void test_local_backpressure(void) {
    enum { TOTAL = 8 << 20 };
    drv x;
    if (!drv_up(&x, 1)) return;
    int pfd[2];
    CHECK(pipe2(pfd, O_CLOEXEC) == 0);
    tproc p = {.out_fd = pfd[1]};
    const char *extra[] = {"--min-lifetime", "0.1", NULL};
    spawn(&p, 0, "local", x.text, extra, false, NULL);
    close(pfd[1]);
    if (drv_ready(&x)) {
        long rss0 = rss_kib_of(p.pid);
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        char cmd[64];
        snprintf(cmd, sizeof cmd, "head -c %d /dev/zero", TOTAL);
        CHECK(c && run_detached(c, cmd, NULL, NULL, &err) == 0);
        sleep_ms(1500);
        hvd_status_msg st = {0};
        CHECK(c && hvd_client_call(c, &hvd_command_status_desc, NULL, &hvd_status_desc, &st, 0, 0,
                                   &err) == 0);
        CHECK_MSG(st.started && !st.ended, "the command was not held back");
        long rss1 = rss_kib_of(p.pid);
        CHECK_MSG(rss1 - rss0 < 4 * 1024, "RSS grew from %ld to %ld KiB", rss0, rss1);
        size_t total = 0;
        static char chunk[1 << 16];
        while (total < TOTAL) {
            ssize_t n = read(pfd[0], chunk, sizeof chunk);
            if (n <= 0) break;
            total += (size_t)n;
        }
        CHECK_MSG(total == TOTAL, "read %zu of %d bytes", total, TOTAL);
        hvd_exit_msg ex = {0};
        CHECK(c &&
              hvd_client_call(c, &hvd_wait_exit_desc, NULL, &hvd_exit_desc, &ex, -1, 0, &err) ==
                  0 &&
              ex.exit_code == 0);
        hvd_client_close(c);
    }
    CHECK(reap(&p, WAIT_MS) == 0);
    close(pfd[0]);
    check_log_clean(&p);
    drv_down(&x);
}

/* The driver shuts the job down as soon as mpirun is gone, while orted may still be
 * exiting: a command that ends by itself within a moment gives its own status, to the first
 * task and to its sibling. */
static void test_driver_shutdown_race(void) {
    drv x;
    if (!drv_up(&x, 2)) return;
    tproc p[2] = {0};
    const char *extra[] = {"--min-lifetime", "0.5", NULL};
    for (uint32_t i = 0; i < 2; i++)
        spawn(&p[i], i, "race", x.text, extra, false, NULL);
    if (drv_ready(&x)) {
        hvd_client *c = task_client(&x, 0);
        hvd_err err;
        CHECK(c && run_detached(c, "sleep 0.3", NULL, NULL, &err) == 0);
        hvd_client_close(c);
        hvd_driver_shutdown_tasks(x.d);
        CHECK(reap(&p[0], WAIT_MS) == 0);
        CHECK(reap(&p[1], WAIT_MS) == 0);
    }
    for (int i = 0; i < 2; i++) {
        dump_log_if(p[i].status != 0, &p[i]);
        kill_and_reap(&p[i]);
        check_log_clean(&p[i]);
    }
    drv_down(&x);
}

/* ---- Start-up failures and the command line -------------------------------------------------- */

static void test_no_command(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    tproc p = {0};
    const char *extra[] = {"--start-timeout", "1", "--min-lifetime", "0.1", NULL};
    spawn(&p, 0, "idle", x.text, extra, false, NULL);
    drv_ready(&x);
    CHECK(reap(&p, WAIT_MS) == 1);
    CHECK(log_has(&p, "no command reached task 0 within 1 s: did mpirun start?"));
    check_log_clean(&p);
    drv_down(&x);
}

static void test_no_driver(void) {
    /* A port nobody listens on. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    getsockname(s, (struct sockaddr *)&a, &al);
    close(s);
    char addrs[64], want[160];
    snprintf(addrs, sizeof addrs, "lo=127.0.0.1:%u", ntohs(a.sin_port));
    snprintf(want, sizeof want, "could not register with the driver at %s within 1 s", addrs);
    tproc p = {0};
    const char *extra[] = {"--start-timeout", "1", NULL};
    spawn(&p, 3, "nodriver", addrs, extra, false, NULL);
    CHECK(reap(&p, WAIT_MS) == 1);
    CHECK(log_has(&p, want));
    dump_log_if(!log_has(&p, want), &p);
    check_log_clean(&p);
}

static void test_cli(void) {
    tproc p = {0};
    const char *help[] = {"--help", NULL};
    spawn(&p, 0, "cli", "lo=127.0.0.1:1", help, false, NULL);
    CHECK(reap(&p, WAIT_MS) == 0);
    CHECK(log_has(&p, "EXIT STATUS") && log_has(&p, "--secret-file"));
    const char *secret[] = {"--secret", "abc", NULL};
    spawn(&p, 0, "cli", "lo=127.0.0.1:1", secret, false, NULL);
    CHECK(reap(&p, WAIT_MS) == 2);
    CHECK(log_has(&p, "never taken from the command line"));
    const char *level[] = {"--log-level", "loud", NULL};
    spawn(&p, 0, "cli", "lo=127.0.0.1:1", level, false, NULL);
    CHECK(reap(&p, WAIT_MS) == 2);
    const char *addr[] = {NULL};
    spawn(&p, 0, "cli", "not an address", addr, false, NULL);
    CHECK(reap(&p, WAIT_MS) == 2);
    CHECK(log_has(&p, "bad driver addresses"));
}

/* ---- The library in this process ------------------------------------------------------------- */

typedef struct logbuf {
    pthread_mutex_t mu;
    buf text;
} logbuf;

static void collect_log(void *user, int level, const char *line) {
    (void)level;
    logbuf *l = user;
    pthread_mutex_lock(&l->mu);
    buf_add(&l->text, line, strlen(line));
    buf_add(&l->text, "\n", 1);
    pthread_mutex_unlock(&l->mu);
}

typedef struct runner {
    hvd_task *t;
    int rc, code;
    hvd_err err;
    atomic_bool done;
} runner;

static void *run_main(void *arg) {
    runner *r = arg;
    r->rc = hvd_task_run(r->t, &r->code, &r->err);
    atomic_store(&r->done, true);
    return NULL;
}

static void test_in_process(void) {
    drv x;
    if (!drv_up(&x, 1)) return;
    logbuf lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
    const char *gpus[] = {"3", NULL};
    hvd_task_config cfg = {.index = 0,
                           .secret = g_secret,
                           .driver_addrs = x.addrs,
                           .n_driver_addrs = x.naddrs,
                           .host_hash = "inproc",
                           .gpus = gpus,
                           .work_dir = "/tmp",
                           .grace_ms = 500,
                           .min_lifetime_ms = 200,
                           .log = collect_log,
                           .log_user = &lb,
                           .log_level = HVD_LOG_DEBUG};
    hvd_err err;
    hvd_task *t = hvd_task_start(&cfg, &err);
    CHECK_MSG(t != NULL, "%s", err.msg);
    if (!t) {
        drv_down(&x);
        return;
    }
    CHECK(hvd_task_port(t) > 0);
    runner r = {.t = t};
    atomic_init(&r.done, false);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, run_main, &r) == 0);
    drv_ready(&x);

    hvd_client *c = task_client(&x, 0);
    hvd_result_msg got;
    CHECK(hvd_task_result(t, &got) == 0 && !got.present);
    hvd_msg_free(&hvd_result_desc, &got);
    uint8_t bytes[] = {1, 2, 3};
    hvd_result_msg put = {.rank = 0,
                          .index = 0,
                          .present = true,
                          .status = 0,
                          .result = {bytes, 3},
                          .error = "bad luck"};
    CHECK(c && hvd_client_call(c, &hvd_register_result_desc, &put, &hvd_ack_desc, NULL, 0, 0,
                               &err) == 0);
    CHECK(hvd_task_result(t, &got) == 0 && got.present && got.result.len == 3 &&
          got.result.data[2] == 3 && got.error && strcmp(got.error, "bad luck") == 0);
    hvd_msg_free(&hvd_result_desc, &got);

    char mark[128];
    make_mark(mark, sizeof mark);
    char *set[] = {mark, "MY_SECRET_TOKEN=hunter2", NULL};
    hvd_run_msg run = {.command = "trap '' TERM; [ \"$(pwd)\" = /tmp ] && sleep 1000 & wait",
                       .env_set = {set, 2}};
    CHECK(c && hvd_client_call(c, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
    CHECK(wait_marked(mark, 2, WAIT_MS));
    int64_t t0 = test_now_ms();
    hvd_task_abort(t);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == -1 && strstr(r.err.msg, "aborted"), "rc %d: %s", r.rc, r.err.msg);
    CHECK(test_now_ms() - t0 < 10000);
    CHECK(count_marked(mark) == 0);
    hvd_client_close(c);
    hvd_task_stop(t);
    pthread_mutex_lock(&lb.mu);
    const char *log = lb.text.data ? lb.text.data : "";
    CHECK_MSG(strstr(log, "MY_SECRET_TOKEN=<hidden>") && !strstr(log, "hunter2"), "%s", log);
    CHECK(!strstr(log, g_secret_b64));
    pthread_mutex_unlock(&lb.mu);
    buf_free(&lb.text);
    drv_down(&x);
}

/* ---- Elastic task services --------------------------------------------------------------------
 */

static hvd_task *elastic_task(drv *x, uint32_t index, bool elastic, logbuf *lb) {
    hvd_task_config cfg = {.index = index,
                           .secret = g_secret,
                           .driver_addrs = x->addrs,
                           .n_driver_addrs = x->naddrs,
                           .host_hash = "elastic-host",
                           .work_dir = "/tmp",
                           .grace_ms = 500,
                           .min_lifetime_ms = 200,
                           .log = collect_log,
                           .log_user = lb,
                           .log_level = HVD_LOG_DEBUG,
                           .elastic = elastic};
    hvd_err err;
    hvd_task *t = hvd_task_start(&cfg, &err);
    CHECK_MSG(t != NULL, "%s", err.msg);
    return t;
}

/* RUN_COMMAND with attach: the exit code, or -1000 - the error code. */
static int run_attached(hvd_client *c, const char *command) {
    hvd_run_msg run = {.command = (char *)command, .attach = true};
    hvd_exit_msg ex;
    hvd_err err;
    if (hvd_client_call_stream(c, &hvd_run_desc, &run, NULL, NULL, -1, NULL, &hvd_exit_desc, &ex,
                               WAIT_MS, &err) != 0)
        return -1000 - err.code;
    return ex.exit_code;
}

static int stop_command(hvd_client *c, hvd_status_msg *st) {
    hvd_err err;
    return hvd_client_call(c, &hvd_stop_command_desc, NULL, &hvd_status_desc, st, WAIT_MS, 0, &err);
}

static int commit(hvd_client *c, uint64_t id, const char *state, hvd_err *err) {
    hvd_commit_msg m = {.id = id, .state = {(uint8_t *)state, strlen(state)}};
    return hvd_client_call(c, &hvd_commit_state_desc, &m, &hvd_ack_desc, NULL, 0, 0, err);
}

/* Commands one after another: refused only while one runs; STOP_COMMAND ends it and answers
 * once it has; ABORT with nothing running refuses nothing. */
static void elastic_commands(hvd_client *c) {
    char mark[128], cmd[256];
    make_mark(mark, sizeof mark);
    snprintf(cmd, sizeof cmd, "export %s; sleep 1000 & wait", mark);
    hvd_run_msg run = {.command = cmd};
    hvd_err err;
    CHECK(hvd_client_call(c, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
    CHECK(wait_marked(mark, 1, WAIT_MS));
    CHECK(hvd_client_call(c, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, &err) != 0 &&
          err.code == HVD_E_STATE && strstr(err.msg, "still runs"));
    hvd_status_msg st;
    CHECK(stop_command(c, &st) == 0 && st.ended && st.exit_code == 128 + SIGKILL);
    CHECK(count_marked(mark) == 0);
    CHECK(run_attached(c, "exit 7") == 7);
    CHECK(stop_command(c, &st) == 0 && st.ended && st.exit_code == 7); /* nothing runs */
    CHECK(hvd_client_call(c, &hvd_abort_desc, NULL, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
    CHECK(run_attached(c, "exit 0") == 0); /* not refused after the ABORT */
}

/* The newest commit is kept; a late older one does not replace it. */
static void elastic_commits(hvd_client *c) {
    hvd_err err;
    hvd_commit_msg m;
    CHECK(hvd_client_call(c, &hvd_latest_commit_desc, NULL, &hvd_commit_desc, &m, 0, 0, &err) ==
              0 &&
          m.id == 0 && m.size == 0);
    hvd_msg_free(&hvd_commit_desc, &m);
    CHECK(commit(c, 2, "second", &err) == 0);
    CHECK(commit(c, 1, "first", &err) == 0);
    CHECK(commit(c, 0, "none", &err) != 0 && err.code == HVD_E_INVALID);
    CHECK(hvd_client_call(c, &hvd_latest_commit_desc, NULL, &hvd_commit_desc, &m, 0, 0, &err) ==
              0 &&
          m.id == 2 && m.size == 6 && m.state.len == 0);
    hvd_msg_free(&hvd_commit_desc, &m);
    hvd_commit_ref_msg ref = {.id = 2};
    CHECK(hvd_client_call(c, &hvd_fetch_commit_desc, &ref, &hvd_commit_desc, &m, 0, 0, &err) == 0 &&
          m.id == 2 && m.state.len == 6 && memcmp(m.state.data, "second", 6) == 0);
    hvd_msg_free(&hvd_commit_desc, &m);
    ref.id = 1;
    CHECK(hvd_client_call(c, &hvd_fetch_commit_desc, &ref, &hvd_commit_desc, &m, 0, 0, &err) != 0 &&
          err.code == HVD_E_NOT_FOUND);
}

static void test_elastic(void) {
    drv x;
    if (!drv_up(&x, 3)) return;
    logbuf lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
    hvd_task *t[3] = {elastic_task(&x, 0, true, &lb), elastic_task(&x, 1, true, &lb),
                      elastic_task(&x, 2, false, &lb)};
    runner r[2] = {{.t = t[0]}, {.t = t[1]}};
    pthread_t th[2];
    for (int i = 0; i < 2 && t[0] && t[1]; i++) {
        atomic_init(&r[i].done, false);
        CHECK(pthread_create(&th[i], NULL, run_main, &r[i]) == 0);
    }
    hvd_err err;
    hvd_client *c1 = t[0] && t[1] && t[2] ? task_client(&x, 1) : NULL; /* not the first */
    hvd_client *c2 = c1 ? task_client(&x, 2) : NULL;
    if (c1 && c2) {
        elastic_commands(c1);
        elastic_commits(c1);
        CHECK(commit(c2, 1, "x", &err) != 0 && err.code == HVD_E_STATE); /* not elastic */
        /* The driver stops the launch's commands and learns the newest commit. */
        char mark[128], cmd[256];
        make_mark(mark, sizeof mark);
        snprintf(cmd, sizeof cmd, "export %s; trap '' TERM; sleep 1000 & wait", mark);
        hvd_client *c0 = task_client(&x, 0);
        hvd_run_msg run = {.command = cmd};
        CHECK(c0 && hvd_client_call(c0, &hvd_run_desc, &run, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
        CHECK(wait_marked(mark, 1, WAIT_MS));
        uint32_t idx[] = {0, 1};
        uint64_t newest = 0;
        size_t holders = 0;
        CHECK(hvd_driver_stop_commands(x.d, idx, 2, WAIT_MS, &newest, &holders) == 0);
        CHECK_MSG(newest == 2 && holders == 1, "newest %llu held by %zu",
                  (unsigned long long)newest, holders);
        CHECK(count_marked(mark) == 0); /* SIGKILLed, TERM trap or not */
        hvd_client_close(c0);
    }
    hvd_client_close(c1);
    hvd_client_close(c2);
    hvd_driver_shutdown_tasks(x.d); /* the elastic tasks' run returns */
    for (int i = 0; i < 2 && t[0] && t[1]; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(r[i].rc == 0, "task %d: %s", i, r[i].err.msg);
    }
    CHECK(r[1].code == 0); /* the last command's exit code */
    for (int i = 0; i < 3; i++)
        hvd_task_stop(t[i]);
    buf_free(&lb.text);
    drv_down(&x);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HVD_TASK_BINARY\n", argv[0]);
        return 2;
    }
    g_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    hvd_err err;
    CHECK(hvd_secret_generate(&g_secret, &err) == 0);
    hvd_secret_to_base64(&g_secret, g_secret_b64);
    setenv(HVD_SECRET_ENV, g_secret_b64, 1);
    unsetenv(HVD_SECRET_FILE_ENV);
    unsetenv("CUDA_VISIBLE_DEVICES");
    snprintf(g_dir, sizeof g_dir, "/tmp/hvd-tsvc-XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    int64_t t0 = test_now_ms();
    RUN(test_cli);
    RUN(test_no_driver);
    RUN(test_no_command);
    RUN(test_in_process);
    RUN(test_output_prefixed_two_subscribers);
    RUN(test_output_raw);
    RUN(test_output_timestamps);
    RUN(test_wait_exit);
    RUN(test_abort_tree);
    RUN(test_sigkill_task);
    RUN(test_slow_subscriber);
    RUN(test_stalled_watcher);
    RUN(test_local_backpressure);
    RUN(test_driver_shutdown_race);
    RUN(test_cluster);
    RUN(test_elastic);
    fprintf(stderr, "took %lld ms\n", (long long)(test_now_ms() - t0));
    if (test_failures == 0)
        nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        fprintf(stderr, "the tasks' logs are in %s\n", g_dir);
    return test_finish();
}
