/* org.hvdbridge.DriverService: libhvd_driver (include/hvd/driver.h) and the mpirun launch
 * (include/hvd/launch.h) for a JVM driver; the same sequence as hvd-driver run
 * (driver_service/launcher_main.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strv.h"
#include "hvd/driver.h"
#include "hvd/launch.h"
#include "jni_util.h"
#include "org_hvdbridge_DriverService.h"

/* What a Java DriverService's handle points to. */
typedef struct jni_driver {
    hvd_driver *d;
    hvd_secret secret; /* for the tasks (nativeSecret) */
    char *addrs;       /* the driver's addresses, text form */
    uint32_t num_tasks;
    bool verbose; /* progress lines to stderr */
    int stop;     /* set (atomically) by nativeAbort: stops a running mpirun */
} jni_driver;

static const char DRIVER[] = "the driver service";

/* Runs on the library's threads: stderr only, never the JVM. */
static void driver_log(void *user, const char *line) {
    const jni_driver *jd = user;
    if (jd->verbose) jni_log_stderr("hvd-driver", line);
}

static void driver_free(jni_driver *jd) {
    hvd_driver_stop(jd->d);
    hvd_secret_wipe(&jd->secret);
    free(jd->addrs);
    free(jd);
}

/* Checks the numbers nativeStart takes; throws IllegalArgumentException for a bad one. */
static bool start_numbers_ok(JNIEnv *env, jint num_tasks, jint kind, jint port) {
    if (num_tasks < 1)
        jni_throw(env, jni_classes.illegal_argument, "the number of tasks must be >= 1, not %d",
                  (int)num_tasks);
    else if (port < 0 || port > 65535)
        jni_throw(env, jni_classes.illegal_argument, "bad port %d", (int)port);
    else if (kind != HVD_CODE_ARGV && kind != HVD_CODE_SHARED_OBJECT)
        jni_throw(env, jni_classes.illegal_argument, "unknown entry point kind %d", (int)kind);
    else
        return true;
    return false;
}

/* Converts the entry point of nativeStart (a command, or a shared object with its symbol and
 * argument) into code; code_free frees it, also after a failure. Returns 0, or -1 with an
 * exception pending. */
static int entry_point(JNIEnv *env, jint kind, jobjectArray argv, jbyteArray object,
                       jbyteArray symbol, jbyteArray arg, hvd_code_msg *code) {
    code->kind = (uint32_t)kind;
    if (kind == HVD_CODE_ARGV) {
        if (jni_textv(env, argv, false, "the entry point command", &code->argv.v, &code->argv.n) !=
            0)
            return -1;
        if (code->argv.n == 0 || !code->argv.v[0][0]) {
            jni_throw(env, jni_classes.illegal_argument, "the entry point command is empty");
            return -1;
        }
        return 0;
    }
    if (jni_bytes(env, object, "the shared object", &code->object.data, &code->object.len) != 0 ||
        jni_text(env, symbol, false, "the entry point symbol", &code->symbol) != 0 ||
        jni_bytes(env, arg, "the entry point argument", &code->arg.data, &code->arg.len) != 0)
        return -1;
    if (code->object.len == 0 || !code->symbol[0]) {
        jni_throw(env, jni_classes.illegal_argument,
                  "a shared-object entry point needs the object's bytes and a symbol");
        return -1;
    }
    return 0;
}

static void code_free(hvd_code_msg *code) {
    hvd_strv_free(code->argv.v);
    free(code->object.data);
    free(code->symbol);
    free(code->arg.data);
}

/* Generates the job's secret, starts the driver service of cfg with it and keeps the
 * service's addresses in text form. Returns 0, or -1 with an exception pending (the caller
 * then frees jd). */
static int driver_open(JNIEnv *env, jni_driver *jd, hvd_driver_config *cfg) {
    hvd_err err = {0};
    if (hvd_secret_generate(&jd->secret, &err) != 0) {
        jni_throw_err(env, &err);
        return -1;
    }
    cfg->secret = jd->secret;
    cfg->log = driver_log;
    cfg->log_user = jd;
    jd->d = hvd_driver_start(cfg, &err);
    hvd_secret_wipe(&cfg->secret);
    if (!jd->d) {
        jni_throw_err(env, &err);
        return -1;
    }
    hvd_addr *addrs;
    size_t naddrs;
    if (hvd_driver_addrs(jd->d, &addrs, &naddrs, &err) != 0) {
        jni_throw_err(env, &err);
        return -1;
    }
    jd->addrs = hvd_addrs_format(addrs, naddrs);
    free(addrs);
    if (!jd->addrs) {
        jni_throw_oom(env, "the driver's addresses");
        return -1;
    }
    return 0;
}

