/* Tests of the driver service over real sockets on loopback: registration from many client
 * threads, idempotent and moving re-registration, refused registrations, the registration
 * wait and its timeout message, every lookup and its errors, the host list's barrel shift,
 * results in rank order, and WAIT_SHUTDOWN long-polls. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_internal.h"
#include "dtest.h"

static const hvd_field index_fields_for_test[] = {HVD_FIELD(hvd_index_msg, index, HVD_F_U32)};

/* ---- Request helpers ------------------------------------------------------------------------ */

/* HOST_INDICES as "0,1" into buf. */
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

static int index_by_rank(hvd_client *c, uint32_t rank, uint32_t *index, hvd_err *err) {
    hvd_rank_msg req = {.rank = rank};
    hvd_index_msg r;
    if (hvd_client_call(c, &hvd_index_by_rank_desc, &req, &hvd_index_desc, &r, 0, 0, err) != 0)
        return -1;
    *index = r.index;
    return 0;
}

static int report_result(hvd_client *c, int32_t rank, uint32_t index, int32_t status,
                         const char *data, const char *error, hvd_err *err) {
    hvd_result_msg m = {.rank = rank,
                        .index = index,
                        .present = true,
                        .status = status,
                        .result = {(uint8_t *)data, data ? strlen(data) : 0},
                        .error = (char *)error};
    return hvd_client_call(c, &hvd_report_result_desc, &m, &hvd_ack_desc, NULL, 0, 0, err);
}

static int report_stopped(hvd_client *c, int32_t rank, uint32_t index, hvd_err *err) {
    hvd_result_msg m = {.rank = rank,
                        .index = index,
                        .present = true,
                        .status = 143,
                        .error = "stopped by SIGTERM from orted",
                        .stopped = true};
    return hvd_client_call(c, &hvd_report_result_desc, &m, &hvd_ack_desc, NULL, 0, 0, err);
}

static int task_event(hvd_client *c, uint32_t index, uint32_t kind, int code, int sig,
                      const char *text, hvd_err *err) {
    hvd_task_event_msg m = {
        .index = index, .kind = kind, .exit_code = code, .signal = sig, .text = (char *)text};
    return hvd_client_call(c, &hvd_task_event_desc, &m, &hvd_ack_desc, NULL, 0, 0, err);
}

/* hvd_driver_failure's sentence (kind in *kind) for the results so far. */
static const char *failure_of(hvd_driver *d, hvd_failure_kind *kind, char *buf, size_t cap) {
    hvd_rank_result *r;
    size_t n;
    hvd_err err;
    *kind = HVD_FAILURE_NONE;
    buf[0] = '\0';
    if (hvd_driver_results(d, &r, &n, &err) != 0) return buf;
    *kind = hvd_driver_failure(d, r, n, buf, cap);
    hvd_driver_results_free(r, n);
    return buf;
}

static bool host_list_is(hvd_driver *d, const char *want) {
    hvd_err err;
    char *hl = hvd_driver_host_list(d, &err);
    bool ok = hl && strcmp(hl, want) == 0;
    if (!ok) fprintf(stderr, "  host list: got %s, want %s\n", hl ? hl : err.msg, want);
    free(hl);
    return ok;
}

/* ---- Registration -------------------------------------------------------------------------- */

#define NTASKS 16
/* Two tasks per host; task 0's host ("exec-d") does not sort first. */
static const char *const host_of[NTASKS / 2] = {"exec-d", "exec-a", "exec-f", "exec-b",
                                                "exec-h", "exec-c", "exec-g", "exec-e"};

typedef struct reg_arg {
    hvd_driver *d;
    uint32_t index;
    pthread_barrier_t *go;
    int rc;
    hvd_err err;
} reg_arg;

static void *register_thread(void *p) {
    reg_arg *a = p;
    hvd_client *c = driver_connect(a->d, &a->err);
    pthread_barrier_wait(a->go);
    a->rc =
        c ? register_task(c, a->index, host_of[a->index / 2], (uint16_t)(5000 + a->index), &a->err)
          : -1;
    hvd_client_close(c);
    return NULL;
}

static void test_register_many(void) {
    logcap lc;
    logcap_init(&lc);
    hvd_driver *d = start_driver(NTASKS, &lc, NULL, NULL);
    if (!d) return;
    pthread_t th[NTASKS];
    reg_arg args[NTASKS];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NTASKS);
    for (uint32_t i = 0; i < NTASKS; i++) {
        args[i] = (reg_arg){.d = d, .index = i, .go = &go};
        pthread_create(&th[i], NULL, register_thread, &args[i]);
    }
    hvd_err err;
    int rc = hvd_driver_wait_registration(d, 10000, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    for (uint32_t i = 0; i < NTASKS; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(args[i].rc == 0, "task %u: %s", i, args[i].err.msg);
    }
    pthread_barrier_destroy(&go);
    CHECK(LOG_HAS(&lc, "16/16 tasks registered"));
    /* Sorted a..h, rotated so that exec-d (task 0's) comes first. */
    const char *full = "exec-d:2,exec-e:2,exec-f:2,exec-g:2,exec-h:2,exec-a:2,exec-b:2,exec-c:2";
    CHECK(host_list_is(d, full));

    hvd_client *c = driver_client(d);
    if (!c) goto out;
    char buf[128];
    CHECK(host_indices(c, "exec-d", buf, sizeof buf, &err) == 0 && strcmp(buf, "0,1") == 0);
    CHECK(host_indices(c, "exec-f", buf, sizeof buf, &err) == 0 && strcmp(buf, "4,5") == 0);

    /* The same registration again (a retry, a Spark task retry): replaced, not duplicated. */
    for (int k = 0; k < 3; k++)
        CHECK(register_task(c, 5, "exec-f", 6005, &err) == 0);
    CHECK(host_list_is(d, full));
    CHECK(host_indices(c, "exec-f", buf, sizeof buf, &err) == 0 && strcmp(buf, "4,5") == 0);
    CHECK(LOG_HAS(&lc, "task 5 registered again", "replaced"));
    hvd_addrs_msg am;
    hvd_index_msg ir = {.index = 5};
    CHECK(hvd_client_call(c, &hvd_task_addrs_desc, &ir, &hvd_addrs_desc, &am, 0, 0, &err) == 0);
    CHECK(am.addrs.n == 1 && ((hvd_addr *)am.addrs.v)[0].port == 6005);
    hvd_msg_free(&hvd_addrs_desc, &am);

    /* Re-registration under another host hash moves the task. */
    CHECK(register_task(c, 5, "exec-zz", 6005, &err) == 0);
    CHECK(host_list_is(d, "exec-d:2,exec-e:2,exec-f:1,exec-g:2,exec-h:2,exec-zz:1,exec-a:2,"
                          "exec-b:2,exec-c:2"));
    CHECK(host_indices(c, "exec-f", buf, sizeof buf, &err) == 0 && strcmp(buf, "4") == 0);
    CHECK(host_indices(c, "exec-zz", buf, sizeof buf, &err) == 0 && strcmp(buf, "5") == 0);
    CHECK(LOG_HAS(&lc, "warning: task 5 registered again from host exec-zz",
                  "replacing its entry from host exec-f", "do two executors use index 5?"));
    /* Moving back empties exec-zz, which then disappears from the list. */
    CHECK(register_task(c, 5, "exec-f", 5005, &err) == 0);
    CHECK(host_list_is(d, full));
    CHECK(host_indices(c, "exec-zz", buf, sizeof buf, &err) == -1 && err.code == HVD_E_NOT_FOUND);

    /* TASK_INFO and the library's copy carry the whole entry. */
    hvd_task_info ti;
    hvd_index_msg i7 = {.index = 7};
    CHECK(hvd_client_call(c, &hvd_task_info_req_desc, &i7, &hvd_task_info_desc, &ti, 0, 0, &err) ==
          0);
    CHECK(ti.index == 7 && strcmp(ti.host_hash, "exec-b") == 0);
    CHECK(ti.gpus.n == 2 && strcmp(ti.gpus.v[1], "1") == 0);
    CHECK(ti.work_dir && strcmp(ti.work_dir, "/tmp/work-7") == 0);
    CHECK(ti.addrs.n == 1 && ((hvd_addr *)ti.addrs.v)[0].port == 5007);
    hvd_msg_free(&hvd_task_info_desc, &ti);
    CHECK(hvd_driver_task(d, 7, &ti, &err) == 0 && strcmp(ti.host_hash, "exec-b") == 0 &&
          ti.addrs.n == 1);
    hvd_msg_free(&hvd_task_info_desc, &ti);
    CHECK(hvd_driver_task(d, 16, &ti, &err) == -1 && err.code == HVD_E_INVALID);
    hvd_client_close(c);
out:
    hvd_driver_stop(d);
    logcap_free(&lc);
}

