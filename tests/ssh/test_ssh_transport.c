/* Integration tests of ssh/transport.c against a real OpenSSH sshd.
 *
 * The test makes a temp dir, has scripts/sshd-test-env.sh generate host and user keys and an
 * sshd_config there, and runs that sshd in the foreground as its own child on 127.0.0.2 (or
 * 127.0.0.1) and a free high port, with PR_SET_PDEATHSIG so that sshd dies with the test even
 * if the test crashes. HOME points into the temp dir, so ~/.ssh/known_hosts is a temp file;
 * SSH_AUTH_SOCK is unset. Everything is removed at exit. If sshd cannot run here, the test
 * exits 77 (skipped) and says why. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <libssh2.h>

#include "ssh/transport.h"
#include "testutil.h"

#ifndef HVD_SSHD_SCRIPT
#error "HVD_SSHD_SCRIPT must name scripts/sshd-test-env.sh"
#endif

#if defined(LIBSSH2_VERSION_NUM) && LIBSSH2_VERSION_NUM >= 0x010b00
#define SIGNAL_REQUESTS 1 /* hvd_ssh_run can send "signal" channel requests */
#else
#define SIGNAL_REQUESTS 0
#endif

static char dir[256];        /* everything lives here */
static char home[300];       /* $HOME for the test */
static char key[300];        /* authorized user key */
static char other_key[300];  /* a key sshd does not accept */
static char no_global[300];  /* a global known_hosts file that does not exist */
static char addr[32];        /* sshd's address */
static int port;             /* sshd's port */
static char hostname_kh[64]; /* "[addr]:port" */
static pid_t sshd_pid = -1, agent_pid = -1;
static pid_t remote_pids[8]; /* remote commands that outlived their test, killed at exit */
static int n_remote_pids;

/* ---- helpers ------------------------------------------------------------------------------ */

static void stop_child(pid_t *pid) {
    if (*pid <= 0) return;
    kill(*pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(*pid, NULL, WNOHANG) == *pid) {
            *pid = -1;
            return;
        }
        usleep(20000);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, NULL, 0);
    *pid = -1;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void cleanup(void) {
    for (int i = 0; i < n_remote_pids; i++)
        if (remote_pids[i] > 0) kill(remote_pids[i], SIGKILL);
    stop_child(&agent_pid);
    stop_child(&sshd_pid);
    if (dir[0]) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP test_ssh_transport: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(77); /* atexit(cleanup) runs */
}

/* Starts argv[0] (PATH lookup) as a child that dies with us; stdout/stderr to log. */
static pid_t spawn(char *const argv[], const char *log) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    int in = open("/dev/null", O_RDONLY);
    int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (in >= 0) dup2(in, 0);
    if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
}

/* Runs a command to completion; returns its exit status (-1 if it did not exit). */
static int run_wait(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    return run_wait(argv);
}

static bool have(const char *prog) {
    return sh("command -v %s >/dev/null 2>&1", prog) == 0;
}

/* A port nobody listens on right now (bound to port 0, then released). */
static int free_port(const char *a) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, a, &sa.sin_addr);
    socklen_t len = sizeof(sa);
    int p = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        p = ntohs(sa.sin_port);
    close(fd);
    return p;
}

