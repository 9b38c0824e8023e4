/* Unit tests of common/'s small modules: string vectors, host specifications, the clock,
 * tree removal, the signal pipe and the event loop (with a real thread, pipes and timers). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/hostspec.h"
#include "common/io.h"
#include "common/loop.h"
#include "common/sig.h"
#include "common/strv.h"
#include "testutil.h"

static void test_strv(void) {
    char **v = hvd_strv_split("a,,bc,", ',');
    CHECK(v && hvd_strv_len((const char *const *)v) == 2);
    CHECK(v && !strcmp(v[0], "a") && !strcmp(v[1], "bc") && v[2] == NULL);
    char *j = hvd_strv_join((const char *const *)v, ", ");
    CHECK(j && !strcmp(j, "a, bc"));
    CHECK(hvd_strv_has((const char *const *)v, "bc") && !hvd_strv_has((const char *const *)v, "b"));
    char **c = hvd_strv_copy((const char *const *)v);
    CHECK(c && c != v && c[0] != v[0] && !strcmp(c[1], "bc") && !c[2]);
    free(j);
    hvd_strv_free(v);
    hvd_strv_free(c);

    /* shell words: quotes, backslashes, empty words, nothing expanded */
    const char *why = NULL;
    char **w = hvd_strv_split_shell(
        "  -x \"FOO=a b\" --bind-to\tcore 'it''s $HOME' a\\ b \"\\$x\\n\" '' ", &why);
    const char *want[] = {"-x",  "FOO=a b", "--bind-to", "core", "its $HOME",
                          "a b", "$x\\n",   "",          NULL};
    CHECK(w && !why && hvd_strv_len((const char *const *)w) == 8);
    for (size_t i = 0; w && i < 8; i++)
        CHECK_MSG(!strcmp(w[i], want[i]), "word %zu: [%s], want [%s]", i, w[i], want[i]);
    hvd_strv_free(w);
    CHECK(!hvd_strv_split_shell("-x \"FOO=a", &why) && why && strstr(why, "unclosed"));
    CHECK(!hvd_strv_split_shell("it's", &why) && why && strstr(why, "'"));
    w = hvd_strv_split_shell(" \t\n", &why);
    CHECK(w && w[0] == NULL && !why);
    hvd_strv_free(w);

    char **e = hvd_strv_split("", ',');
    CHECK(e && e[0] == NULL);
    hvd_strv_free(e);
    CHECK(hvd_strv_len(NULL) == 0);
    hvd_strv_free(NULL);

    hvd_strb b = {0};
    hvd_strb_add(&b, "mpirun");
    for (int i = 0; i < 100; i++)
        hvd_strb_addf(&b, "-x%d", i);
    char **argv = hvd_strb_finish(&b);
    CHECK(argv && hvd_strv_len((const char *const *)argv) == 101);
    CHECK(argv && !strcmp(argv[0], "mpirun") && !strcmp(argv[100], "-x99") && !argv[101]);
    CHECK(b.v == NULL && b.n == 0);
    hvd_strv_free(argv);
    hvd_strb empty = {0};
    char **none = hvd_strb_finish(&empty);
    CHECK(none && none[0] == NULL);
    hvd_strv_free(none);
}

static void test_hostspec(void) {
    hvd_hostspec h;
    hvd_err err;
    CHECK(hvd_hostspec_parse("alice@node1:4", 13, "slots", 1, 4096, &h, &err) == 0);
    CHECK(!strcmp(h.user, "alice") && !strcmp(h.host, "node1") && h.number == 4);
    CHECK(hvd_hostspec_parse("node2", 5, "slots", 1, 4096, &h, &err) == 0);
    CHECK(!h.user[0] && !strcmp(h.host, "node2") && h.number == -1);
    CHECK(hvd_hostspec_parse("[fe80::1%eth0]:2", 16, "slots", 1, 4096, &h, &err) == 0);
    CHECK(!strcmp(h.host, "fe80::1%eth0") && h.number == 2);
    CHECK(hvd_hostspec_parse("fe80::1", 7, "slots", 1, 4096, &h, &err) == 0);
    CHECK(!strcmp(h.host, "fe80::1") && h.number == -1);
    const char *s = "host:2,other"; /* a piece of a list: only the first 6 bytes */
    CHECK(hvd_hostspec_parse(s, 6, "slots", 1, 4096, &h, &err) == 0 && h.number == 2);
    const char *bad[] = {
        "", "@h", "u@", "h:0", "h:x", "h:", "[::1", "[::1]x", "a b", "h;rm", "h:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = '\0';
        CHECK_MSG(hvd_hostspec_parse(bad[i], strlen(bad[i]), "slots", 1, 4096, &h, &err) == -1,
                  "'%s' accepted", bad[i]);
        CHECK_MSG(err.code == HVD_E_INVALID && strstr(err.msg, "bad host"), "'%s': %s", bad[i],
                  err.msg);
    }
}

