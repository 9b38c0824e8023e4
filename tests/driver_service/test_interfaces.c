/* Tests of hvd_driver_common_interfaces against fake task services: real "task i" servers on
 * loopback that answer REGISTRATION_DONE and then, from a client of their own, send the
 * driver a scripted REPORT_REACHABLE built from the tasks the driver told them to probe.
 * Tasks 2h and 2h+1 are host h; only 2h (the host's lowest task) probes. With one network
 * (every host declares the same addresses, as fake hosts on one machine do) the hosts probe
 * each other in a ring; with a network per host (eth0 127.0.1.h) every ordered pair of
 * hosts is probed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_internal.h"
#include "dtest.h"

/* Which interface names task i reaches task j on ("lo,eth0", "" for nothing). */
typedef const char *(*reach_fn)(uint32_t i, uint32_t j);

typedef struct fake {
    uint32_t index;
    hvd_driver *d;
    hvd_server *srv;
    reach_fn reach;
    bool never_report;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hvd_peers_msg peers; /* the last REGISTRATION_DONE (under mu) */
    int notified;        /* how many REGISTRATION_DONE arrived (under mu) */
    int reported;        /* how many reports were sent (under mu) */
    int handled;         /* notifications the reporter has handled (reporter thread) */
    bool quit;
    bool started; /* the reporter thread runs */
} fake;

static void on_registration_done(hvd_call *call, const msgpack_object *body, void *user) {
    fake *f = user;
    hvd_peers_msg m;
    hvd_err err;
    if (hvd_msg_unpack(body, &hvd_registration_done_desc, &m, &err) != 0) {
        hvd_call_fail(call, HVD_E_PROTOCOL, "%s", err.msg);
        return;
    }
    pthread_mutex_lock(&f->mu);
    hvd_msg_free(&hvd_registration_done_desc, &f->peers);
    f->peers = m;
    f->notified++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    hvd_call_reply(call, &hvd_ack_desc, NULL);
}

/* Builds this task's report from the task table and the script. */
/* True if the comma-separated list names contains name. */
static bool listed(const char *names, const char *name) {
    size_t nl = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == nl && strncmp(p, name, nl) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* Builds this task's report from the task table and the script: for each peer, the peer's
 * addresses on the scripted interfaces; a scripted name the peer did not declare becomes a
 * made-up address (the driver must not count it). */
static void build_report(fake *f, const hvd_peers_msg *p, hvd_reachable_msg *out) {
    out->from = f->index;
    out->reach.v = calloc(p->tasks.n, sizeof(hvd_reach));
    out->reach.n = 0;
    hvd_reach *rv = out->reach.v;
    const hvd_task_info *t = p->tasks.v;
    for (size_t k = 0; k < p->tasks.n; k++) {
        if (t[k].index == f->index) continue;
        const char *names = f->reach(f->index, t[k].index);
        hvd_reach *r = &rv[out->reach.n++];
        r->to = t[k].index;
        r->addrs.v = calloc(t[k].addrs.n + 8, sizeof(hvd_addr));
        hvd_addr *out_a = r->addrs.v;
        const hvd_addr *a = t[k].addrs.v;
        for (size_t x = 0; x < t[k].addrs.n; x++)
            if (listed(names, a[x].ifname)) out_a[r->addrs.n++] = a[x];
        char copy[128];
        snprintf(copy, sizeof copy, "%s", names);
        for (char *save = NULL, *name = strtok_r(copy, ",", &save);
             name && r->addrs.n < t[k].addrs.n + 8; name = strtok_r(NULL, ",", &save)) {
            bool declared = false;
            for (size_t x = 0; x < t[k].addrs.n; x++)
                declared |= strcmp(a[x].ifname, name) == 0;
            if (declared) continue;
            hvd_addr fake_addr = {.host = "172.17.0.2", .port = 1};
            snprintf(fake_addr.ifname, sizeof fake_addr.ifname, "%s", name);
            out_a[r->addrs.n++] = fake_addr;
        }
    }
}

static void free_report(hvd_reachable_msg *m) {
    hvd_reach *rv = m->reach.v;
    for (size_t k = 0; k < m->reach.n; k++)
        free(rv[k].addrs.v);
    free(rv);
}

static void *reporter(void *p) {
    fake *f = p;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && f->notified == f->handled)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->quit) break;
        f->handled = f->notified;
        if (!f->peers.probe || f->never_report) continue;
        hvd_reachable_msg m;
        build_report(f, &f->peers, &m);
        pthread_mutex_unlock(&f->mu);
        hvd_err err;
        hvd_client *c = driver_connect(f->d, &err);
        int rc =
            c ? hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, 0, &err) : -1;
        if (rc != 0) fprintf(stderr, "  fake task %u: report failed: %s\n", f->index, err.msg);
        hvd_client_close(c);
        free_report(&m);
        pthread_mutex_lock(&f->mu);
        if (rc == 0) f->reported++;
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