static bool port_accepts(const char *a, int p) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    inet_pton(AF_INET, a, &sa.sin_addr);
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static void put_file(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_file(const char *path, const char *fmt, ...) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

/* "type base64" of a .pub file, into out. */
static void pub_key(const char *pubfile, char *out, size_t outlen) {
    char *text = slurp(pubfile, NULL);
    out[0] = '\0';
    if (!text) return;
    char *sp = strchr(text, ' ');
    char *sp2 = sp ? strchr(sp + 1, ' ') : NULL;
    if (sp2) *sp2 = '\0';
    char *nl = strchr(text, '\n');
    if (nl) *nl = '\0';
    snprintf(out, outlen, "%s", text);
    free(text);
}

static char host_ed25519[512], host_ecdsa[512], other_ed25519[512];

static void start_sshd(void) {
    snprintf(dir, sizeof(dir), "/tmp/hvd-ssh-test.XXXXXX");
    if (!mkdtemp(dir)) skip("mkdtemp: %s", strerror(errno));
    atexit(cleanup);
    if (access(HVD_SSHD_SCRIPT, R_OK) != 0) skip("%s not found", HVD_SSHD_SCRIPT);
    if (!have("bash")) skip("bash not found");

    const char *addrs[] = {"127.0.0.2", "127.0.0.1"};
    for (int attempt = 0; attempt < 4; attempt++) {
        snprintf(addr, sizeof(addr), "%s", addrs[attempt / 2]);
        port = free_port(addr);
        if (port <= 0) continue;
        char portstr[16];
        snprintf(portstr, sizeof(portstr), "%d", port);
        char *setup[] = {"bash", HVD_SSHD_SCRIPT, "setup", dir, addr, portstr, NULL};
        int st = run_wait(setup);
        if (st == 77) skip("sshd-test-env.sh cannot set up sshd here (see above)");
        if (st != 0) skip("sshd-test-env.sh setup failed with status %d (see above)", st);
        char log[300];
        snprintf(log, sizeof(log), "%s/sshd.log", dir);
        char *run[] = {"bash", HVD_SSHD_SCRIPT, "exec", dir, NULL};
        sshd_pid = spawn(run, log);
        for (int i = 0; i < 250; i++) { /* up to 5 s */
            if (port_accepts(addr, port)) goto started;
            if (waitpid(sshd_pid, NULL, WNOHANG) == sshd_pid) {
                sshd_pid = -1;
                break;
            }
            usleep(20000);
        }
        stop_child(&sshd_pid);
        char *text = slurp(log, NULL);
        fprintf(stderr, "sshd on %s:%d did not start; log:\n%s\n", addr, port, text ? text : "");
        free(text);
    }
    skip("sshd could not be started on a loopback address (log above)");
started:
    snprintf(key, sizeof(key), "%s/id_ed25519", dir);
    snprintf(other_key, sizeof(other_key), "%s/id_other", dir);
    snprintf(no_global, sizeof(no_global), "%s/no_global_known_hosts", dir);
    snprintf(home, sizeof(home), "%s/home", dir);
    mkdir(home, 0700);
    snprintf(hostname_kh, sizeof(hostname_kh), "[%s]:%d", addr, port);
    char pub[400];
    snprintf(pub, sizeof(pub), "%s/ssh_host_ed25519_key.pub", dir);
    pub_key(pub, host_ed25519, sizeof(host_ed25519));
    snprintf(pub, sizeof(pub), "%s/ssh_host_ecdsa_key.pub", dir);
    pub_key(pub, host_ecdsa, sizeof(host_ecdsa));
    snprintf(pub, sizeof(pub), "%s/id_other.pub", dir);
    pub_key(pub, other_ed25519, sizeof(other_ed25519));
    fprintf(stderr, "sshd pid %d on %s:%d, dir %s, libssh2 %s\n", (int)sshd_pid, addr, port, dir,
            LIBSSH2_VERSION);
}

/* Options for one test: our sshd, the authorized key, one user known_hosts file (or the
 * defaults under $HOME when kh is NULL), a global file that does not exist, no agent. */
typedef struct topts {
    hvd_ssh_options o;
    const char *ids[2];
    const char *ukh[1];
    const char *gkh[1];
} topts;

static void make_opts(topts *t, const char *kh) {
    hvd_ssh_options_init(&t->o);
    t->o.host = addr;
    t->o.port = port;
    t->ids[0] = key;
    t->o.identity_files = t->ids;
    t->o.n_identity_files = 1;
    if (kh) {
        t->ukh[0] = kh;
        t->o.user_known_hosts = t->ukh;
        t->o.n_user_known_hosts = 1;
    }
    t->gkh[0] = no_global;
    t->o.global_known_hosts = t->gkh;
    t->o.n_global_known_hosts = 1;
    t->o.use_agent = false;
    t->o.connect_timeout_ms = 5000;
}

/* A known_hosts file holding the server's ed25519 key. */
static void good_known_hosts(char *path, size_t len, const char *name) {
    snprintf(path, len, "%s/%s", dir, name);
    put_file(path, "%s %s\n", hostname_kh, host_ed25519);
}

typedef struct result {
    int rc, exit_code;
    hvd_err err;
    char *out, *errtext;
    size_t out_len;
    int64_t ms;
} result;

static void free_result(result *r) {
    free(r->out);
    free(r->errtext);
}

static int run_no = 0;

static result run(const hvd_ssh_options *o, const char *cmd, int interrupt_fd) {
    result r = {0};
    char outp[300], errp[300];
    snprintf(outp, sizeof(outp), "%s/out.%d", dir, run_no);
    snprintf(errp, sizeof(errp), "%s/err.%d", dir, run_no++);
    int out = open(outp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int errfd = open(errp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int64_t t0 = test_now_ms();
    r.rc = hvd_ssh_run(o, cmd, out, errfd, interrupt_fd, &r.exit_code, &r.err);
    r.ms = test_now_ms() - t0;
    close(out);
    close(errfd);
    r.out = slurp(outp, &r.out_len);
    r.errtext = slurp(errp, NULL);
    unlink(outp);
    unlink(errp);
    if (r.rc != 0)
        fprintf(stderr, "  [rc %d, exit %d, %lld ms] %s\n", r.rc, r.exit_code, (long long)r.ms,
                r.err.msg);
    return r;
}

static int count_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_exec_basic(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_basic");
    topts t;
    make_opts(&t, kh);
    int fds = count_fds();
    result r = run(&t.o, "echo hello; echo err >&2; exit 3", -1);
    CHECK(r.rc == 0);
    CHECK(r.exit_code == 3);
    CHECK_MSG(r.out && !strcmp(r.out, "hello\n"), "stdout [%s]", r.out);
    CHECK_MSG(r.errtext && !strcmp(r.errtext, "err\n"), "stderr [%s]", r.errtext);
    CHECK_MSG(count_fds() == fds, "fd leak: %d -> %d", fds, count_fds());
    free_result(&r);

    r = run(&t.o, "printf 'a\\000b'; exit 0", -1); /* bytes, not strings */
    CHECK(r.rc == 0 && r.exit_code == 0);
    CHECK(r.out_len == 3 && r.out && !memcmp(r.out, "a\0b", 3));
    free_result(&r);

    r = run(&t.o, "exit 255", -1);
    CHECK(r.rc == 0 && r.exit_code == 255);
    free_result(&r);

    r = run(&t.o, "cat; echo stdin-closed", -1); /* stdin is at EOF at once, like ssh -n */
    CHECK(r.rc == 0 && r.exit_code == 0 && r.out && !strcmp(r.out, "stdin-closed\n"));
    free_result(&r);

    t.o.verbose = 1; /* progress lines go to err_fd */
    r = run(&t.o, "true", -1);
    CHECK(r.rc == 0 && r.errtext);
    CHECK(r.errtext && strstr(r.errtext, "hvd-rsh: debug1: host key found in ") != NULL);
    CHECK(r.errtext && strstr(r.errtext, "hvd-rsh: debug1: remote command exited with status 0"));
    free_result(&r);
}

/* stdin_data reaches the command's stdin, then EOF; `started` tells whether it ran. */
static void test_stdin_and_started(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_stdin");
    topts t;
    make_opts(&t, kh);
    int started = 0;
    t.o.started = &started;
    t.o.stdin_data = "secret-line\nmore";
    t.o.stdin_len = strlen("secret-line\nmore");
    result r = run(&t.o, "IFS= read -r s; echo \"got [$s]\"; cat; echo; echo eof", -1);
    CHECK(r.rc == 0 && r.exit_code == 0 && started == 1);
    CHECK_MSG(r.out && !strcmp(r.out, "got [secret-line]\nmore\neof\n"), "stdout [%s]", r.out);
    free_result(&r);

    /* more than one channel packet (32 KiB), all of it arrives */
    size_t big = 100000;
    char *buf = malloc(big);
    CHECK(buf != NULL);
    if (!buf) return;
    for (size_t i = 0; i < big; i++)
        buf[i] = (char)('a' + i % 26);
    t.o.stdin_data = buf;
    t.o.stdin_len = big;
    r = run(&t.o, "wc -c", -1);
    CHECK(r.rc == 0 && r.exit_code == 0 && r.out && atol(r.out) == (long)big);
    free_result(&r);
    free(buf);

    started = 0;
    t.o.stdin_data = NULL;
    t.o.stdin_len = 0;
    t.ids[0] = other_key; /* refused: nothing ran */
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && started == 0);
    free_result(&r);
}

static void test_exec_signal(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_signal");
    topts t;
    make_opts(&t, kh);
    result r = run(&t.o, "kill -TERM $$", -1);
    CHECK(r.rc == 0);
    CHECK_MSG(r.exit_code == 143, "exit %d", r.exit_code);
    free_result(&r);
    r = run(&t.o, "kill -KILL $$", -1);
    CHECK(r.rc == 0);
    CHECK_MSG(r.exit_code == 137, "exit %d", r.exit_code);
    free_result(&r);
}

/* A slow pipe reader: the transport must wait for it (back-pressure), not drop data. */
typedef struct reader {
    int fd;
    char *buf;
    size_t len, cap;
} reader;

static void *reader_main(void *arg) {
    reader *rd = arg;
    usleep(200000);
    for (;;) {
        if (rd->len + 65536 > rd->cap) rd->buf = realloc(rd->buf, rd->cap = rd->cap * 2 + 65536);
        ssize_t n = read(rd->fd, rd->buf + rd->len, 65536);
        if (n <= 0) break;
        rd->len += (size_t)n;
    }
    return NULL;
}

static char *seq_text(int n, size_t *len) {
    char *s = malloc((size_t)n * 8 + 1);
    size_t l = 0;
    for (int i = 1; i <= n; i++)
        l += (size_t)sprintf(s + l, "%d\n", i);
    *len = l;
    return s;
}

static void test_large_output(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_large");
    topts t;
    make_opts(&t, kh);
    int p[2];
    CHECK(pipe(p) == 0);
    reader rd = {.fd = p[0]};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    char errp[300];
    snprintf(errp, sizeof(errp), "%s/large.err", dir);
    int errfd = open(errp, O_RDWR | O_CREAT | O_TRUNC, 0600);
    int code = -1;
    hvd_err err = {0};
    int64_t t0 = test_now_ms();
    /* ~6.9 MB on stdout while ~2 MB go to stderr at the same time */
    int rc =
        hvd_ssh_run(&t.o, "seq 1 300000 >&2 & seq 1 1000000; wait", p[1], errfd, -1, &code, &err);
    int64_t ms = test_now_ms() - t0;
    close(p[1]);
    pthread_join(th, NULL);
    close(p[0]);
    close(errfd);
    CHECK_MSG(rc == 0 && code == 0, "rc %d code %d: %s", rc, code, err.msg);
    size_t want_len, want_err_len, err_len = 0;
    char *want = seq_text(1000000, &want_len), *want_err = seq_text(300000, &want_err_len);
    char *got_err = slurp(errp, &err_len);
    CHECK_MSG(rd.len == want_len && !memcmp(rd.buf, want, want_len), "stdout %zu bytes, want %zu",
              rd.len, want_len);
    CHECK_MSG(got_err && err_len == want_err_len && !memcmp(got_err, want_err, err_len),
              "stderr %zu bytes, want %zu", err_len, want_err_len);
    fprintf(stderr, "  %.1f MB in %lld ms\n", (rd.len + err_len) / 1e6, (long long)ms);
    free(want);
    free(want_err);
    free(got_err);
    free(rd.buf);
}

static void test_unknown_and_accept_new(void) {
    topts t;
    make_opts(&t, NULL); /* defaults: ~/.ssh/known_hosts under the temp HOME */
    char kh[512], sshdir[400];
    snprintf(sshdir, sizeof(sshdir), "%s/.ssh", home);
    snprintf(kh, sizeof(kh), "%s/known_hosts", sshdir);

    result r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.exit_code == 255);
    CHECK(r.err.code == HVD_E_AUTH);
    char want[200];
    snprintf(want, sizeof(want), "@%s:%d: host key verification: no host key is known for %s", addr,
             port, hostname_kh);
    CHECK_MSG(strstr(r.err.msg, want) != NULL, "[%s] lacks [%s]", r.err.msg, want);
    CHECK(strstr(r.err.msg, kh) != NULL);           /* names the files it looked in */
    CHECK(strstr(r.err.msg, "accept-new") != NULL); /* and what to do */
    CHECK(strstr(r.err.msg, "ssh-keyscan -p ") != NULL && strstr(r.err.msg, "--ssh-accept-new"));
    CHECK(access(kh, F_OK) != 0); /* nothing written */
    free_result(&r);

    t.o.accept_new_host_keys = true;
    r = run(&t.o, "echo ok", -1);
    CHECK(r.rc == 0 && r.exit_code == 0 && r.out && !strcmp(r.out, "ok\n"));
    snprintf(want, sizeof(want), "Warning: Permanently added '%s' (ssh-ed25519)", hostname_kh);
    CHECK_MSG(r.errtext && strstr(r.errtext, want), "stderr [%s]", r.errtext);
    free_result(&r);
    struct stat st;
    CHECK(stat(sshdir, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(stat(kh, &st) == 0 && (st.st_mode & 0777) == 0600);
    char *text = slurp(kh, NULL);
    char line[700];
    snprintf(line, sizeof(line), "%s %s\n", hostname_kh, host_ed25519);
    CHECK_MSG(text && !strcmp(text, line), "known_hosts [%s]", text);
    free(text);

    t.o.accept_new_host_keys = false; /* now it is known */
    t.o.quiet = true;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == 0 && r.exit_code == 0);
    CHECK(r.errtext && r.errtext[0] == '\0');
    free_result(&r);

    /* OpenSSH accepts the entry we wrote (strict checking, only that file). */
    if (have("ssh"))
        CHECK(sh("ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes "
                 "-o UserKnownHostsFile=%s -o GlobalKnownHostsFile=/dev/null -i %s -p %d %s true",
                 kh, key, port, addr) == 0);

    /* hashed (HashKnownHosts=yes) */
    char hkh[300];
    snprintf(hkh, sizeof(hkh), "%s/kh_hashed", dir);
    make_opts(&t, hkh);
    t.o.accept_new_host_keys = true;
    t.o.hash_known_hosts = true;
    t.o.quiet = true;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == 0);
    free_result(&r);
    text = slurp(hkh, NULL);
    CHECK(text && !strncmp(text, "|1|", 3) && !strstr(text, addr));
    free(text);
    t.o.accept_new_host_keys = false;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == 0);
    free_result(&r);
    if (have("ssh-keygen")) CHECK(sh("ssh-keygen -F '%s' -f %s >/dev/null", hostname_kh, hkh) == 0);
}