/* Horovod's hostfile: comments, blank lines, CR LF, default and explicit slots, brackets; each
 * malformed line refused with the line and what to write. */
static void test_hostfile(void) {
    hvd_err err;
    char *hosts = NULL;
    const char *good = "# hosts\n\nlocalhost slots=2 # two\n h2\t slots=3\r\n[fe80::1] slots=1\nh4";
    CHECK(hvd_hostfile_parse(good, strlen(good), "F", &hosts, &err) == 0);
    CHECK_MSG(hosts && !strcmp(hosts, "localhost:2,h2:3,[fe80::1]:1,h4:1"), "%s", hosts);
    free(hosts);
    const struct {
        const char *text, *says;
    } bad[] = {
        {"", "hostfile F names no host"},
        {"# none\n  \n", "hostfile F names no host"},
        {"h1 slots=2\nh2:1\n", "hostfile F line 2: write 'h2:1' as '<host> slots=<n>'"},
        {"h1 slots=two", "line 1: 'h1 slots=two' is not '<host> slots=<n>' with n from 1 to 4096"},
        {"h1 slots=0", "line 1: 'h1 slots=0' is not"},
        {"h1 slots=", "line 1: 'h1 slots=' is not"},
        {"h1 slots=5000", "line 1: 'h1 slots=5000' is not"},
        {"h1 max_slots=8 # mpirun's", "line 1: 'h1 max_slots=8' is not"},
        {"slots=2", "line 1: 'slots=2' names no host (write '<host> slots=<n>')"},
        {"::1 slots=2", "write the IPv6 address ::1 in brackets ([::1] slots=<n>)"},
        {"node1:2,node2:2", "line 1: 'node1:2,node2:2' holds a comma: write one"},
        {"a,b slots=1", "holds a comma"},
        {"h;rm slots=1", "line 1: bad host 'h;rm'"},
        {"[fe80::1]x slots=1", "line 1: bad host '[fe80::1]x'"},
        {"h1 slots=2\rjunk", "line 1: 'h1 slots=2 junk' is not"},
        {"h1\0junk slots=9", "holds a NUL byte (saved as UTF-16?)"},
    };
    char big[900]; /* a long bad line: the message still says what to write */
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memcpy(big, "h1 slots=1 ", 11);
    CHECK(hvd_hostfile_parse(big, strlen(big), "F", &hosts, &err) == -1);
    CHECK_MSG(strstr(err.msg, "...' is not '<host> slots=<n>' with n from 1 to 4096"), "%s",
              err.msg);
    const char *bom = "\xef\xbb\xbfh1 slots=2\r\n";
    CHECK(hvd_hostfile_parse(bom, strlen(bom), "F", &hosts, &err) == 0);
    CHECK_MSG(hosts && !strcmp(hosts, "h1:2"), "%s", hosts);
    free(hosts);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hosts = (char *)"unset";
        size_t len = strlen(bad[i].text);
        if (strstr(bad[i].says, "NUL")) len += 1 + strlen(bad[i].text + len + 1);
        CHECK_MSG(hvd_hostfile_parse(bad[i].text, len, "F", &hosts, &err) == -1, "'%s' accepted",
                  bad[i].text);
        CHECK_MSG(hosts == NULL && err.code == HVD_E_INVALID && strstr(err.msg, bad[i].says),
                  "'%s': %s", bad[i].text, err.msg);
    }
    CHECK(hvd_hostfile_read("/nonexistent/hostfile", &hosts, &err) == -1);
    CHECK_MSG(err.code == HVD_E_IO && errno == ENOENT &&
                  strstr(err.msg, "cannot read hostfile /nonexistent/hostfile"),
              "%s", err.msg);
}