typedef struct job {
    uint32_t n;
    hvd_driver *d;
    fake *fakes;
    logcap lc;
} job;

static const char *all_both(uint32_t i, uint32_t j) {
    (void)i, (void)j;
    return "lo,eth0";
}

/* Networks: the eth0 address of host h ("127.0.0.1": every host on one network). */
typedef void (*eth0_fn)(uint32_t host, char *out, size_t len);

static void one_network(uint32_t host, char *out, size_t len) {
    (void)host;
    snprintf(out, len, "127.0.0.1");
}

static void network_per_host(uint32_t host, char *out, size_t len) {
    snprintf(out, len, "127.0.1.%u", host);
}

/* Hosts 0 and 1 on one network, the others on another. */
static void two_networks(uint32_t host, char *out, size_t len) {
    snprintf(out, len, "127.0.1.%u", host < 2 ? 1 : 2);
}

/* Starts n fake tasks and a driver, and registers each task with a "lo" address (127.0.0.1),
 * an "eth0" address (eth0(host)) and an IPv6 "lo" address, all with the fake's port. The
 * driver reaches the fakes on 127.0.0.1 (the other addresses are refused or unused). */
static bool job_start_net(job *jb, uint32_t n, reach_fn reach, const char *const *nics,
                          eth0_fn eth0) {
    memset(jb, 0, sizeof *jb);
    jb->n = n;
    logcap_init(&jb->lc);
    jb->d = start_driver(n, &jb->lc, NULL, nics);
    if (!jb->d) return false;
    jb->fakes = calloc(n, sizeof *jb->fakes);
    hvd_client *c = driver_client(jb->d);
    if (!c) return false;
    bool ok = true;
    for (uint32_t i = 0; i < n; i++) {
        fake *f = &jb->fakes[i];
        f->index = i;
        f->d = jb->d;
        f->reach = reach ? reach : all_both;
        pthread_mutex_init(&f->mu, NULL);
        pthread_cond_init(&f->cv, NULL);
        char name[HVD_SERVICE_NAME_MAX];
        hvd_task_service_name(i, name);
        hvd_server_config sc = {.name = name, .secret = g_secret, .bind_host = "127.0.0.1"};
        hvd_err err;
        f->srv = hvd_server_create(&sc, &err);
        if (!f->srv) {
            CHECK_MSG(0, "%s", err.msg);
            ok = false;
            break;
        }
        hvd_server_handle(f->srv, HVD_MSG_REGISTRATION_DONE, on_registration_done, f);
        CHECK(hvd_server_start(f->srv, &err) == 0);
        f->started = pthread_create(&f->th, NULL, reporter, f) == 0;
        uint16_t port = hvd_server_port(f->srv);
        hvd_addr a[3] = {{.ifname = "lo", .host = "127.0.0.1", .port = port},
                         {.ifname = "eth0", .port = port},
                         {.ifname = "lo", .host = "::1", .port = port}};
        eth0(i / 2, a[1].host, sizeof a[1].host);
        char host[32];
        snprintf(host, sizeof host, "host%u", i / 2);
        if (register_addrs(c, i, host, a, 3, &err) != 0) {
            CHECK_MSG(0, "%s", err.msg);
            ok = false;
            break;
        }
    }
    hvd_client_close(c);
    hvd_err err;
    if (ok) CHECK_MSG(hvd_driver_wait_registration(jb->d, 10000, &err) == 0, "%s", err.msg);
    return ok;
}