static void test_openssh_written_known_hosts(void) {
    if (!have("ssh")) {
        fprintf(stderr, "  ssh client not installed: skipped\n");
        return;
    }
    char kh[300];
    snprintf(kh, sizeof(kh), "%s/kh_openssh", dir);
    CHECK(sh("ssh -F /dev/null -q -o BatchMode=yes -o StrictHostKeyChecking=accept-new "
             "-o HashKnownHosts=yes -o UserKnownHostsFile=%s -o GlobalKnownHostsFile=/dev/null "
             "-i %s -p %d %s true",
             kh, key, port, addr) == 0);
    topts t;
    make_opts(&t, kh);
    result r = run(&t.o, "true", -1);
    CHECK(r.rc == 0 && r.exit_code == 0);
    free_result(&r);
}

static void test_changed_host_key(void) {
    char kh[300];
    snprintf(kh, sizeof(kh), "%s/kh_changed", dir);
    put_file(kh, "# known hosts\nother.example %s\n%s %s\n", host_ed25519, hostname_kh,
             other_ed25519);
    topts t;
    make_opts(&t, kh);
    char want[600];
    snprintf(want, sizeof(want),
             "host key for %s has changed (known_hosts file %s line 3); refusing to connect",
             hostname_kh, kh);
    for (int accept = 0; accept < 2; accept++) { /* accept-new never overrides a change */
        t.o.accept_new_host_keys = accept;
        result r = run(&t.o, "true", -1);
        CHECK(r.rc == -1 && r.exit_code == 255 && r.err.code == HVD_E_AUTH);
        CHECK_MSG(strstr(r.err.msg, want) != NULL, "[%s] lacks [%s]", r.err.msg, want);
        CHECK(strstr(r.err.msg, "host key verification") != NULL);
        free_result(&r);
    }
    char *text = slurp(kh, NULL), expect[1200];
    snprintf(expect, sizeof(expect), "# known hosts\nother.example %s\n%s %s\n", host_ed25519,
             hostname_kh, other_ed25519);
    CHECK(text && !strcmp(text, expect)); /* untouched */
    free(text);
}