static void test_clock(void) {
    int64_t a = hvd_now_ms(), ns = hvd_now_ns();
    CHECK(a > 0 && ns / 1000000 >= a);
    CHECK(hvd_ms_left(-1) == -1);
    CHECK(hvd_ms_left(a - 10) == 0);
    int left = hvd_ms_left(hvd_now_ms() + 5000);
    CHECK(left > 4000 && left <= 5000);
    struct timespec ts = hvd_ms_to_timespec(12345);
    CHECK(ts.tv_sec == 12 && ts.tv_nsec == 345000000);
}

static void test_remove_tree(void) {
    char dir[] = "/tmp/hvd-test-common-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[256];
    snprintf(p, sizeof p, "%s/a/b/c", dir);
    char q[256];
    snprintf(q, sizeof q, "%s/a", dir);
    mkdir(q, 0700);
    snprintf(q, sizeof q, "%s/a/b", dir);
    mkdir(q, 0700);
    mkdir(p, 0700);
    snprintf(q, sizeof q, "%s/a/b/c/file", dir);
    int fd = open(q, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0 && hvd_write_all(fd, "data", 4) == 0);
    hvd_close_fd(&fd);
    CHECK(fd == -1);
    snprintf(q, sizeof q, "%s/link", dir);
    CHECK(symlink("/etc", q) == 0); /* removed, never followed */
    CHECK(hvd_remove_tree(dir) == 0);
    struct stat st;
    CHECK(stat(dir, &st) != 0 && errno == ENOENT);
    CHECK(stat("/etc/passwd", &st) == 0);
    CHECK(hvd_remove_tree(dir) == 0); /* already gone: fine */
}

static void test_signals(void) {
    hvd_err err;
    int fd = hvd_signals_install(&err);
    CHECK_MSG(fd >= 0, "%s", err.msg);
    CHECK(hvd_signals_next(fd) == 0 && hvd_signals_first() == 0);
    raise(SIGTERM);
    raise(SIGHUP);
    CHECK(hvd_signals_next(fd) == SIGTERM);
    CHECK(hvd_signals_next(fd) == SIGHUP);
    CHECK(hvd_signals_next(fd) == 0);
    CHECK(hvd_signals_first() == SIGTERM);
    /* Who sent it: ourselves, then a child. */
    pid_t sender = -1;
    CHECK(kill(getpid(), SIGINT) == 0);
    CHECK(hvd_signals_next_from(fd, &sender) == SIGINT && sender == getpid());
    pid_t child = fork();
    if (child == 0) _exit(kill(getppid(), SIGTERM) == 0 ? 0 : 1);
    int st = -1;
    CHECK(child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int sig = 0;
    for (int i = 0; i < 100 && !(sig = hvd_signals_next_from(fd, &sender)); i++)
        usleep(10 * 1000);
    CHECK_MSG(sig == SIGTERM && sender == child, "signal %d from %d, want %d from %d", sig,
              (int)sender, SIGTERM, (int)child);
    raise(SIGPIPE); /* ignored: we are still here */
    CHECK(1);
    /* A child forked without exec that gets SIGTERM ends by it, as without the handler, and
     * nothing reaches the parent's pipe. */
    child = fork();
    if (child == 0) {
        for (int i = 0; i < 500; i++)
            usleep(10 * 1000);
        _exit(3);
    }
    usleep(50 * 1000);
    CHECK(child > 0 && kill(child, SIGTERM) == 0);
    CHECK(waitpid(child, &st, 0) == child);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "the forked child's status: %#x", st);
    usleep(20 * 1000);
    CHECK(hvd_signals_next(fd) == 0);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGINT, SIG_DFL);
}

/* ---- the event loop ---- */

typedef struct loop_probe {
    hvd_loop *l;
    atomic_int posts, timers, reads, after;
    atomic_int on_thread;
    int pipe[2];
    hvd_watch *w;
    uint64_t cancelled;
    int64_t timer_at;
} loop_probe;

static void on_post(void *arg) {
    loop_probe *p = arg;
    if (hvd_loop_on_thread(p->l)) atomic_fetch_add(&p->on_thread, 1);
    atomic_fetch_add(&p->posts, 1);
}

static void on_timer(void *arg) {
    loop_probe *p = arg;
    p->timer_at = hvd_now_ms();
    atomic_fetch_add(&p->timers, 1);
}

static void on_never(void *arg) {
    loop_probe *p = arg;
    atomic_fetch_add(&p->timers, 100); /* a cancelled timer must not fire */
}