JNIEXPORT jlong JNICALL Java_org_hvdbridge_DriverService_nativeStart(
    JNIEnv *env, jclass cls, jint num_tasks, jint kind, jobjectArray argv, jbyteArray object,
    jbyteArray symbol, jbyteArray arg, jobjectArray nics, jbyteArray bind_host, jint port,
    jboolean verbose) {
    (void)cls;
    if (!start_numbers_ok(env, num_tasks, kind, port)) return 0;
    hvd_code_msg code = {0};
    char **nicv = NULL, *bind = NULL;
    size_t nnics = 0;
    jni_driver *jd = NULL;
    if (entry_point(env, kind, argv, object, symbol, arg, &code) != 0 ||
        jni_nics(env, nics, &nicv, &nnics) != 0 ||
        jni_text(env, bind_host, true, "the bind address", &bind) != 0)
        goto out;
    if (!(jd = calloc(1, sizeof *jd))) {
        jni_throw_oom(env, DRIVER);
        goto out;
    }
    jd->num_tasks = (uint32_t)num_tasks;
    jd->verbose = verbose;
    hvd_driver_config cfg = {.num_tasks = (uint32_t)num_tasks,
                             .code = &code,
                             .nics = (const char *const *)nicv,
                             .bind_host = bind,
                             .port = (uint16_t)port};
    if (driver_open(env, jd, &cfg) != 0) {
        driver_free(jd);
        jd = NULL;
    }
out:
    code_free(&code);
    hvd_strv_free(nicv);
    free(bind);
    return (jlong)(intptr_t)jd;
}

JNIEXPORT jbyteArray JNICALL Java_org_hvdbridge_DriverService_nativeSecret(JNIEnv *env, jclass cls,
                                                                           jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    return jd ? jni_new_bytes(env, jd->secret.key, HVD_SECRET_LEN) : NULL;
}

JNIEXPORT jbyteArray JNICALL Java_org_hvdbridge_DriverService_nativeAddresses(JNIEnv *env,
                                                                              jclass cls, jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    return jd ? jni_new_text(env, jd->addrs) : NULL;
}

JNIEXPORT void JNICALL Java_org_hvdbridge_DriverService_nativeWaitRegistration(JNIEnv *env,
                                                                               jclass cls, jlong h,
                                                                               jint timeout_ms) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    hvd_err err = {0};
    if (jd && hvd_driver_wait_registration(jd->d, timeout_ms, &err) != 0) jni_throw_err(env, &err);
}

JNIEXPORT jobjectArray JNICALL Java_org_hvdbridge_DriverService_nativeCommonInterfaces(
    JNIEnv *env, jclass cls, jlong h, jint timeout_ms) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return NULL;
    char **ifaces = NULL;
    hvd_err err = {0};
    if (hvd_driver_common_interfaces(jd->d, timeout_ms, &ifaces, &err) != 0) {
        jni_throw_err(env, &err);
        return NULL;
    }
    jobjectArray out = jni_new_text_array(env, (const char *const *)ifaces);
    hvd_strv_free(ifaces);
    return out;
}

JNIEXPORT jbyteArray JNICALL Java_org_hvdbridge_DriverService_nativeHostList(JNIEnv *env,
                                                                             jclass cls, jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return NULL;
    hvd_err err = {0};
    char *hosts = hvd_driver_host_list(jd->d, &err);
    if (!hosts) {
        jni_throw_err(env, &err);
        return NULL;
    }
    jbyteArray out = jni_new_text(env, hosts);
    free(hosts);
    return out;
}

/* Threads of the native libraries never call into the JVM: the launch's lines go to stderr. */
static void log_stderr(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "hvd-driver: %s\n", line);
}

JNIEXPORT jintArray JNICALL Java_org_hvdbridge_DriverService_nativeRunJob(
    JNIEnv *env, jclass cls, jlong h, jbyteArray bin_dir, jobjectArray mpi_args, jint timeout_s,
    jint start_timeout_ms, jboolean verbose, jobjectArray extra_env) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return NULL;
    if (timeout_s < 0 || start_timeout_ms <= 0) {
        jni_throw(env, jni_classes.illegal_argument, "bad timeout");
        return NULL;
    }
    char *bin = NULL, **args = NULL, **user_env = NULL;
    size_t nargs = 0, nenv = 0;
    jintArray out = NULL;
    hvd_err err = {0};
    if (jni_text(env, bin_dir, false, "the bin dir", &bin) != 0 ||
        jni_textv(env, mpi_args, true, "the mpirun arguments", &args, &nargs) != 0 ||
        jni_env_entries(env, extra_env, "the mpirun environment", &user_env, &nenv) != 0)
        goto out;
    /* The secret and the driver's addresses reach mpirun and hvd-rsh through the
     * environment hvd_launch_job builds (never setenv in a JVM, never a command line). */
    hvd_launch_config lc = {.np = (int)jd->num_tasks,
                            .bin_dir = bin,
                            .mpi_args = (const char *const *)args,
                            .extra_env = (const char *const *)user_env,
                            .timeout_s = timeout_s,
                            .start_timeout_ms = start_timeout_ms,
                            .stop = &jd->stop,
                            .log = verbose ? log_stderr : NULL};
    hvd_launch_outcome o;
    if (hvd_launch_job(jd->d, &lc, &o, &err) != 0) {
        jni_throw_err(env, &err);
        goto out;
    }
    jint st[2] = {o.status, o.timed_out ? 1 : 0};
    out = (*env)->NewIntArray(env, 2);
    if (out) (*env)->SetIntArrayRegion(env, out, 0, 2, st);