static void test_host_key_types(void) {
    /* Only the ECDSA key is known: the client must ask for ECDSA first and succeed. */
    char kh[300];
    snprintf(kh, sizeof(kh), "%s/kh_ecdsa", dir);
    put_file(kh, "%s %s\n", hostname_kh, host_ecdsa);
    topts t;
    make_opts(&t, kh);
    result r = run(&t.o, "true", -1);
    CHECK(r.rc == 0 && r.exit_code == 0);
    free_result(&r);

    /* A different ECDSA key on file: changed. */
    char other[300], otherpub[320], line[512];
    snprintf(other, sizeof(other), "%s/other_ecdsa", dir);
    snprintf(otherpub, sizeof(otherpub), "%s.pub", other);
    if (sh("ssh-keygen -q -t ecdsa -N '' -f %s", other) == 0) {
        pub_key(otherpub, line, sizeof(line));
        put_file(kh, "%s %s\n", hostname_kh, line);
        r = run(&t.o, "true", -1);
        CHECK(r.rc == -1 && strstr(r.err.msg, "has changed (known_hosts file") != NULL);
        free_result(&r);
    }

    /* Known only with a key type the server does not have: refused, even with accept-new
     * (an attacker could otherwise pick the type). */
    put_file(kh, "%s ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAAQC7\n", hostname_kh);
    t.o.accept_new_host_keys = true;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.err.code == HVD_E_AUTH);
    CHECK(strstr(r.err.msg, "known_hosts has only ssh-rsa keys") != NULL);
    free_result(&r);
}