static void on_read(int fd, uint32_t events, void *arg) {
    loop_probe *p = arg;
    char buf[16];
    CHECK(events & EPOLLIN);
    if (read(fd, buf, sizeof buf) > 0) atomic_fetch_add(&p->reads, 1);
}

static void on_after(void *arg) {
    loop_probe *p = arg;
    atomic_fetch_add(&p->after, 1);
}

static void setup_on_loop(void *arg) {
    loop_probe *p = arg;
    hvd_err err;
    p->w = hvd_loop_watch(p->l, p->pipe[0], EPOLLIN, on_read, p, &err);
    CHECK(p->w != NULL);
    p->cancelled = hvd_loop_timer(p->l, 50, on_never, p);
    CHECK(p->cancelled > 0);
    hvd_loop_timer_cancel(p->l, p->cancelled);
    CHECK(hvd_loop_timer(p->l, 100, on_timer, p) > 0);
}

static void unwatch_on_loop(void *arg) {
    loop_probe *p = arg;
    hvd_loop_unwatch(p->l, p->w);
    p->w = NULL;
}

static bool wait_for(atomic_int *v, int want, int ms) {
    int64_t end = hvd_now_ms() + ms;
    while (atomic_load(v) < want && hvd_now_ms() < end)
        usleep(1000);
    return atomic_load(v) >= want;
}

static void test_loop(void) {
    loop_probe p = {0};
    hvd_err err;
    p.l = hvd_loop_create(&err);
    CHECK_MSG(p.l != NULL, "%s", err.msg);
    if (!p.l) return;
    CHECK(pipe2(p.pipe, O_CLOEXEC | O_NONBLOCK) == 0);
    hvd_loop_set_after_batch(p.l, on_after, &p);
    CHECK(!hvd_loop_on_thread(p.l));
    CHECK(hvd_loop_start(p.l, &err) == 0);
    CHECK(hvd_loop_start(p.l, &err) == -1 && err.code == HVD_E_STATE);
    int64_t t0 = hvd_now_ms();
    CHECK(hvd_loop_post(p.l, setup_on_loop, &p) == 0);
    for (int i = 0; i < 1000; i++)
        CHECK(hvd_loop_post(p.l, on_post, &p) == 0);
    CHECK(wait_for(&p.posts, 1000, 5000));
    CHECK(atomic_load(&p.on_thread) == 1000);
    CHECK(write(p.pipe[1], "x", 1) == 1);
    CHECK(wait_for(&p.reads, 1, 5000));
    CHECK(wait_for(&p.timers, 1, 5000));
    CHECK_MSG(p.timer_at - t0 >= 100 && p.timer_at - t0 < 2000, "timer after %lld ms",
              (long long)(p.timer_at - t0));
    usleep(100 * 1000);
    CHECK(atomic_load(&p.timers) == 1); /* the cancelled one never fired */
    CHECK(atomic_load(&p.after) > 0);
    CHECK(hvd_loop_post(p.l, unwatch_on_loop, &p) == 0);
    CHECK(wait_for(&p.posts, 1000, 100)); /* still 1000: the unwatch post is not on_post */
    usleep(50 * 1000);
    CHECK(write(p.pipe[1], "y", 1) == 1);
    usleep(100 * 1000);
    CHECK(atomic_load(&p.reads) == 1); /* unwatched: not read again */

    /* Stop joins the thread; work posted before it runs on the caller; later posts fail. */
    hvd_loop_stop(p.l);
    CHECK(hvd_loop_post(p.l, on_post, &p) == -1);
    hvd_loop_stop(p.l); /* twice is fine */
    hvd_loop_free(p.l);
    close(p.pipe[0]);
    close(p.pipe[1]);

    /* A loop that never ran still runs what was posted to it, once, at stop. */
    loop_probe q = {0};
    q.l = hvd_loop_create(&err);
    CHECK(q.l && hvd_loop_post(q.l, on_post, &q) == 0);
    hvd_loop_free(q.l);
    CHECK(atomic_load(&q.posts) == 1 && atomic_load(&q.on_thread) == 0);
}

int main(void) {
    RUN(test_strv);
    RUN(test_hostspec);
    RUN(test_hostfile);
    RUN(test_clock);
    RUN(test_remove_tree);
    RUN(test_signals);
    RUN(test_loop);
    return test_finish();
}