static bool job_start(job *jb, uint32_t n, reach_fn reach, const char *const *nics) {
    return job_start_net(jb, n, reach, nics, one_network);
}

static void job_stop(job *jb) {
    hvd_driver_stop(jb->d);
    for (uint32_t i = 0; jb->fakes && i < jb->n; i++) {
        fake *f = &jb->fakes[i];
        hvd_server_destroy(f->srv);
        if (!f->started) continue;
        pthread_mutex_lock(&f->mu);
        f->quit = true;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->th, NULL);
        hvd_msg_free(&hvd_registration_done_desc, &f->peers);
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
    }
    free(jb->fakes);
    logcap_free(&jb->lc);
}

/* "lo,eth0" from a NULL-terminated list. */
static void join_names(char **v, char *buf, size_t len) {
    buf[0] = '\0';
    for (size_t k = 0; v && v[k]; k++) {
        strncat(buf, k ? "," : "", len - strlen(buf) - 1);
        strncat(buf, v[k], len - strlen(buf) - 1);
    }
}

static void free_names(char **v) {
    for (size_t k = 0; v && v[k]; k++)
        free(v[k]);
    free(v);
}

/* Runs a round; returns the names as "a,b" in buf, or the error. */
static int run_round(job *jb, int timeout_ms, char *buf, size_t len, hvd_err *err) {
    char **ifs = NULL;
    int rc = hvd_driver_common_interfaces(jb->d, timeout_ms, &ifs, err);
    if (rc == 0) join_names(ifs, buf, len);
    free_names(ifs);
    return rc;
}

/* Every fake was told once; the lowest task of each host (even index) was told to probe the
 * expected number of tasks (0: told not to probe), the others to probe nothing; the tasks to
 * probe are hosts' lowest tasks, the first after the prober's own index first, each with its
 * IPv4 addresses only. */
static void check_told(job *jb, uint32_t targets) {
    for (uint32_t i = 0; i < jb->n; i++) {
        fake *f = &jb->fakes[i];
        pthread_mutex_lock(&f->mu);
        CHECK_MSG(f->notified == 1, "task %u told %d times", i, f->notified);
        uint32_t want = i % 2 == 0 ? targets : 0;
        CHECK_MSG(f->peers.probe == (want > 0), "task %u probe %d", i, f->peers.probe);
        CHECK_MSG(f->peers.tasks.n == want, "task %u told to probe %zu", i, f->peers.tasks.n);
        const hvd_task_info *t = f->peers.tasks.v;
        for (uint32_t k = 0; k < f->peers.tasks.n; k++) {
            char host[32];
            snprintf(host, sizeof host, "host%u", t[k].index / 2);
            CHECK(t[k].index % 2 == 0 && t[k].index != i && strcmp(t[k].host_hash, host) == 0);
            CHECK_MSG(t[k].addrs.n == 2, "task %u's view of %u: %zu addresses", i, t[k].index,
                      t[k].addrs.n);
        }
        if (f->peers.tasks.n > 1)
            CHECK_MSG(t[0].index > i || t[f->peers.tasks.n - 1].index < i,
                      "task %u starts probing at %u", i, t[0].index);
        pthread_mutex_unlock(&f->mu);
    }
}

static int reports_sent(job *jb) {
    int n = 0;
    for (uint32_t i = 0; i < jb->n; i++) {
        pthread_mutex_lock(&jb->fakes[i].mu);
        n += jb->fakes[i].reported;
        pthread_mutex_unlock(&jb->fakes[i].mu);
    }
    return n;
}

/* A fake counts its report once it has the driver's ack, which may come a moment after the
 * driver used the report: wait up to ms for `want` reports. */
static bool wait_reports_sent(job *jb, int want, int ms) {
    for (int waited = 0; waited < ms && reports_sent(jb) != want; waited += 10)
        usleep(10 * 1000);
    return reports_sent(jb) == want;
}

/* ---- Cases --------------------------------------------------------------------------------- */