static void test_wrong_user_key(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_auth");
    topts t;
    make_opts(&t, kh);
    t.ids[0] = other_key;
    result r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.exit_code == 255 && r.err.code == HVD_E_AUTH);
    CHECK(strstr(r.err.msg, "authentication: permission denied (publickey) for user") != NULL);
    char want[400];
    snprintf(want, sizeof(want), "%s (refused)", other_key);
    CHECK_MSG(strstr(r.err.msg, want) != NULL, "[%s] lacks [%s]", r.err.msg, want);
    free_result(&r);

    char missing[300];
    snprintf(missing, sizeof(missing), "%s/no_such_key", dir);
    t.ids[0] = missing;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && strstr(r.err.msg, "no_such_key (No such file or directory)") != NULL);
    free_result(&r);

    /* a second file is tried after a refused one */
    t.ids[0] = other_key;
    t.ids[1] = key;
    t.o.n_identity_files = 2;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == 0 && r.exit_code == 0);
    free_result(&r);
}

static void test_connect_failures(void) {
    topts t;
    make_opts(&t, no_global);
    /* nothing listening */
    t.o.port = free_port(addr);
    result r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.exit_code == 255 && r.err.code == HVD_E_IO);
    char want[200];
    snprintf(want, sizeof(want),
             ":%d: connect: connection to %s port %d failed: Connection refused", t.o.port, addr,
             t.o.port);
    CHECK_MSG(strstr(r.err.msg, want) != NULL, "[%s] lacks [%s]", r.err.msg, want);
    CHECK(r.ms < 1000);
    free_result(&r);

    /* something listens but never speaks: the key exchange times out */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    socklen_t len = sizeof(sa);
    CHECK(bind(ls, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(ls, 4) == 0);
    getsockname(ls, (struct sockaddr *)&sa, &len);
    t.o.port = ntohs(sa.sin_port);
    t.o.connect_timeout_ms = 600;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.err.code == HVD_E_TIMEOUT);
    CHECK(strstr(r.err.msg, "key exchange: no answer within 600 ms") != NULL);
    CHECK_MSG(r.ms >= 550 && r.ms < 2500, "%lld ms", (long long)r.ms);
    free_result(&r);
    close(ls);

    /* names go through the resolver thread */
    t.o.host = "localhost";
    t.o.port = free_port("127.0.0.1");
    t.o.connect_timeout_ms = 3000;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && strstr(r.err.msg, ": connect: connection to ") != NULL);
    free_result(&r);

    t.o.host = "hvd-no-such-host.invalid";
    t.o.connect_timeout_ms = 1500;
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.exit_code == 255 && strstr(r.err.msg, ": resolve: ") != NULL);
    CHECK_MSG(r.ms < 2500, "%lld ms", (long long)r.ms);
    free_result(&r);

    /* bad input */
    make_opts(&t, no_global);
    r = run(&t.o, "", -1);
    CHECK(r.rc == -1 && r.err.code == HVD_E_INVALID && r.exit_code == 255);
    free_result(&r);
    t.o.host = "";
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.err.code == HVD_E_INVALID);
    free_result(&r);
}