static void test_register_refused(void) {
    logcap lc;
    logcap_init(&lc);
    hvd_driver *d = start_driver(4, &lc, NULL, NULL);
    if (!d) return;
    hvd_client *c = driver_client(d);
    if (!c) {
        hvd_driver_stop(d);
        return;
    }
    hvd_err err;
    CHECK(register_task(c, 7, "hostA", 4000, &err) == -1);
    CHECK(err.code == HVD_E_INVALID);
    CHECK_MSG(strstr(err.msg, "task index 7 is outside 0..3: do the driver and the tasks agree "
                              "on the number of tasks?") != NULL,
              "%s", err.msg);
    CHECK(register_task(c, 1, "host.with.dots", 4000, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(strstr(err.msg, "host.with.dots") != NULL);
    CHECK(register_task(c, 1, "", 4000, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(register_addrs(c, 1, "hostA", NULL, 0, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(strstr(err.msg, "no addresses") != NULL);
    CHECK(register_task(c, 1, "hostA", 0, &err) == -1 && err.code == HVD_E_INVALID);
    /* None of those counted. */
    CHECK(hvd_driver_wait_registration(d, 0, &err) == -1 && strstr(err.msg, "0 of 4"));

    /* A task that declares only an address it did not connect from: accepted, with a NAT
     * warning; the driver keeps the declared addresses. */
    hvd_addr nat = {.ifname = "eth0", .host = "10.9.8.7", .port = 4100};
    CHECK(register_addrs(c, 0, "hostA", &nat, 1, &err) == 0);
    CHECK(LOG_HAS(&lc, "warning: task 0 registered from 127.0.0.1", "10.9.8.7:4100", "NAT"));
    hvd_addrs_msg am;
    hvd_index_msg i0 = {.index = 0}, i3 = {.index = 3}, i9 = {.index = 9};
    CHECK(hvd_client_call(c, &hvd_task_addrs_desc, &i0, &hvd_addrs_desc, &am, 0, 0, &err) == 0);
    CHECK(am.addrs.n == 1 && strcmp(((hvd_addr *)am.addrs.v)[0].host, "10.9.8.7") == 0);
    hvd_msg_free(&hvd_addrs_desc, &am);
    /* A task registering from one of its declared addresses gives no warning. */
    CHECK(register_task(c, 1, "hostA", 4001, &err) == 0);
    CHECK(!LOG_HAS(&lc, "warning: task 1"));

    /* Unknown task, unknown host: clear errors, and the connection keeps working. */
    CHECK(hvd_client_call(c, &hvd_task_addrs_desc, &i3, &hvd_addrs_desc, &am, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_NOT_FOUND);
    CHECK_MSG(strstr(err.msg, "task 3 has not registered") != NULL, "%s", err.msg);
    hvd_task_info ti;
    CHECK(hvd_client_call(c, &hvd_task_info_req_desc, &i3, &hvd_task_info_desc, &ti, 0, 0, &err) ==
              -1 &&
          err.code == HVD_E_NOT_FOUND);
    CHECK(hvd_client_call(c, &hvd_task_addrs_desc, &i9, &hvd_addrs_desc, &am, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_INVALID);
    char buf[64];
    CHECK(host_indices(c, "hostB", buf, sizeof buf, &err) == -1);
    CHECK(err.code == HVD_E_NOT_FOUND);
    CHECK_MSG(strstr(err.msg, "no task registered with host hash \"hostB\"") &&
                  strstr(err.msg, "2 of 4") && strstr(err.msg, "HOROVOD_HOSTNAME"),
              "%s", err.msg);
    CHECK(host_indices(c, "hostA", buf, sizeof buf, &err) == 0 && strcmp(buf, "0,1") == 0);

    /* Before registration is complete there is no host list and no interface round. */
    CHECK(hvd_driver_host_list(d, &err) == NULL && err.code == HVD_E_STATE);
    char **ifs;
    CHECK(hvd_driver_common_interfaces(d, 1000, &ifs, &err) == -1 && err.code == HVD_E_STATE);
    hvd_client_close(c);
    hvd_driver_stop(d);
    logcap_free(&lc);
}

static void test_addrs(void) {
    hvd_err err;
    hvd_addr *a = NULL;
    size_t n = 0;
    /* Bound to one address: that one only, with its interface's name. */
    hvd_driver *d = start_driver(1, NULL, NULL, NULL);
    CHECK(d && hvd_driver_addrs(d, &a, &n, &err) == 0);
    CHECK(n == 1 && strcmp(a[0].host, "127.0.0.1") == 0 && strcmp(a[0].ifname, "lo") == 0 &&
          a[0].port != 0);
    free(a);
    hvd_driver_stop(d);
    /* Listening everywhere: every interface, loopback included, all on one port. */
    hvd_driver_config cfg = {.num_tasks = 1, .secret = g_secret};
    d = hvd_driver_start(&cfg, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    CHECK(d && hvd_driver_addrs(d, &a, &n, &err) == 0 && n >= 1);
    bool lo = false, same_port = true;
    for (size_t i = 0; d && i < n; i++) {
        lo |= strcmp(a[i].host, "127.0.0.1") == 0;
        same_port &= a[i].port == a[0].port;
    }
    CHECK(lo && same_port);
    free(a);
    hvd_driver_stop(d);
}

static void test_report_errors(void) {
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    if (!d) return;
    hvd_client *c = driver_client(d);
    hvd_err err;
    hvd_addr a = {.ifname = "lo", .host = "127.0.0.1", .port = 4000};
    hvd_reach reach[1] = {{.to = 1, .addrs = {&a, 1}}};
    hvd_reachable_msg m = {.from = 0, .reach = {reach, 1}};
    /* Before registering. */
    CHECK(c && hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, 0, &err) == -1);
    CHECK_MSG(err.code == HVD_E_STATE && strstr(err.msg, "before registering"), "%s", err.msg);
    CHECK(c && register_task(c, 0, "h", 4000, &err) == 0);
    CHECK(c && hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, 0, &err) == 0);
    m.from = 4;
    CHECK(c && hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_INVALID && strstr(err.msg, "from task 4"));
    m.from = 0;
    reach[0].to = 9;
    CHECK(c && hvd_client_call(c, &hvd_reachable_desc, &m, &hvd_ack_desc, NULL, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_INVALID && strstr(err.msg, "reaching task 9"));
    /* A body of the wrong shape is a protocol error, and the service goes on. */
    hvd_index_msg wrong = {.index = 1};
    static const hvd_msg_desc register_as_index =
        HVD_MSG(HVD_MSG_REGISTER_TASK, "register_task", hvd_index_msg, index_fields_for_test);
    CHECK(c &&
          hvd_client_call(c, &register_as_index, &wrong, &hvd_ack_desc, NULL, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_PROTOCOL);
    CHECK(c && register_task(c, 1, "h", 4001, &err) == 0);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

/* ---- Waiting for registration ------------------------------------------------------------- */

typedef struct late_arg {
    hvd_driver *d;
    int delay_ms;
    uint32_t from, to; /* registers tasks from..to-1 after delay_ms */
    int failures;
} late_arg;

static void *late_register(void *p) {
    late_arg *a = p;
    usleep((useconds_t)a->delay_ms * 1000);
    hvd_err err;
    hvd_client *c = driver_connect(a->d, &err);
    for (uint32_t i = a->from; i < a->to; i++)
        if (!c || register_task(c, i, "late", 4000, &err) != 0) a->failures++;
    hvd_client_close(c);
    return NULL;
}

static void *abort_later(void *p) {
    usleep(150 * 1000);
    hvd_driver_abort(p, "the Spark job failed");
    return NULL;
}

static void test_wait_registration(void) {
    logcap lc;
    logcap_init(&lc);
    hvd_driver *d = start_driver(8, &lc, NULL, NULL);
    if (!d) return;
    hvd_client *c = driver_client(d);
    hvd_err err;
    const uint32_t some[] = {0, 1, 2, 6};
    for (size_t i = 0; i < 4; i++)
        CHECK(c && register_task(c, some[i], "h", 4000, &err) == 0);
    int64_t t0 = test_now_ms();
    CHECK(hvd_driver_wait_registration(d, 300, &err) == -1);
    int64_t took = test_now_ms() - t0;
    fprintf(stderr, "  error: %s\n", err.msg);
    CHECK(err.code == HVD_E_TIMEOUT);
    CHECK_MSG(strstr(err.msg, "4 of 8 registered") && strstr(err.msg, "missing task(s) 3-5,7") &&
                  strstr(err.msg, "are the executors running hvd-task with the right --driver "
                                  "address and secret?"),
              "%s", err.msg);
    CHECK_MSG(took >= 290 && took < 2000, "took %lld ms", (long long)took);
    CHECK(LOG_HAS(&lc, "4/8 tasks registered"));

    /* The rest arrive while waiting: the wait returns as soon as the last one is in. */
    late_arg la = {.d = d, .delay_ms = 200, .from = 3, .to = 6};
    late_arg lb = {.d = d, .delay_ms = 300, .from = 7, .to = 8};
    pthread_t a, b;
    pthread_create(&a, NULL, late_register, &la);
    pthread_create(&b, NULL, late_register, &lb);
    t0 = test_now_ms();
    CHECK_MSG(hvd_driver_wait_registration(d, 10000, &err) == 0, "%s", err.msg);
    took = test_now_ms() - t0;
    CHECK_MSG(took < 3000, "took %lld ms", (long long)took);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK(la.failures == 0 && lb.failures == 0);
    CHECK(LOG_HAS(&lc, "8/8 tasks registered"));
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* Abort (the cluster job failed) wakes a wait without limit. */
    d = start_driver(2, NULL, NULL, NULL);
    if (!d) goto out;
    pthread_t ab;
    pthread_create(&ab, NULL, abort_later, d);
    CHECK(hvd_driver_wait_registration(d, -1, &err) == -1);
    CHECK_MSG(err.code == HVD_E_STATE && strstr(err.msg, "the Spark job failed"), "%s", err.msg);
    pthread_join(ab, NULL);
    hvd_driver_stop(d);
out:
    logcap_free(&lc);
}

static void test_ranges(void) {
    char buf[64];
    drv_format_ranges(NULL, 0, buf, sizeof buf);
    CHECK(strcmp(buf, "") == 0);
    const uint32_t a[] = {3, 4, 5, 7};
    drv_format_ranges(a, 4, buf, sizeof buf);
    CHECK(strcmp(buf, "3-5,7") == 0);
    const uint32_t b[] = {0, 2, 4, 5, 9, 10, 11, 12};
    drv_format_ranges(b, 8, buf, sizeof buf);
    CHECK(strcmp(buf, "0,2,4-5,9-12") == 0);
    /* Too many to fit: as many as fit, then ",..." and never a cut number. */
    uint32_t many[200];
    for (uint32_t i = 0; i < 200; i++)
        many[i] = 1000 + 2 * i;
    char small[40];
    drv_format_ranges(many, 200, small, sizeof small);
    CHECK_MSG(strlen(small) < sizeof small && strcmp(small + strlen(small) - 4, ",...") == 0, "%s",
              small);
    CHECK(strncmp(small, "1000,1002,1004,", 15) == 0);
}

/* ---- Ranks, entry point, results ------------------------------------------------------------ */

/* Tasks 0 and 2 on hx, 1 and 3 on hy. */
static hvd_client *register_xy(hvd_driver *d) {
    hvd_client *c = driver_client(d);
    hvd_err err;
    for (uint32_t i = 0; c && i < 4; i++)
        CHECK(register_task(c, i, i % 2 ? "hy" : "hx", (uint16_t)(4000 + i), &err) == 0);
    CHECK(hvd_driver_wait_registration(d, 5000, &err) == 0);
    return c;
}

static void test_ranks(void) {
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    if (!d) return;
    hvd_client *c = register_xy(d);
    if (!c) goto out;
    CHECK(host_list_is(d, "hx:2,hy:2"));
    hvd_err err;
    uint32_t idx = 99;
    CHECK(set_local_rank(c, "hx", 0, 0, &idx, &err) == 0 && idx == 0);
    CHECK(set_local_rank(c, "hx", 1, 1, &idx, &err) == 0 && idx == 2);
    CHECK(set_local_rank(c, "hy", 0, 2, &idx, &err) == 0 && idx == 1);
    CHECK(set_local_rank(c, "hy", 1, 3, &idx, &err) == 0 && idx == 3);
    CHECK(index_by_rank(c, 1, &idx, &err) == 0 && idx == 2);
    CHECK(index_by_rank(c, 2, &idx, &err) == 0 && idx == 1);
    /* The same call again is harmless. */
    CHECK(set_local_rank(c, "hx", 1, 1, &idx, &err) == 0 && idx == 2);
    CHECK(index_by_rank(c, 1, &idx, &err) == 0 && idx == 2);

    /* Errors. */
    CHECK(set_local_rank(c, "hx", 2, 1, &idx, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK_MSG(strstr(err.msg, "local rank 2 is outside 0..1") != NULL, "%s", err.msg);
    CHECK(set_local_rank(c, "hx", 0, 4, &idx, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK_MSG(strstr(err.msg, "rank 4 is outside 0..3") != NULL, "%s", err.msg);
    CHECK(set_local_rank(c, "hz", 0, 0, &idx, &err) == -1 && err.code == HVD_E_NOT_FOUND);
    CHECK(index_by_rank(c, 4, &idx, &err) == -1 && err.code == HVD_E_INVALID);

    /* Remapping task 2 (hx, local rank 1) to rank 3 unmaps rank 1 and frees task 3. */
    CHECK(set_local_rank(c, "hx", 1, 3, &idx, &err) == 0 && idx == 2);
    CHECK(index_by_rank(c, 3, &idx, &err) == 0 && idx == 2);
    CHECK(index_by_rank(c, 1, &idx, &err) == -1 && err.code == HVD_E_NOT_FOUND);
    CHECK_MSG(strstr(err.msg, "rank 1 is not mapped to a task") != NULL, "%s", err.msg);
    hvd_client_close(c);
out:
    hvd_driver_stop(d);
}

/* A whole file in a malloc'd buffer, or NULL. */
static uint8_t *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (f) fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

/* Starting a driver with this shared-object entry point fails with a message holding want
 * (NULL: it starts). */
static void entry_refused(const uint8_t *object, size_t len, const char *symbol, const char *want) {
    hvd_code_msg code = {.kind = HVD_CODE_SHARED_OBJECT,
                         .object = {(uint8_t *)object, len},
                         .symbol = (char *)symbol};
    hvd_driver_config cfg = {.num_tasks = 1, .secret = g_secret, .code = &code};
    hvd_err err = {0};
    hvd_driver *d = hvd_driver_start(&cfg, &err);
    if (!want) {
        CHECK_MSG(d != NULL, "%s: %s", symbol, err.msg);
    } else {
        CHECK_MSG(d == NULL && err.code == HVD_E_INVALID && strstr(err.msg, want), "%s: %s", symbol,
                  d ? "(started)" : err.msg);
    }
    hvd_driver_stop(d);
}

/* A shared-object entry point is checked at start, before any task could fetch it: an ELF
 * shared object exporting a function of that name. */
static void test_entry_check(void) {
    size_t len, exe_len;
    uint8_t *so = read_whole(ENTRY_FIXTURE, &len);
    uint8_t *exe = read_whole("/proc/self/exe", &exe_len);
    CHECK(so && exe);
    if (!so || !exe) goto out;
    entry_refused(so, len, "train_fn", NULL);
    entry_refused(so, len, "no_such_fn", "exports no function named 'no_such_fn': check the name");
    entry_refused(so, len, "hidden_fn", "exports no function named 'hidden_fn'");
    entry_refused(so, len, "train_var", "'train_var' is not a function");
    entry_refused(so, len, "cxx_train", "only similar names (_Z9cxx_trainv): declare it extern");
    entry_refused(exe, exe_len, "main", "is a program, not a shared object");
    entry_refused((const uint8_t *)"#!/bin/sh\necho hi\n", 18, "x", "not an ELF shared object");
    entry_refused(so, 64, "train_fn", "ELF");   /* cut short: the header only */
    for (size_t i = 0; i < 300 && i < len; i++) /* junk after a good header */
        so[len / 2 + i] ^= 0x5a;
    hvd_code_msg code = {.kind = HVD_CODE_SHARED_OBJECT, .object = {so, len}, .symbol = "x"};
    hvd_driver_config cfg = {.num_tasks = 1, .secret = g_secret, .code = &code};
    hvd_err err;
    hvd_driver *d = hvd_driver_start(&cfg, &err); /* either way, no crash */
    hvd_driver_stop(d);
out:
    free(so);
    free(exe);
}

static hvd_client *register_xy(hvd_driver *d);

/* The part that failed first on its own is named, in the order things reached the driver:
 * stopped ranks never; an orted killed before a rank failed; weak notes (an agent's death)
 * only when nothing else explains; a silent rank last. */
static void test_failure(void) {
    char buf[HVD_ERR_MAX * 2];
    hvd_failure_kind kind;
    hvd_err err;
    uint32_t idx;
    /* 1. Ranks 0-2 stopped by orted, rank 3 silent: rank 3 is named (killed outright). */
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    hvd_client *c = d ? register_xy(d) : NULL;
    for (uint32_t r = 0; c && r < 4; r++)
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    CHECK(failure_of(d, &kind, buf, sizeof buf) && kind == HVD_FAILURE_NONE && !buf[0]);
    for (int32_t r = 0; c && r < 3; r++)
        CHECK(report_stopped(c, r, (uint32_t)r, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_SILENT_RANK && strstr(buf, "rank 3 (task ") &&
                  strstr(buf, "ended without reporting a result"),
              "%s", buf);
    /* An agent that went away without a word is named before a silent rank; before that, a
     * host whose agent never came while another's did. */
    hvd_client *agent = driver_client(d);
    hvd_agent_msg w = {.host_hash = "hy", .pid = 4242};
    CHECK(agent && hvd_client_send(agent, &hvd_agent_watch_desc, &w, &err) == 0);
    usleep(100 * 1000);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT && strstr(buf, "agent of host hx (hvd-rsh) never reached "
                                                       "the driver, while 1 of 2"),
              "%s", buf);
    hvd_client *agent2 = driver_client(d);
    hvd_agent_msg w2 = {.host_hash = "hx", .pid = 4343};
    hvd_agent_report_msg done = {.host_hash = "hx", .pid = 4343, .index = 0, .started = true};
    CHECK(agent2 && hvd_client_send(agent2, &hvd_agent_watch_desc, &w2, &err) == 0);
    CHECK(agent2 && hvd_client_call(agent2, &hvd_agent_report_desc, &done, &hvd_ack_desc, NULL, 0,
                                    0, &err) == 0);
    hvd_client_close(agent2); /* it reported: its close is no death */
    hvd_client_close(agent);  /* this one did not */
    usleep(100 * 1000);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT && strstr(buf, "agent of host hy (hvd-rsh, pid 4242) went "
                                                       "away without reporting"),
              "%s", buf);
    /* A strong note that came later still wins over a weak one: orted killed. */
    CHECK(task_event(c, 1, HVD_TASK_EV_COMMAND_ENDED, 137, 9, NULL, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT && strstr(buf, "orted of host hy (in task 1) was killed "
                                                       "by signal 9"),
              "%s", buf);
    /* A rank's own failure after it does not. */
    CHECK(report_result(c, 3, 3, 1, "", "boom", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(strstr(buf, "orted of host hy"), "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* 2. A rank fails on its own first, then a task service says it is ending: the rank. */
    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    for (uint32_t r = 0; c && r < 4; r++)
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    CHECK(report_result(c, 2, 2, 3, "", "RuntimeError: boom", &err) == 0);
    CHECK(task_event(c, 0, HVD_TASK_EV_ENDING, 0, 0, "it was told to stop", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_RANK && strstr(buf, "rank 2 (task 2 on hx) exited with status 3: "
                                                      "RuntimeError: boom"),
              "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* 3. The task service first: it is named, as ending early, with its host. */
    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    CHECK(task_event(c, 2, HVD_TASK_EV_ENDING, 0, 0, "it was told to stop", &err) == 0);
    CHECK(report_result(c, 0, 0, 1, "", "lost my peer", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_TASK && strstr(buf, "task 2 (host hx at 127.0.0.1) ended while "
                                                      "the job ran: it was told to stop"),
              "%s", buf);
    CHECK(hvd_driver_lost_tasks(d) == 1);
    /* A task that says DONE is not lost when its watch closes. */
    CHECK(task_event(c, 3, HVD_TASK_EV_DONE, 0, 0, NULL, &err) == 0);
    CHECK(task_event(c, 9, HVD_TASK_EV_DONE, 0, 0, NULL, &err) == -1 && err.code == HVD_E_INVALID);
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* 4. A daemon its shell could not find (exit status 127: the executor lacks the MPI): one
     * line naming the daemon, the host and what to do, before an earlier weak note (another
     * daemon's exit status); in the words of the jobs' MPI (Open MPI 4's orted until a launch
     * set another). */
    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    CHECK(d && hvd_driver_mpi(d) == HVD_MPI_AUTO);
    CHECK(task_event(c, 0, HVD_TASK_EV_COMMAND_ENDED, 1, 0, NULL, &err) == 0);
    CHECK(task_event(c, 1, HVD_TASK_EV_COMMAND_ENDED, 127, 0, NULL, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT &&
                  strstr(buf, "orted could not start on host hy (task 1): that executor has no "
                              "orted on its PATH (its shell could not find it: exit status 127)") &&
                  strstr(buf, "install Open MPI (the version of the driver's mpirun) on every "
                              "executor, or give mpirun --prefix"),
              "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);
    /* MPICH: Hydra runs hydra_pmi_proxy by the path the driver's mpiexec has. */
    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    if (d) hvd_driver_set_mpi(d, HVD_MPI_MPICH);
    CHECK(d && hvd_driver_mpi(d) == HVD_MPI_MPICH);
    CHECK(task_event(c, 0, HVD_TASK_EV_COMMAND_ENDED, 127, 0, NULL, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT &&
                  strstr(buf, "hydra_pmi_proxy could not start on host hx (task 0): that executor "
                              "has no hydra_pmi_proxy where the driver's mpiexec has it") &&
                  strstr(buf, "install the driver's MPI (MPICH or Intel MPI) on every executor"),
              "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);
    /* Open MPI 5, a prted that is there but cannot run (126); its other notes name prted. */
    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    if (d) hvd_driver_set_mpi(d, HVD_MPI_OPENMPI5);
    CHECK(task_event(c, 1, HVD_TASK_EV_COMMAND_ENDED, 126, 0, NULL, &err) == 0);
    CHECK(task_event(c, 0, HVD_TASK_EV_COMMAND_ENDED, 137, 9, NULL, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_AGENT &&
                  strstr(buf, "prted could not start on host hy (task 1): that executor's shell "
                              "found prted but could not run it (exit status 126"),
              "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);
    CHECK(strcmp(hvd_mpi_daemon(HVD_MPI_OPENMPI4), "orted") == 0 &&
          strcmp(hvd_mpi_daemon(HVD_MPI_OPENMPI5), "prted") == 0 &&
          strcmp(hvd_mpi_daemon(HVD_MPI_MPICH), "hydra_pmi_proxy") == 0);
}

/* Silent ranks: the one whose RANK_WATCH connection closed first is named (rank 3 killed,
 * rank 0 SIGKILLed by orted a moment later), not the lowest; a rank that reported before its
 * connection closed is no silent rank; a watch of an earlier job is stale. */
static void test_silent_order(void) {
    char buf[HVD_ERR_MAX * 2];
    hvd_failure_kind kind;
    hvd_err err;
    uint32_t idx;
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    hvd_client *c = d ? register_xy(d) : NULL;
    hvd_client *rank[4] = {NULL};
    for (uint32_t r = 0; c && r < 4; r++) {
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
        rank[r] = driver_client(d);
        hvd_rank_msg w = {.rank = r};
        CHECK(rank[r] && hvd_client_send(rank[r], &hvd_rank_watch_desc, &w, &err) == 0);
    }
    hvd_client *bad = driver_client(d);
    hvd_rank_msg out = {.rank = 9};
    CHECK(bad &&
          hvd_client_call(bad, &hvd_rank_watch_desc, &out, &hvd_ack_desc, NULL, 5000, 0, &err) !=
              0 &&
          err.code == HVD_E_INVALID && strstr(err.msg, "RANK_WATCH for rank 9, outside 0..3"));
    hvd_client_close(bad);
    usleep(100 * 1000);
    CHECK(rank[2] && report_stopped(rank[2], 2, 2, &err) == 0);
    hvd_client_close(rank[2]); /* reported, then ended: no silent rank */
    hvd_client_close(rank[3]); /* killed outright */
    usleep(100 * 1000);
    CHECK(rank[1] && report_stopped(rank[1], 1, 1, &err) == 0);
    hvd_client_close(rank[1]);
    hvd_client_close(rank[0]); /* SIGKILLed by orted after its SIGTERM went unanswered */
    usleep(100 * 1000);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_SILENT_RANK &&
                  strstr(buf, "rank 3 (task 3 on hy) ended without reporting a result (the first "
                              "rank to go silently)"),
              "%s", buf);
    /* The next job (serve): its ranks start unseen; a watch left from the last one is stale.
     * These one-shot tasks were spent (ranks ran in them): new ones register. */
    CHECK(d && hvd_driver_next_job(d, &err) == 0 && hvd_driver_registered(d) == 0);
    hvd_client_close(c);
    c = d ? register_xy(d) : NULL;
    hvd_client *old = driver_client(d);
    hvd_rank_msg w1 = {.rank = 1};
    CHECK(old && hvd_client_send(old, &hvd_rank_watch_desc, &w1, &err) == 0);
    usleep(100 * 1000);
    CHECK(d && hvd_driver_next_job(d, &err) == 0 && hvd_driver_registered(d) == 4);
    for (uint32_t r = 0; c && r < 4; r++)
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    hvd_client_close(old);
    usleep(100 * 1000);
    CHECK(report_stopped(c, 0, 0, &err) == 0 && report_stopped(c, 2, 2, &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_SILENT_RANK &&
                  strstr(buf, "rank 1 (task 1 on hy) ended without reporting a result while other "
                              "ranks reported theirs"),
              "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

/* REGISTER_TASK of task `index` on host, elastic or not. */
static int register_kind(hvd_client *c, uint32_t index, const char *host, bool elastic,
                         hvd_err *err) {
    hvd_addr a = {.ifname = "lo", .host = "127.0.0.1", .port = (uint16_t)(4100 + index)};
    hvd_task_info info = {
        .index = index, .host_hash = (char *)host, .addrs = {&a, 1}, .elastic = elastic};
    return hvd_client_call(c, &hvd_register_task_desc, &info, &hvd_ack_desc, NULL, 0, 0, err);
}

/* Between jobs the driver lets the spent one-shot task services go (answers their
 * WAIT_SHUTDOWN: none is lost) and forgets them; elastic ones stay, and so does a one-shot
 * task service that registered anew at a spent index before the next job. */
static void test_next_job_release(void) {
    hvd_err err;
    uint32_t idx;
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    hvd_client *c = d ? driver_client(d) : NULL;
    hvd_client *w[4] = {NULL};
    for (uint32_t i = 0; c && i < 4; i++) {
        CHECK(register_kind(c, i, i % 2 ? "hy" : "hx", i < 2, &err) == 0);
        hvd_index_msg me = {.index = i};
        w[i] = driver_client(d);
        CHECK(w[i] && hvd_client_send(w[i], &hvd_wait_shutdown_desc, &me, &err) == 0);
    }
    CHECK(d && hvd_driver_wait_registration(d, 5000, &err) == 0);
    for (uint32_t r = 0; c && r < 3; r++) /* rank 3 never came: task 3 is not spent */
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    for (int i = 0; i < 50 && d && drv_held_count(d) < 4; i++)
        usleep(20 * 1000);
    CHECK(d && drv_held_count(d) == 4);
    CHECK(d && hvd_driver_next_job(d, &err) == 0);
    CHECK_MSG(d && hvd_driver_registered(d) == 3 && drv_held_count(d) == 3, "%u registered",
              d ? hvd_driver_registered(d) : 0);
    hvd_client_close(w[2]); /* task 2 ends, as told: it is not lost */
    w[2] = NULL;
    usleep(100 * 1000);
    CHECK(d && hvd_driver_lost_tasks(d) == 0);
    CHECK(c && register_kind(c, 2, "hx", false, &err) == 0);
    CHECK(d && hvd_driver_wait_registration(d, 5000, &err) == 0);
    CHECK(d && hvd_driver_next_job(d, &err) == 0 && hvd_driver_registered(d) == 4);
    /* Task 3 (one-shot) ran its command this time, though no rank came (mpirun failed
     * first): spent all the same; task 2 (one-shot, unused) stays. */
    CHECK(c && task_event(c, 3, HVD_TASK_EV_COMMAND_STARTED, 0, 0, NULL, &err) == 0);
    CHECK(d && hvd_driver_next_job(d, &err) == 0);
    CHECK_MSG(d && hvd_driver_registered(d) == 3, "%u registered after task 3's command",
              d ? hvd_driver_registered(d) : 0);
    for (uint32_t i = 0; i < 4; i++)
        hvd_client_close(w[i]);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

static void test_code(void) {
    hvd_err err;
    /* A command. */
    char *argv[] = {"python3", "train.py", "--epochs=3"};
    hvd_code_msg code = {.kind = HVD_CODE_ARGV, .argv = {argv, 3}};
    hvd_driver *d = start_driver(1, NULL, &code, NULL);
    argv[1] = "changed-after-start.py"; /* the driver keeps its own copy */
    hvd_client *c = d ? driver_client(d) : NULL;
    hvd_code_msg r;
    CHECK(c && hvd_client_call(c, &hvd_code_req_desc, NULL, &hvd_code_desc, &r, 0, 0, &err) == 0);
    if (c) {
        CHECK(r.kind == HVD_CODE_ARGV && r.argv.n == 3);
        CHECK(r.argv.n == 3 && strcmp(r.argv.v[1], "train.py") == 0 &&
              strcmp(r.argv.v[2], "--epochs=3") == 0);
        hvd_msg_free(&hvd_code_desc, &r);
    }
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* A shared object: its bytes, symbol and argument come back exactly, every time. */
    size_t len;
    uint8_t *so = read_whole(ENTRY_FIXTURE, &len);
    CHECK(so != NULL);
    if (!so) return;
    hvd_code_msg so_code = {.kind = HVD_CODE_SHARED_OBJECT,
                            .object = {so, len},
                            .symbol = "train_fn",
                            .arg = {(uint8_t *)"\x01\x00\x02", 3}};
    d = start_driver(1, NULL, &so_code, NULL);
    c = d ? driver_client(d) : NULL;
    for (int k = 0; c && k < 3; k++) {
        CHECK(hvd_client_call(c, &hvd_code_req_desc, NULL, &hvd_code_desc, &r, 0, 0, &err) == 0);
        CHECK(r.kind == HVD_CODE_SHARED_OBJECT && r.object.len == len &&
              memcmp(r.object.data, so, len) == 0);
        CHECK(r.symbol && strcmp(r.symbol, "train_fn") == 0);
        CHECK(r.arg.len == 3 && memcmp(r.arg.data, "\x01\x00\x02", 3) == 0);
        hvd_msg_free(&hvd_code_desc, &r);
    }
    hvd_client_close(c);
    hvd_driver_stop(d);
    free(so);

    /* No entry point: a clear error. */
    d = start_driver(1, NULL, NULL, NULL);
    c = d ? driver_client(d) : NULL;
    CHECK(c && hvd_client_call(c, &hvd_code_req_desc, NULL, &hvd_code_desc, &r, 0, 0, &err) == -1);
    CHECK(err.code == HVD_E_NOT_FOUND && strstr(err.msg, "without an entry point"));
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* A payload larger than a default frame (80 MiB): a client that raised its limit for the
     * call gets it whole, one with the default limit is refused with the frame's size. */
    size_t big_len = (size_t)80 << 20;
    uint8_t *big = malloc(big_len);
    CHECK(big != NULL);
    if (!big) return;
    for (size_t i = 0; i < big_len; i++)
        big[i] = (uint8_t)(i * 131 >> 7);
    char *py[] = {"python3", "-m", "hvd_bridge._rank"};
    hvd_code_msg big_code = {.kind = HVD_CODE_ARGV_IO, .argv = {py, 3}, .object = {big, big_len}};
    d = start_driver(1, NULL, &big_code, NULL);
    c = d ? driver_client(d) : NULL;
    CHECK(c && hvd_client_call(c, &hvd_code_req_desc, NULL, &hvd_code_desc, &r, 0, 0, &err) == -1);
    CHECK_MSG(strstr(err.msg, "exceeds the maximum of 67108864 bytes"), "%s", err.msg);
    hvd_client_close(c);
    c = d ? driver_client(d) : NULL;
    if (c) hvd_client_set_max_frame(c, HVD_CODE_MAX_FRAME);
    CHECK(c && hvd_client_call(c, &hvd_code_req_desc, NULL, &hvd_code_desc, &r, 0, 0, &err) == 0);
    if (c) {
        CHECK(r.kind == HVD_CODE_ARGV_IO && r.object.len == big_len &&
              memcmp(r.object.data, big, big_len) == 0);
        hvd_msg_free(&hvd_code_desc, &r);
    }
    hvd_client_close(c);
    hvd_driver_stop(d);
    /* One the ranks could not fetch is refused at start, saying what to do (the length alone
     * is looked at: the bytes are never read). */
    big_code.object.len = HVD_CODE_MAX_FRAME;
    hvd_driver_config big_cfg = {.num_tasks = 1, .secret = g_secret, .code = &big_code};
    CHECK(hvd_driver_start(&big_cfg, &err) == NULL && err.code == HVD_E_INVALID &&
          strstr(err.msg, "more than the") && strstr(err.msg, "load large data inside"));
    free(big);

    /* Bad configurations are refused at start. */
    hvd_code_msg empty = {.kind = HVD_CODE_ARGV};
    hvd_driver_config cfg = {.num_tasks = 1, .secret = g_secret, .code = &empty};
    CHECK(hvd_driver_start(&cfg, &err) == NULL && err.code == HVD_E_INVALID);
    cfg.code = NULL;
    cfg.num_tasks = 0;
    CHECK(hvd_driver_start(&cfg, &err) == NULL && err.code == HVD_E_INVALID);
}

static void test_results(void) {
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    if (!d) return;
    hvd_client *c = register_xy(d);
    if (!c) goto out;
    hvd_err err;
    uint32_t idx;
    /* rank r -> task: 0->0, 1->2, 2->1, 3->3. */
    CHECK(set_local_rank(c, "hx", 0, 0, &idx, &err) == 0);
    CHECK(set_local_rank(c, "hx", 1, 1, &idx, &err) == 0);
    CHECK(set_local_rank(c, "hy", 0, 2, &idx, &err) == 0);
    CHECK(set_local_rank(c, "hy", 1, 3, &idx, &err) == 0);
    /* Reported out of order; rank 2 never reports; rank 0 reports twice (the last wins). */
    CHECK(report_result(c, 3, 3, 0, "three", NULL, &err) == 0);
    CHECK(report_result(c, 0, 0, 0, "zero", NULL, &err) == 0);
    CHECK(report_result(c, 1, 2, 3, "", "RuntimeError: boom", &err) == 0);
    CHECK(report_result(c, 0, 0, 0, "zero-v2", NULL, &err) == 0);
    CHECK(report_result(c, 4, 0, 0, "x", NULL, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(report_result(c, -1, 0, 0, "x", NULL, &err) == -1 && err.code == HVD_E_INVALID);
    CHECK(report_result(c, 2, 9, 0, "x", NULL, &err) == -1 && err.code == HVD_E_INVALID);

    hvd_rank_result *res;
    size_t n;
    CHECK(hvd_driver_results(d, &res, &n, &err) == 0);
    CHECK(n == 4);
    if (n == 4) {
        for (int r = 0; r < 4; r++)
            CHECK(res[r].rank == r);
        CHECK(res[0].present && res[0].index == 0 && strcmp(res[0].host_hash, "hx") == 0);
        CHECK(res[0].len == 7 && memcmp(res[0].data, "zero-v2", 7) == 0 && !res[0].error);
        CHECK(res[1].present && res[1].index == 2 && res[1].status == 3 && res[1].len == 0);
        CHECK(res[1].error && strcmp(res[1].error, "RuntimeError: boom") == 0);
        CHECK(!res[2].present && res[2].index == 1 && strcmp(res[2].host_hash, "hy") == 0);
        CHECK(res[2].data == NULL && res[2].error == NULL);
        CHECK(res[3].present && res[3].len == 5 && memcmp(res[3].data, "three", 5) == 0);
    }
    hvd_driver_results_free(res, n);
    hvd_client_close(c);
out:
    hvd_driver_stop(d);

    /* No rank ever mapped or reported: every slot is absent, with no task. */
    d = start_driver(2, NULL, NULL, NULL);
    if (!d) return;
    CHECK(hvd_driver_results(d, &res, &n, &err) == 0 && n == 2);
    CHECK(n == 2 && !res[0].present && !res[1].present && res[1].index == UINT32_MAX &&
          res[1].host_hash == NULL);
    hvd_driver_results_free(res, n);
    hvd_driver_stop(d);
}

/* ---- WAIT_SHUTDOWN ------------------------------------------------------------------------- */

typedef struct poll_arg {
    hvd_driver *d;
    pthread_barrier_t *connected;
    atomic_int *answered;
    int rc;
    hvd_err err;
} poll_arg;

static void *wait_shutdown_thread(void *p) {
    poll_arg *a = p;
    hvd_client *c = driver_connect(a->d, &a->err);
    if (a->connected) pthread_barrier_wait(a->connected);
    hvd_index_msg me = {.index = 0};
    a->rc =
        c ? hvd_client_call(c, &hvd_wait_shutdown_desc, &me, &hvd_ack_desc, NULL, 30000, 0, &a->err)
          : -1;
    atomic_fetch_add(a->answered, 1);
    hvd_client_close(c);
    return NULL;
}

static bool wait_held(hvd_driver *d, size_t want, int ms) {
    for (int waited = 0; waited < ms; waited += 10) {
        if (drv_held_count(d) == want) return true;
        usleep(10 * 1000);
    }
    return drv_held_count(d) == want;
}

static void test_wait_shutdown(void) {
    enum { POLLS = 200 };
    hvd_driver *d = start_driver(1, NULL, NULL, NULL);
    if (!d) return;
    pthread_t th[POLLS];
    poll_arg args[POLLS];
    atomic_int answered = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < POLLS; i++) {
        args[i] = (poll_arg){.d = d, .answered = &answered};
        pthread_create(&th[i], &attr, wait_shutdown_thread, &args[i]);
    }
    /* All held at once, without a thread each on the driver, and none answered early. */
    CHECK_MSG(wait_held(d, POLLS, 20000), "held %zu", drv_held_count(d));
    usleep(200 * 1000);
    CHECK(atomic_load(&answered) == 0);
    int64_t t0 = test_now_ms();
    hvd_driver_shutdown_tasks(d);
    for (int i = 0; i < POLLS; i++)
        pthread_join(th[i], NULL);
    int64_t took = test_now_ms() - t0;
    int ok = 0;
    for (int i = 0; i < POLLS; i++)
        ok += args[i].rc == 0;
    CHECK_MSG(ok == POLLS, "%d of %d answered with an ack", ok, POLLS);
    CHECK_MSG(took < 5000, "answering took %lld ms", (long long)took);
    CHECK(drv_held_count(d) == 0);
    /* After shutdown a new long-poll is answered at once. */
    hvd_client *c = driver_client(d);
    hvd_err err;
    hvd_index_msg task0 = {.index = 0};
    t0 = test_now_ms();
    CHECK(c && hvd_client_call(c, &hvd_wait_shutdown_desc, &task0, &hvd_ack_desc, NULL, 5000, 0,
                               &err) == 0);
    CHECK(test_now_ms() - t0 < 1000);
    hvd_driver_shutdown_tasks(d); /* twice is harmless */
    hvd_client_close(c);
    hvd_driver_stop(d);

    /* Clients that go away while held are forgotten (no leak: ASan); stop answers the rest.
     * None of them counts as a lost task: no task registered with their index. */
    d = start_driver(2, NULL, NULL, NULL);
    if (!d) goto out;
    enum { GONE = 20 };
    hvd_client *gone[GONE];
    for (int i = 0; i < GONE; i++) {
        gone[i] = driver_client(d);
        CHECK(gone[i] && hvd_client_send(gone[i], &hvd_wait_shutdown_desc, &task0, &err) == 0);
    }
    CHECK_MSG(wait_held(d, GONE, 5000), "held %zu", drv_held_count(d));
    char why[512];
    CHECK(hvd_driver_lost_reason(d, why, sizeof why) == 0 && why[0] == '\0');
    for (int i = 0; i < GONE / 2; i++)
        hvd_client_close(gone[i]);
    CHECK_MSG(wait_held(d, GONE / 2, 5000), "held %zu", drv_held_count(d));
    CHECK_MSG(hvd_driver_lost_tasks(d) == 0, "unregistered long-polls counted as lost: %zu",
              hvd_driver_lost_tasks(d));
    enum { STAY = 5 };
    poll_arg stay[STAY];
    pthread_t sth[STAY];
    pthread_barrier_t connected;
    pthread_barrier_init(&connected, NULL, STAY + 1);
    answered = 0;
    for (int i = 0; i < STAY; i++) {
        stay[i] = (poll_arg){.d = d, .connected = &connected, .answered = &answered};
        pthread_create(&sth[i], &attr, wait_shutdown_thread, &stay[i]);
    }
    pthread_barrier_wait(&connected);
    CHECK_MSG(wait_held(d, GONE / 2 + STAY, 5000), "held %zu", drv_held_count(d));
    hvd_driver_stop(d); /* with 15 calls held */
    for (int i = 0; i < STAY; i++) {
        pthread_join(sth[i], NULL);
        CHECK_MSG(stay[i].rc == 0, "%s", stay[i].err.msg);
    }
    pthread_barrier_destroy(&connected);
    for (int i = GONE / 2; i < GONE; i++)
        hvd_client_close(gone[i]);
out:
    pthread_attr_destroy(&attr);
}

/* A task is lost when the last long-poll held for its registered index breaks, and back when
 * it renews it; one of several (the task re-issuing it, another holder of the key) breaking
 * means nothing. */
static void test_lost_task(void) {
    hvd_driver *d = start_driver(2, NULL, NULL, NULL);
    if (!d) return;
    hvd_err err;
    hvd_client *reg = driver_client(d);
    CHECK(reg && register_task(reg, 0, "host-a", 4000, &err) == 0);
    CHECK(reg && register_task(reg, 1, "host-b", 4001, &err) == 0);
    hvd_index_msg t0 = {.index = 0}, t1 = {.index = 1};
    hvd_client *old = driver_client(d), *renewed = driver_client(d), *other = driver_client(d);
    CHECK(old && hvd_client_send(old, &hvd_wait_shutdown_desc, &t0, &err) == 0);
    CHECK_MSG(wait_held(d, 1, 5000), "held %zu", drv_held_count(d));
    CHECK(renewed && hvd_client_send(renewed, &hvd_wait_shutdown_desc, &t0, &err) == 0);
    CHECK(other && hvd_client_send(other, &hvd_wait_shutdown_desc, &t1, &err) == 0);
    CHECK_MSG(wait_held(d, 3, 5000), "held %zu", drv_held_count(d));
    hvd_client_close(old); /* `renewed` still watches task 0: not a loss */
    CHECK(wait_held(d, 2, 5000));
    CHECK_MSG(hvd_driver_lost_tasks(d) == 0, "a replaced long-poll counted: %zu",
              hvd_driver_lost_tasks(d));
    hvd_client_close(renewed); /* task 0's watch: lost */
    CHECK(wait_held(d, 1, 5000));
    char why[512];
    CHECK(hvd_driver_lost_tasks(d) == 1);
    CHECK_MSG(hvd_driver_lost_reason(d, why, sizeof why) == 0 &&
                  strstr(why, "task 0 (host host-a at 127.0.0.1) went away while the job ran"),
              "%s", why);
    hvd_client *back = driver_client(d); /* task 0 renews its watch: not lost any more */
    CHECK(back && hvd_client_send(back, &hvd_wait_shutdown_desc, &t0, &err) == 0);
    CHECK(wait_held(d, 2, 5000));
    CHECK_MSG(hvd_driver_lost_tasks(d) == 0, "lost %zu", hvd_driver_lost_tasks(d));
    hvd_driver_shutdown_tasks(d);
    CHECK(wait_held(d, 0, 5000));
    hvd_client_close(back);
    hvd_client_close(other);
    CHECK(hvd_driver_lost_tasks(d) == 0); /* long-polls ending after shutdown are no loss */
    hvd_client_close(reg);
    hvd_driver_stop(d);
}

/* A launch that stalls: the ranks started so far are counted, and the driver names the stall
 * (HVD_FAILURE_LAUNCH) before what fails after it, and after what failed before. */
static void test_launch_failed(void) {
    char buf[HVD_ERR_MAX * 2];
    hvd_failure_kind kind;
    hvd_err err;
    uint32_t idx;
    size_t np = 0;
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    hvd_client *c = d ? register_xy(d) : NULL;
    CHECK(d && hvd_driver_ranks_started(d, &np) == 0 && np == 4);
    for (uint32_t r = 0; c && r < 2; r++)
        CHECK(set_local_rank(c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    CHECK(set_local_rank(c, "hx", 0, 0, &idx, &err) == 0); /* again: still one rank */
    CHECK(hvd_driver_ranks_started(d, &np) == 2 && np == 4);
    hvd_driver_launch_failed(d, "2 of 4 ranks had started");
    CHECK(report_result(c, 0, 0, 1, "", "boom", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_LAUNCH && !strcmp(buf, "2 of 4 ranks had started"), "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);

    d = start_driver(4, NULL, NULL, NULL);
    c = d ? register_xy(d) : NULL;
    CHECK(set_local_rank(c, "hx", 0, 0, &idx, &err) == 0);
    CHECK(report_result(c, 0, 0, 1, "", "boom", &err) == 0);
    hvd_driver_launch_failed(d, "1 of 4 ranks had started");
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_RANK && strstr(buf, "boom"), "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

/* A driver of 4 tasks on hosts hx and hy (register_xy) whose ranks 0 and 1 have started; its
 * client in *c. */
static hvd_driver *two_ranks_started(hvd_client **c) {
    hvd_err err;
    uint32_t idx;
    hvd_driver *d = start_driver(4, NULL, NULL, NULL);
    *c = d ? register_xy(d) : NULL;
    for (uint32_t r = 0; *c && r < 2; r++)
        CHECK(set_local_rank(*c, r % 2 ? "hy" : "hx", r / 2, r, &idx, &err) == 0);
    return d;
}

/* What fails after the launcher began to stop the job (hvd_driver_stopping_job) is the stop's
 * doing and is not named; what failed before it still is; the next job starts afresh. */
static void test_stopping_job(void) {
    char buf[HVD_ERR_MAX * 2];
    hvd_failure_kind kind;
    hvd_err err;
    uint32_t idx;
    hvd_client *c;
    hvd_driver *d = two_ranks_started(&c);
    CHECK(report_result(c, 0, 0, 1, "", "boom", &err) == 0);
    hvd_driver_stopping_job(d);
    CHECK(report_result(c, 1, 1, 143, "", "killed by the stop", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_RANK && strstr(buf, "boom"), "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);

    d = two_ranks_started(&c);
    hvd_driver_stopping_job(d);
    CHECK(report_result(c, 1, 1, 143, "", "killed by the stop", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_NONE && buf[0] == '\0', "%d: %s", (int)kind, buf);
    CHECK(d && hvd_driver_next_job(d, &err) == 0);
    CHECK(set_local_rank(c, "hx", 0, 0, &idx, &err) == 0);
    CHECK(report_result(c, 0, 0, 2, "", "boom again", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_RANK && strstr(buf, "boom again"), "%s", buf);
    hvd_client_close(c);
    hvd_driver_stop(d);

    d = two_ranks_started(&c);
    /* A rank killed by a signal before the stop outranks one that exits with a status of its
     * own after it (which would come first without the stop). */
    CHECK(report_result(c, 0, 0, 139, "", "segfault", &err) == 0);
    hvd_driver_stopping_job(d);
    CHECK(report_result(c, 1, 1, 1, "", "its peer died", &err) == 0);
    failure_of(d, &kind, buf, sizeof buf);
    CHECK_MSG(kind == HVD_FAILURE_RANK && strstr(buf, "segfault"), "%s", buf);
    hvd_rank_result *res;
    size_t nres;
    CHECK(hvd_driver_results(d, &res, &nres, &err) == 0);
    CHECK(hvd_driver_first_failed_rank(d, res, nres) == 0 && hvd_first_failed_rank(res, nres) == 1);
    hvd_driver_results_free(res, nres);
    hvd_client_close(c);
    hvd_driver_stop(d);
}

int main(void) {
    dtest_init();
    RUN(test_ranges);
    RUN(test_register_many);
    RUN(test_register_refused);
    RUN(test_report_errors);
    RUN(test_addrs);
    RUN(test_wait_registration);
    RUN(test_ranks);
    RUN(test_code);
    RUN(test_entry_check);
    RUN(test_failure);
    RUN(test_launch_failed);
    RUN(test_stopping_job);
    RUN(test_silent_order);
    RUN(test_next_job_release);
    RUN(test_results);
    RUN(test_wait_shutdown);
    RUN(test_lost_task);
    return test_finish();
}
