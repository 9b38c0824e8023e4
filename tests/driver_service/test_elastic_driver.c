/* Tests of the driver's side of elastic jobs: the active set (host list, HOST_INDICES,
 * SET_LOCAL_RANK, results cover only it), lost tasks forgotten and coming back, ELASTIC_STATE,
 * and the elastic loop's host logic (elastic_hosts.c): the discovery script's format, which
 * host hash a discovered name means, the blacklist's cool-down, and the plan of a launch. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_internal.h"
#include "dtest.h"
#include "elastic.h"

static int host_indices(hvd_client *c, const char *host, char *buf, size_t len, hvd_err *err) {
    hvd_host_msg req = {.host_hash = (char *)host};
    hvd_indices_msg r;
    if (hvd_client_call(c, &hvd_host_indices_desc, &req, &hvd_indices_desc, &r, 0, 0, err) != 0)
        return -1;
    buf[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < r.indices.n; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%u", i ? "," : "", r.indices.v[i]);
    hvd_msg_free(&hvd_indices_desc, &r);
    return 0;
}

static int set_local_rank(hvd_client *c, const char *host, uint32_t local_rank, uint32_t rank,
                          uint32_t *index, hvd_err *err) {
    hvd_local_rank_msg req = {.host_hash = (char *)host, .local_rank = local_rank, .rank = rank};
    hvd_index_msg r;
    if (hvd_client_call(c, &hvd_set_local_rank_desc, &req, &hvd_index_desc, &r, 0, 0, err) != 0)
        return -1;
    *index = r.index;
    return 0;
}

static int report(hvd_client *c, int32_t rank, uint32_t index, hvd_err *err) {
    hvd_result_msg m = {.rank = rank, .index = index, .present = true};
    return hvd_client_call(c, &hvd_report_result_desc, &m, &hvd_ack_desc, NULL, 0, 0, err);
}

/* Tasks 0..5 on hosts hA (0, 1), hB (2, 3), hC (4, 5); a launch over 1-4. */
static void test_active_set(void) {
    hvd_driver *d = start_driver(6, NULL, NULL, NULL);
    hvd_client *c = d ? driver_client(d) : NULL;
    if (!c) return;
    hvd_err err;
    const char *host[] = {"hA", "hA", "hB", "hB", "hC", "hC"};
    for (uint32_t i = 0; i < 6; i++)
        CHECK(register_task(c, i, host[i], (uint16_t)(4000 + i), &err) == 0);
    uint32_t act[] = {4, 1, 2, 3};
    CHECK(hvd_driver_set_active(d, act, 4, &err) == 0);
    char *list = hvd_driver_host_list(d, &err);
    CHECK_MSG(list && strcmp(list, "hA:1,hB:2,hC:1") == 0, "%s", list ? list : err.msg);
    free(list);
    CHECK(hvd_driver_first_active(d) == 1);
    char buf[64];
    CHECK(host_indices(c, "hA", buf, sizeof buf, &err) == 0 && strcmp(buf, "1") == 0);
    CHECK(host_indices(c, "hB", buf, sizeof buf, &err) == 0 && strcmp(buf, "2,3") == 0);
    uint32_t index = 99;
    CHECK(set_local_rank(c, "hA", 0, 0, &index, &err) == 0 && index == 1);
    CHECK(set_local_rank(c, "hC", 0, 3, &index, &err) == 0 && index == 4);
    CHECK(set_local_rank(c, "hA", 1, 1, &index, &err) != 0 && err.code == HVD_E_INVALID);
    CHECK(set_local_rank(c, "hB", 0, 4, &index, &err) != 0 && err.code == HVD_E_INVALID);
    CHECK(report(c, 3, 4, &err) == 0);
    CHECK(report(c, 4, 4, &err) != 0 && err.code == HVD_E_INVALID); /* 4 ranks: 0-3 */
    hvd_rank_result *res;
    size_t n;
    CHECK(hvd_driver_results(d, &res, &n, &err) == 0 && n == 4 && res[3].present &&
          res[3].index == 4 && !res[0].present);
    hvd_driver_results_free(res, n);
    /* A new set forgets the ranks and results of the last one. */
    uint32_t next[] = {0, 5};
    CHECK(hvd_driver_set_active(d, next, 2, &err) == 0);
    CHECK(hvd_driver_results(d, &res, &n, &err) == 0 && n == 2 && !res[0].present &&
          !res[1].present);
    hvd_driver_results_free(res, n);
    list = hvd_driver_host_list(d, &err);
    CHECK_MSG(list && strcmp(list, "hA:1,hC:1") == 0, "%s", list ? list : err.msg);
    free(list);
    uint32_t twice[] = {0, 0}, bad[] = {9};
    CHECK(hvd_driver_set_active(d, twice, 2, &err) != 0 && err.code == HVD_E_INVALID);
    CHECK(hvd_driver_set_active(d, bad, 1, &err) != 0 && err.code == HVD_E_INVALID);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

/* A lost task is flagged, forgotten on request, and is back when its index registers again. */
static void test_lost_and_back(void) {
    hvd_driver *d = start_driver(2, NULL, NULL, NULL);
    hvd_client *c = d ? driver_client(d) : NULL;
    hvd_client *w = d ? driver_client(d) : NULL;
    if (!c || !w) return;
    hvd_err err;
    CHECK(register_task(c, 0, "hA", 4000, &err) == 0);
    CHECK(register_task(c, 1, "hB", 4001, &err) == 0);
    hvd_index_msg me = {.index = 1};
    CHECK(hvd_client_send(w, &hvd_wait_shutdown_desc, &me, &err) == 0);
    int64_t until = test_now_ms() + 5000;
    while (drv_held_count(d) < 1 && test_now_ms() < until)
        usleep(10000);
    hvd_client_close(w); /* the task service died */
    until = test_now_ms() + 5000;
    while (hvd_driver_lost_tasks(d) < 1 && test_now_ms() < until)
        usleep(10000);
    hvd_task_brief *t;
    size_t n;
    CHECK(hvd_driver_tasks(d, &t, &n, &err) == 0 && n == 2 && !t[0].lost && t[1].lost &&
          strcmp(t[1].host_hash, "hB") == 0);
    free(t);
    hvd_driver_forget_task(d, 0); /* not lost: kept */
    hvd_driver_forget_task(d, 1);
    CHECK(hvd_driver_tasks(d, &t, &n, &err) == 0 && n == 1 && t[0].index == 0);
    free(t);
    CHECK(hvd_driver_lost_tasks(d) == 0);
    CHECK(register_task(c, 1, "hC", 4002, &err) == 0); /* a replacement */
    CHECK(hvd_driver_tasks(d, &t, &n, &err) == 0 && n == 2 && !t[1].lost &&
          strcmp(t[1].host_hash, "hC") == 0);
    free(t);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

static void test_elastic_state(void) {
    hvd_driver *d = start_driver(1, NULL, NULL, NULL);
    hvd_client *c = d ? driver_client(d) : NULL;
    if (!c) return;
    hvd_err err;
    hvd_elastic_msg m;
    CHECK(hvd_client_call(c, &hvd_elastic_state_desc, NULL, &hvd_elastic_desc, &m, 0, 0, &err) ==
              0 &&
          m.epoch == 0 && !m.hosts_updated);
    hvd_driver_set_elastic(d, 3, true);
    CHECK(hvd_client_call(c, &hvd_elastic_state_desc, NULL, &hvd_elastic_desc, &m, 0, 0, &err) ==
              0 &&
          m.epoch == 3 && m.hosts_updated);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

/* ---- elastic_hosts.c ------------------------------------------------------------------------- */

static void test_discovery_script(void) {
    hvd_elastic_host *v = NULL;
    size_t n = 0;
    hvd_err err;
    CHECK(el_discover("printf 'a:2\\n  b\\n\\nc:3\\r\\na:4\\n'", 5, &v, &n, &err) == 0);
    CHECK_MSG(n == 3 && !strcmp(v[0].name, "a") && v[0].slots == 4 && !strcmp(v[1].name, "b") &&
                  v[1].slots == 5 && !strcmp(v[2].name, "c") && v[2].slots == 3,
              "%zu hosts", n);
    free(v);
    CHECK(el_discover("true", 1, &v, &n, &err) == 0 && n == 0); /* no host (yet) */
    free(v);
    CHECK(el_discover("echo 'a:x'", 1, &v, &n, &err) != 0 && strstr(err.msg, "slots"));
    CHECK(el_discover("echo 'a b'", 1, &v, &n, &err) != 0);
    CHECK(el_discover("exit 3", 1, &v, &n, &err) != 0 && strstr(err.msg, "exited with 3"));
}

static void test_host_matches(void) {
    CHECK(el_host_matches("node1", "node1"));
    CHECK(el_host_matches("node1-0123456789abcdef0123456789abcdef", "node1"));
    CHECK(el_host_matches("node1-0123456789abcdef0123456789abcdef", "node1.example.com"));
    CHECK(el_host_matches("10-0-0-5", "10.0.0.5")); /* hvd-driver --ssh's host hash */
    CHECK(!el_host_matches("10-0-0-5", "10.0.0.50"));
    CHECK(!el_host_matches("10-0-0-5", "10.0.0"));
    CHECK(!el_host_matches("node1-2-0123456789abcdef0123456789abcdef", "node1"));
    CHECK(!el_host_matches("node10", "node1"));
    CHECK(!el_host_matches("node1-xyz", "node1"));
}

static void test_blacklist_cooldown(void) {
    el_hosts h = {.cooldown_min_s = 10, .cooldown_max_s = 60};
    int64_t now = 1000000;
    int s1 = el_blacklist(&h, "hA", now);
    CHECK_MSG(s1 >= 20 && s1 <= 30, "first: %d s", s1); /* 10 * 2 + U(0, 10) */
    CHECK(!el_host_usable(&h, "hA", now + (s1 - 1) * 1000));
    CHECK(el_host_usable(&h, "hA", now + (s1 + 1) * 1000));
    int s2 = el_blacklist(&h, "hA", now);
    CHECK_MSG(s2 >= 40 && s2 <= 50, "second: %d s", s2);
    CHECK(el_blacklist(&h, "hA", now) == 60); /* at most max */
    CHECK(el_host_usable(&h, "hB", now));
    el_hosts_free(&h);
    el_hosts forever = {0};
    CHECK(el_blacklist(&forever, "hA", now) == -1);
    CHECK(!el_host_usable(&forever, "hA", now + 1000000000));
    el_hosts_free(&forever);
}

static void test_plan(void) {
    el_hosts h = {0};
    hvd_task_brief t[] = {{.index = 4, .host_hash = "hB"}, {.index = 0, .host_hash = "hA"},
                          {.index = 1, .host_hash = "hA"}, {.index = 5, .host_hash = "hB"},
                          {.index = 2, .host_hash = "hC"}, {.index = 3, .host_hash = "hC"}};
    el_host_get(&h, "hB"); /* seen first: it gets the lower ranks */
    el_host_get(&h, "hA");
    t[3].lost = true;
    el_plan p;
    CHECK(el_plan_make(&h, t, 6, 4, 0, &p) == 0);
    CHECK_MSG(p.n == 4 && p.usable == 5 && p.idx[0] == 4 && p.idx[1] == 0 && p.idx[2] == 1 &&
                  p.idx[3] == 2,
              "%zu of %zu", p.n, p.usable);
    char *hosts = el_plan_hosts(&p, t, 6);
    CHECK_MSG(hosts && !strcmp(hosts, "hB:1,hA:2,hC:1"), "%s", hosts);
    free(hosts);
    /* A script lists hA with one slot and hC: hB is not usable. */
    h.script = true;
    hvd_elastic_host disc[] = {{.name = "hA", .slots = 1}, {.name = "hC", .slots = 2}};
    h.disc = malloc(sizeof disc);
    memcpy(h.disc, disc, sizeof disc);
    h.ndisc = 2;
    el_plan q;
    CHECK(el_plan_make(&h, t, 6, 0, 0, &q) == 0);
    CHECK_MSG(q.n == 3 && q.idx[0] == 0 && q.idx[1] == 2 && q.idx[2] == 3, "%zu", q.n);
    CHECK(!el_plan_same(&p, &q) && el_plan_same(&q, &q));
    el_plan_free(&p);
    el_plan_free(&q);
    el_hosts_free(&h);
}

int main(void) {
    dtest_init();
    RUN(test_active_set);
    RUN(test_lost_and_back);
    RUN(test_elastic_state);
    RUN(test_discovery_script);
    RUN(test_host_matches);
    RUN(test_blacklist_cooldown);
    RUN(test_plan);
    return test_finish();
}