/* Writes to the interrupt pipe once the remote command has written its pid file. */
typedef struct interrupter {
    const char *pidfile;
    int fd;
    pid_t remote_pid;
} interrupter;

static void *interrupter_main(void *arg) {
    interrupter *in = arg;
    for (int i = 0; i < 500 && in->remote_pid <= 0; i++) { /* up to 10 s */
        char *text = slurp(in->pidfile, NULL);
        if (text && strchr(text, '\n')) in->remote_pid = atoi(text);
        free(text);
        if (in->remote_pid <= 0) usleep(20000);
    }
    usleep(200000); /* let the command settle into its loop */
    (void)!write(in->fd, "x", 1);
    return NULL;
}

/* True once pid is gone (or a zombie) within ms. */
static bool process_ends(pid_t pid, int ms) {
    for (int i = 0; i <= ms / 20; i++) {
        if (kill(pid, 0) != 0 && errno == ESRCH) return true;
        char path[64], stat[256] = "";
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(stat, sizeof(stat), f)) stat[0] = '\0';
            fclose(f);
        }
        char *rp = strrchr(stat, ')');
        if (rp && rp[1] == ' ' && rp[2] == 'Z') return true;
        usleep(20000);
    }
    return false;
}

static result run_interrupted(topts *t, const char *body, const char *tag, pid_t *remote) {
    char pidfile[300], cmd[600];
    snprintf(pidfile, sizeof(pidfile), "%s/%s.pid", dir, tag);
    snprintf(cmd, sizeof(cmd), "echo $$ > %s; %s", pidfile, body);
    int p[2];
    CHECK(pipe(p) == 0);
    interrupter in = {.pidfile = pidfile, .fd = p[1]};
    pthread_t th;
    pthread_create(&th, NULL, interrupter_main, &in);
    result r = run(&t->o, cmd, p[0]);
    pthread_join(th, NULL);
    close(p[0]);
    close(p[1]);
    *remote = in.remote_pid;
    return r;
}