out:
    free(bin);
    hvd_strv_free(args);
    hvd_strv_free(user_env);
    return out;
}

static jobject result_at(JNIEnv *env, const void *items, size_t i) {
    return jni_new_rank_result(env, &((const hvd_rank_result *)items)[i]);
}

JNIEXPORT jobjectArray JNICALL Java_org_hvdbridge_DriverService_nativeResults(JNIEnv *env,
                                                                              jclass cls, jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return NULL;
    hvd_rank_result *r;
    size_t n;
    hvd_err err = {0};
    if (hvd_driver_results(jd->d, &r, &n, &err) != 0) {
        jni_throw_err(env, &err);
        return NULL;
    }
    jobjectArray out = jni_new_array(env, jni_classes.rank_result, n, result_at, r);
    hvd_driver_results_free(r, n);
    return out;
}

/* What failed first on its own (hvd_driver_failure) into text; the rank that did into *bad.
 * Returns the kind, HVD_FAILURE_NONE also when the results cannot be read (exception set). */
static hvd_failure_kind failure_of(JNIEnv *env, jlong h, char *text, size_t cap, int *bad) {
    *bad = -1;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return HVD_FAILURE_NONE;
    hvd_rank_result *r;
    size_t n;
    hvd_err err = {0};
    if (hvd_driver_results(jd->d, &r, &n, &err) != 0) {
        jni_throw_err(env, &err);
        return HVD_FAILURE_NONE;
    }
    hvd_failure_kind kind = hvd_driver_failure(jd->d, r, n, text, cap);
    *bad = hvd_driver_first_failed_rank(jd->d, r, n);
    hvd_driver_results_free(r, n);
    return kind;
}

JNIEXPORT jbyteArray JNICALL Java_org_hvdbridge_DriverService_nativeFailure(JNIEnv *env, jclass cls,
                                                                            jlong h) {
    (void)cls;
    char text[HVD_ERR_MAX * 2];
    int bad;
    if (failure_of(env, h, text, sizeof text, &bad) == HVD_FAILURE_NONE) return NULL;
    return jni_new_text(env, text);
}

JNIEXPORT jint JNICALL Java_org_hvdbridge_DriverService_nativeFirstFailedRank(JNIEnv *env,
                                                                              jclass cls, jlong h) {
    (void)cls;
    char text[HVD_ERR_MAX * 2];
    int bad;
    (void)failure_of(env, h, text, sizeof text, &bad);
    return bad;
}

/* Readies the driver for another job over the same tasks (hvd_driver_next_job). */
JNIEXPORT void JNICALL Java_org_hvdbridge_DriverService_nativeNextJob(JNIEnv *env, jclass cls,
                                                                      jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    hvd_err err = {0};
    if (jd && hvd_driver_next_job(jd->d, &err) != 0) jni_throw_err(env, &err);
}

JNIEXPORT void JNICALL Java_org_hvdbridge_DriverService_nativeShutdownTasks(JNIEnv *env, jclass cls,
                                                                            jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (jd) hvd_driver_shutdown_tasks(jd->d);
}

JNIEXPORT void JNICALL Java_org_hvdbridge_DriverService_nativeAbort(JNIEnv *env, jclass cls,
                                                                    jlong h, jbyteArray reason) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (!jd) return;
    char *why = NULL;
    if (jni_text(env, reason, true, "the reason", &why) != 0) (*env)->ExceptionClear(env);
    __atomic_store_n(&jd->stop, 1, __ATOMIC_RELEASE);
    hvd_driver_abort(jd->d, why ? why : "aborted");
    free(why);
}

JNIEXPORT void JNICALL Java_org_hvdbridge_DriverService_nativeStop(JNIEnv *env, jclass cls,
                                                                   jlong h) {
    (void)cls;
    jni_driver *jd = jni_handle(env, h, DRIVER);
    if (jd) driver_free(jd);
}