static void test_all_share(void) {
    job jb;
    if (job_start(&jb, 4, all_both, NULL)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
        check_told(&jb, 1); /* a ring of two hosts: task 0 -> task 2 -> task 0 */
        CHECK(wait_reports_sent(&jb, 2, 2000));
        CHECK(LOG_HAS(&jb.lc, "probing 2 pair(s) of tasks for 4 task(s) on 2 host(s), 1 network"));
        CHECK(LOG_HAS(&jb.lc, "interfaces that connect every pair of hosts: lo,eth0"));
    }
    job_stop(&jb);
}

/* Eight hosts each with its own address: every ordered pair of hosts (56) is probed. */
static void test_network_per_host(void) {
    job jb;
    if (job_start_net(&jb, 16, all_both, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
        check_told(&jb, 7);
        CHECK(wait_reports_sent(&jb, 8, 2000));
        CHECK(
            LOG_HAS(&jb.lc, "probing 56 pair(s) of tasks for 16 task(s) on 8 host(s), 8 network"));
    }
    job_stop(&jb);
}

/* Two networks of two hosts: a ring in each (2 + 2 pairs) and the two first hosts both ways
 * (2 pairs). */
static void test_two_networks(void) {
    job jb;
    if (job_start_net(&jb, 8, all_both, NULL, two_networks)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
        CHECK(LOG_HAS(&jb.lc, "probing 6 pair(s) of tasks for 8 task(s) on 4 host(s), 2 network"));
        /* Task 0 and task 4 lead their networks: each probes its ring peer and the other. */
        uint32_t want[8] = {2, 0, 1, 0, 2, 0, 1, 0};
        for (uint32_t i = 0; i < 8; i++) {
            pthread_mutex_lock(&jb.fakes[i].mu);
            CHECK_MSG(jb.fakes[i].peers.tasks.n == want[i], "task %u probes %zu", i,
                      jb.fakes[i].peers.tasks.n);
            pthread_mutex_unlock(&jb.fakes[i].mu);
        }
        CHECK(wait_reports_sent(&jb, 4, 2000));
    }
    job_stop(&jb);
}

static const char *one_pair_lacks_eth0(uint32_t i, uint32_t j) {
    return i == 2 && j == 4 ? "lo" : "lo,eth0";
}

static void test_one_pair_lacks_eth0(void) {
    job jb;
    if (job_start_net(&jb, 8, one_pair_lacks_eth0, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo") == 0, "%s", got);
    }
    job_stop(&jb);
}

static const char *one_pair_nothing(uint32_t i, uint32_t j) {
    return i == 4 && j == 6 ? "" : "lo,eth0";
}

static void test_one_pair_nothing(void) {
    job jb;
    if (job_start_net(&jb, 8, one_pair_nothing, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK(run_round(&jb, 10000, got, sizeof got, &err) == -1);
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK(err.code == HVD_E_NOT_FOUND);
        CHECK_MSG(strstr(err.msg, "no network interface connects every pair of hosts: in 1 "
                                  "probed pair(s) the first host's task reached none of the "
                                  "second's addresses on lo, eth0: task 4 -> task 6:") &&
                      strstr(err.msg, "--nics"),
                  "%s", err.msg);
        /* The reverse direction works, and is not blamed (the mesh is directed). */
        CHECK(strstr(err.msg, "task 6 -> task 4") == NULL);
    }
    job_stop(&jb);
}

/* Hosts that declare the same addresses but do not share a network stack (containers with the
 * same private address on different machines): the ring between them fails, and says so. */
static void test_same_addresses_apart(void) {
    job jb;
    if (job_start(&jb, 8, one_pair_nothing, NULL)) {
        char got[128];
        hvd_err err;
        CHECK(run_round(&jb, 10000, got, sizeof got, &err) == -1 && err.code == HVD_E_NOT_FOUND);
        CHECK_MSG(strstr(err.msg, "in 1 probed pair(s)") && strstr(err.msg, "task 4 -> task 6"),
                  "%s", err.msg);
    }
    job_stop(&jb);
}

static const char *split_interfaces(uint32_t i, uint32_t j) {
    if (i == 0 && j == 2) return "lo";
    if (i == 4 && j == 6) return "eth0";
    return "lo,eth0";
}

static void test_no_single_interface(void) {
    job jb;
    if (job_start_net(&jb, 8, split_interfaces, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK(run_round(&jb, 10000, got, sizeof got, &err) == -1 && err.code == HVD_E_NOT_FOUND);
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK_MSG(strstr(err.msg, "no single network interface") &&
                      strstr(err.msg, "lo fails task 4 -> task 6") &&
                      strstr(err.msg, "eth0 fails task 0 -> task 2"),
                  "%s", err.msg);
    }
    job_stop(&jb);
}

static const char *many_pairs_nothing(uint32_t i, uint32_t j) {
    return j == 0 && i != 0 ? "" : "lo"; /* nobody reaches task 0 */
}

static void test_many_pairs_listed(void) {
    job jb;
    if (job_start_net(&jb, 32, many_pairs_nothing, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK(run_round(&jb, 10000, got, sizeof got, &err) == -1 && err.code == HVD_E_NOT_FOUND);
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK_MSG(strstr(err.msg, "in 15 probed pair(s) the first host's task reached none of the "
                                  "second's addresses on lo, eth0: task 2 -> task 0, ") &&
                      strstr(err.msg, "task 20 -> task 0 and 5 more"),
                  "%s", err.msg);
        CHECK(strstr(err.msg, "task 22 -> task 0") == NULL);
    }
    job_stop(&jb);
}

static void test_task_never_reports(void) {
    job jb;
    if (job_start(&jb, 4, all_both, NULL)) {
        pthread_mutex_lock(&jb.fakes[2].mu);
        jb.fakes[2].never_report = true;
        pthread_mutex_unlock(&jb.fakes[2].mu);
        char got[128];
        hvd_err err;
        int64_t t0 = test_now_ms();
        CHECK(run_round(&jb, 1500, got, sizeof got, &err) == -1);
        int64_t took = test_now_ms() - t0;
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK(err.code == HVD_E_TIMEOUT);
        CHECK_MSG(strstr(err.msg, "1 of 2 reported, missing task(s) 2:") != NULL, "%s", err.msg);
        CHECK_MSG(took >= 1400 && took < 4000, "took %lld ms", (long long)took);
        /* A later round with the task fixed succeeds (reports of the old round are dropped). */
        pthread_mutex_lock(&jb.fakes[2].mu);
        jb.fakes[2].never_report = false;
        pthread_mutex_unlock(&jb.fakes[2].mu);
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK(strcmp(got, "lo,eth0") == 0);
    }
    job_stop(&jb);
}

static void test_task_unreachable(void) {
    job jb;
    if (job_start(&jb, 4, all_both, NULL)) {
        hvd_server_destroy(jb.fakes[1].srv); /* task 1's service is gone: refused */
        jb.fakes[1].srv = NULL;
        char got[128];
        hvd_err err;
        CHECK(run_round(&jb, 5000, got, sizeof got, &err) == -1);
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK(err.code == HVD_E_IO);
        CHECK_MSG(strstr(err.msg, "could not tell 1 of 4 task(s)") &&
                      strstr(err.msg, "task 1 (host "),
                  "%s", err.msg);
        /* The others were told, and probed anyway. */
        CHECK(wait_reports_sent(&jb, 2, 5000));
    }
    job_stop(&jb);
}

static void test_no_common_name(void) {
    job jb;
    if (job_start(&jb, 4, all_both, NULL)) {
        /* Task 3 moves to a machine whose only interface is ens5. */
        hvd_client *c = driver_client(jb.d);
        hvd_addr ens5 = {
            .ifname = "ens5", .host = "127.0.0.1", .port = hvd_server_port(jb.fakes[3].srv)};
        hvd_err err;
        CHECK(c && register_addrs(c, 3, "host1", &ens5, 1, &err) == 0);
        hvd_client_close(c);
        char got[128];
        CHECK(run_round(&jb, 10000, got, sizeof got, &err) == -1);
        fprintf(stderr, "  error: %s\n", err.msg);
        CHECK(err.code == HVD_E_NOT_FOUND);
        CHECK_MSG(strstr(err.msg, "no network interface name in common: task 0 has lo, task 3 "
                                  "has not; task 0 has eth0, task 3 has not:"),
                  "%s", err.msg);
        /* The tasks were still told (so none waits), without probing. */
        for (uint32_t i = 0; i < 4; i++) {
            pthread_mutex_lock(&jb.fakes[i].mu);
            CHECK(jb.fakes[i].notified == 1 && !jb.fakes[i].peers.probe);
            pthread_mutex_unlock(&jb.fakes[i].mu);
        }
    }
    job_stop(&jb);
}

static const char *reach_extra_names(uint32_t i, uint32_t j) {
    (void)i, (void)j;
    return "lo,eth0,docker0"; /* docker0 is not declared by anyone: ignored */
}

static void test_undeclared_names_ignored(void) {
    job jb;
    if (job_start_net(&jb, 6, reach_extra_names, NULL, network_per_host)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
    }
    job_stop(&jb);
}

static void test_user_nics(void) {
    job jb;
    /* A subnet (Open MPI's if_include takes one) is passed on unchecked. */
    const char *const nics[] = {"eth0", "10.0.0.0/8", NULL};
    if (job_start(&jb, 4, all_both, nics)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "eth0,10.0.0.0/8") == 0, "%s", got);
        /* Every task was told, without probing; nobody reported. */
        check_told(&jb, 0);
        usleep(100 * 1000);
        CHECK(reports_sent(&jb) == 0);
    }
    job_stop(&jb);
}

/* A --nics name that the tasks declared no address on is warned about, naming it and what a
 * task declared (mpirun would fail later on one host, saying only that host's part); the
 * round goes on: a task bound to one address declares only that one. An alias label is
 * compared by its device. */
static void test_user_nics_missing(void) {
    job jb;
    const char *const nics[] = {"lo", "eth0:1", "eth9", NULL};
    if (job_start(&jb, 4, all_both, nics)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0:1,eth9") == 0, "%s", got);
        CHECK(LOG_HAS(&jb.lc, "warning: --nics names eth9, on which 4 of 4 tasks declared no "
                              "address (task 0 on host host0 declared: lo, eth0)"));
        CHECK(!LOG_HAS(&jb.lc, "--nics names eth0:1"));
        /* Every task was told, nobody probed. */
        check_told(&jb, 0);
        usleep(100 * 1000);
        CHECK(reports_sent(&jb) == 0);
    }
    job_stop(&jb);
}

static void test_one_task(void) {
    job jb;
    if (job_start(&jb, 1, all_both, NULL)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
        check_told(&jb, 0);
    }
    job_stop(&jb);
}

/* Two tasks of one host: nobody probes (both run under one orted), every candidate counts. */
static void test_one_host(void) {
    job jb;
    if (job_start(&jb, 2, all_both, NULL)) {
        char got[128];
        hvd_err err;
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        CHECK_MSG(strcmp(got, "lo,eth0") == 0, "%s", got);
        check_told(&jb, 0);
        CHECK(reports_sent(&jb) == 0);
    }
    job_stop(&jb);
}

static void test_sixteen_tasks(void) {
    job jb;
    if (job_start(&jb, 16, all_both, NULL)) {
        char got[128];
        hvd_err err;
        int64_t t0 = test_now_ms();
        CHECK_MSG(run_round(&jb, 10000, got, sizeof got, &err) == 0, "%s", err.msg);
        fprintf(stderr, "  16 tasks: told, probed and reported in %lld ms\n",
                (long long)(test_now_ms() - t0));
        CHECK(strcmp(got, "lo,eth0") == 0);
        check_told(&jb, 1);
    }
    job_stop(&jb);
}

int main(void) {
    dtest_init();
    RUN(test_all_share);
    RUN(test_network_per_host);
    RUN(test_two_networks);
    RUN(test_one_pair_lacks_eth0);
    RUN(test_one_pair_nothing);
    RUN(test_same_addresses_apart);
    RUN(test_no_single_interface);
    RUN(test_many_pairs_listed);
    RUN(test_task_never_reports);
    RUN(test_task_unreachable);
    RUN(test_no_common_name);
    RUN(test_undeclared_names_ignored);
    RUN(test_user_nics);
    RUN(test_user_nics_missing);
    RUN(test_one_task);
    RUN(test_one_host);
    RUN(test_sixteen_tasks);
    return test_finish();
}