/* Checks that the remote command `pid` ends within 3 s; if not, it is killed at exit (only
 * then: a pid that ended may be reused by another process). */
static bool remote_ends(pid_t pid) {
    if (pid > 0 && process_ends(pid, 3000)) return true;
    if (pid > 0 && n_remote_pids < 8) remote_pids[n_remote_pids++] = pid;
    return false;
}

static void test_interrupt_kill_exec(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_intr1");
    topts t;
    make_opts(&t, kh);
    t.o.interrupt_kill_exec = true;
    pid_t remote = 0;
    /* silent: only a real signal ends it */
    result r = run_interrupted(&t, "exec sleep 30", "intr1", &remote);
    CHECK(remote > 0);
    CHECK(r.rc == HVD_SSH_INTERRUPTED);
    CHECK_MSG(r.exit_code == 143, "exit %d", r.exit_code);
    CHECK(r.err.code == HVD_E_SHUTDOWN && strstr(r.err.msg, "interrupted") != NULL);
    CHECK(strstr(r.err.msg, "exit code 143") != NULL);
    CHECK(r.ms < 6000);
    CHECK(remote_ends(remote));
    free_result(&r);

    t.o.interrupt_signal = "INT";
    r = run_interrupted(&t, "exec sleep 30", "intr1b", &remote);
    CHECK(r.rc == HVD_SSH_INTERRUPTED);
    CHECK_MSG(r.exit_code == 130, "exit %d", r.exit_code);
    CHECK(remote_ends(remote));
    free_result(&r);

    t.o.interrupt_signal = "term; reboot";
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && r.err.code == HVD_E_INVALID);
    free_result(&r);
}

static void test_interrupt_close(void) {
    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_intr2");
    topts t;
    make_opts(&t, kh);
    t.o.interrupt_grace_ms = 500;
    pid_t remote = 0;
    /* a command that writes: closing the channel ends it (SIGPIPE) even with no signal */
    result r = run_interrupted(&t, "while :; do echo tick; sleep 0.1; done", "intr2", &remote);
    CHECK(remote > 0);
    CHECK(r.rc == HVD_SSH_INTERRUPTED);
    CHECK(r.out && strstr(r.out, "tick\n") != NULL);
#if SIGNAL_REQUESTS
    CHECK_MSG(r.exit_code == 143, "exit %d", r.exit_code);
#else
    CHECK_MSG(r.exit_code == 255, "exit %d", r.exit_code); /* no status: it was still running */
    CHECK(strstr(r.err.msg, "cannot send one") != NULL);
#endif
    CHECK(r.ms < 5000);
    CHECK(remote_ends(remote));
    free_result(&r);

    /* interrupted before anything ran */
    int p[2];
    CHECK(pipe(p) == 0);
    (void)!write(p[1], "x", 1);
    r = run(&t.o, "touch /tmp/hvd-must-not-exist", p[0]);
    CHECK(r.rc == HVD_SSH_INTERRUPTED && r.exit_code == 255);
    CHECK(strstr(r.err.msg, "interrupted before the command started") != NULL);
    CHECK(r.ms < 1000);
    CHECK(access("/tmp/hvd-must-not-exist", F_OK) != 0);
    free_result(&r);
    close(p[0]);
    close(p[1]);
}

static void test_agent(void) {
    if (!have("ssh-agent") || !have("ssh-add")) {
        fprintf(stderr, "  ssh-agent not installed: skipped\n");
        return;
    }
    char sock[300], log[300];
    snprintf(sock, sizeof(sock), "%s/agent.sock", dir);
    snprintf(log, sizeof(log), "%s/agent.log", dir);
    char *argv[] = {"ssh-agent", "-D", "-a", sock, NULL};
    agent_pid = spawn(argv, log);
    for (int i = 0; i < 250 && access(sock, F_OK) != 0; i++)
        usleep(20000);
    CHECK(access(sock, F_OK) == 0);
    CHECK(sh("SSH_AUTH_SOCK=%s ssh-add -q %s 2>/dev/null", sock, key) == 0);

    char kh[300];
    good_known_hosts(kh, sizeof(kh), "kh_agent");
    topts t;
    make_opts(&t, kh);
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/no_such_key", dir);
    t.ids[0] = missing; /* only the agent can log us in */
    t.o.use_agent = true;
    t.o.agent_socket = sock;
    result r = run(&t.o, "echo via-agent", -1);
    CHECK(r.rc == 0 && r.exit_code == 0 && r.out && !strcmp(r.out, "via-agent\n"));
    free_result(&r);

    CHECK(sh("SSH_AUTH_SOCK=%s ssh-add -q -D 2>/dev/null && SSH_AUTH_SOCK=%s ssh-add -q %s "
             "2>/dev/null",
             sock, sock, other_key) == 0);
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && strstr(r.err.msg, "ssh-agent (1 key refused)") != NULL);
    free_result(&r);

    t.o.use_agent = false; /* off: the agent is not asked */
    r = run(&t.o, "true", -1);
    CHECK(r.rc == -1 && strstr(r.err.msg, "ssh-agent") == NULL);
    free_result(&r);
    stop_child(&agent_pid);
}

/* The whole path hvd-rsh takes: an Open MPI-style argv, parsed, then run. */
static void test_argv_end_to_end(void) {
    char kh[300], khopt[320], portstr[16];
    good_known_hosts(kh, sizeof(kh), "kh_argv");
    snprintf(khopt, sizeof(khopt), "UserKnownHostsFile=%s", kh);
    snprintf(portstr, sizeof(portstr), "%d", port);
    char *argv[] = {
        "hvd-rsh", "-x", "-i",    key,       "-o",    khopt, "-o",     "GlobalKnownHostsFile=none",
        addr,      "-p", portstr, " printf", "'%s|'", "a b", "\"c d\""};
    hvd_ssh_args a;
    hvd_err err = {0};
    CHECK_MSG(hvd_ssh_args_parse((int)(sizeof(argv) / sizeof(argv[0])), argv, &a, &err) == 0, "%s",
              err.msg);
    hvd_ssh_options o;
    hvd_ssh_options_init(&o);
    hvd_ssh_options_from_args(&o, &a);
    o.use_agent = false;
    result r = run(&o, a.command, -1);
    CHECK(r.rc == 0 && r.exit_code == 0);
    /* the words are joined with spaces and split again by the remote shell, as with ssh */
    CHECK_MSG(r.out && !strcmp(r.out, "a|b|c d|"), "stdout [%s]", r.out);
    free_result(&r);
    hvd_ssh_args_free(&a);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    unsetenv("SSH_AUTH_SOCK");
    int64_t t0 = test_now_ms();
    start_sshd();
    setenv("HOME", home, 1);

    RUN(test_exec_basic);
    RUN(test_stdin_and_started);
    RUN(test_exec_signal);
    RUN(test_large_output);
    RUN(test_unknown_and_accept_new);
    RUN(test_openssh_written_known_hosts);
    RUN(test_changed_host_key);
    RUN(test_host_key_types);
    RUN(test_wrong_user_key);
    RUN(test_connect_failures);
    RUN(test_interrupt_kill_exec);
    RUN(test_interrupt_close);
    RUN(test_agent);
    RUN(test_argv_end_to_end);
    fprintf(stderr, "total %lld ms\n", (long long)(test_now_ms() - t0));
    return test_finish();
}
