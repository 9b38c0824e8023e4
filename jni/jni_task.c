/* org.hvdbridge.TaskService: libhvd_task (include/hvd/task.h) for a JVM executor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/strv.h"
#include "hvd/task.h"
#include "jni_util.h"
#include "org_hvdbridge_TaskService.h"

extern char **environ;

/* What a Java TaskService's handle points to. */
typedef struct jni_task {
    hvd_task *t;
    char log_prefix[32]; /* "hvd-task[3]" */
} jni_task;

static const char TASK[] = "the task service";

/* Runs on the library's threads: stderr only, never the JVM. */
static void task_log(void *user, int level, const char *line) {
    const jni_task *jt = user;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char msg[1800];
    snprintf(msg, sizeof msg, "%s: %s", names[level >= 0 && level <= 3 ? level : 3], line);
    jni_log_stderr(jt->log_prefix, msg);
}

/* The arguments of nativeStart, converted. */
typedef struct task_args {
    hvd_addr *addrs;
    size_t naddrs;
    char *host_hash, *work_dir;
    char **gpus, **env_add, **nics, **env;
    size_t ngpus, nenv_add, nnics;
} task_args;

static void task_args_free(task_args *a) {
    free(a->addrs);
    free(a->host_hash);
    free(a->work_dir);
    hvd_strv_free(a->gpus);
    hvd_strv_free(a->env_add);
    hvd_strv_free(a->nics);
    hvd_env_free(a->env);
}

/* This process's environment with the "NAME=VALUE" entries set, as hvd-task builds a command's
 * (common/env.h); splits the entries at their '=' in place. NULL when out of memory. */
static char **task_env(char **entries, size_t n) {
    hvd_env_change *ch = calloc(n, sizeof *ch);
    if (!ch) return NULL;
    for (size_t i = 0; i < n; i++) {
        char *eq = strchr(entries[i], '=');
        *eq = '\0';
        ch[i] = (hvd_env_change){.name = entries[i], .value = eq + 1};
    }
    char **env = hvd_env_build(environ, ch, n, NULL);
    free(ch);
    return env;
}

/* Checks the numbers and the secret nativeStart takes; throws for a bad one. */
static bool start_args_ok(JNIEnv *env, jint index, jbyteArray secret, jint start_timeout_ms,
                          jint grace_ms, jint log_level) {
    if (index < 0)
        jni_throw(env, jni_classes.illegal_argument, "the task index must be >= 0, not %d",
                  (int)index);
    else if (!secret)
        jni_throw(env, jni_classes.null_pointer, "the job secret is null");
    else if ((*env)->GetArrayLength(env, secret) != HVD_SECRET_LEN)
        jni_throw(env, jni_classes.illegal_argument, "the job secret must be %d bytes, not %d",
                  HVD_SECRET_LEN, (int)(*env)->GetArrayLength(env, secret));
    else if (start_timeout_ms < 0 || grace_ms < 0 || log_level < 0 || log_level > HVD_LOG_DEBUG)
        jni_throw(env, jni_classes.illegal_argument, "bad timeout or log level");
    else
        return true;
    return false;
}

/* Converts and checks the arrays nativeStart takes into a (task_args_free frees it, also after
 * a failure). Returns 0, or -1 with an exception pending. */
static int task_args_get(JNIEnv *env, jbyteArray driver_addrs, jbyteArray host_hash,
                         jobjectArray gpus, jbyteArray work_dir, jobjectArray env_add,
                         jobjectArray nics, task_args *a) {
    char *addr_text = NULL;
    hvd_err err = {0};
    int rc = -1;
    if (jni_text(env, driver_addrs, false, "the driver addresses", &addr_text) != 0 ||
        jni_text(env, host_hash, true, "the host hash", &a->host_hash) != 0 ||
        jni_text(env, work_dir, true, "the work dir", &a->work_dir) != 0 ||
        jni_textv(env, gpus, true, "the GPU ids", &a->gpus, &a->ngpus) != 0 ||
        jni_env_entries(env, env_add, "the task environment", &a->env_add, &a->nenv_add) != 0 ||
        jni_nics(env, nics, &a->nics, &a->nnics) != 0)
        goto out;
    if (a->host_hash && !hvd_host_hash_valid(a->host_hash)) {
        jni_throw(env, jni_classes.illegal_argument,
                  "bad host hash: 1..127 characters of [A-Za-z0-9_-]");
        goto out;
    }
    if (hvd_addrs_parse(addr_text, &a->addrs, &a->naddrs, &err) != 0) {
        hvd_err_prefix(&err, "bad driver addresses: ");
        jni_throw_err(env, &err);
        goto out;
    }
    if (a->nenv_add && !(a->env = task_env(a->env_add, a->nenv_add))) {
        jni_throw_oom(env, "the task environment");
        goto out;
    }
    rc = 0;
out:
    free(addr_text);
    return rc;
}

/* Copies the job secret into cfg and starts the task service; blocks while it registers (up
 * to the start timeout). The library copies the config. Throws on failure (jt->t NULL). */
static void task_open(JNIEnv *env, jni_task *jt, jbyteArray secret, hvd_task_config *cfg) {
    hvd_err err = {0};
    (*env)->GetByteArrayRegion(env, secret, 0, HVD_SECRET_LEN, (jbyte *)cfg->secret.key);
    if (!(*env)->ExceptionCheck(env)) {
        jt->t = hvd_task_start(cfg, &err);
        if (!jt->t) jni_throw_err(env, &err);
    }
    hvd_secret_wipe(&cfg->secret);
}

JNIEXPORT jlong JNICALL Java_org_hvdbridge_TaskService_nativeStart(
    JNIEnv *env, jclass cls, jint index, jbyteArray secret, jbyteArray driver_addrs,
    jbyteArray host_hash, jobjectArray gpus, jbyteArray work_dir, jobjectArray env_add,
    jobjectArray nics, jint start_timeout_ms, jint grace_ms, jint min_lifetime_ms, jint log_level,
    jboolean elastic) {
    (void)cls;
    if (!start_args_ok(env, index, secret, start_timeout_ms, grace_ms, log_level)) return 0;
    task_args a = {0};
    jni_task *jt = NULL;
    hvd_task_config cfg = {0};
    if (task_args_get(env, driver_addrs, host_hash, gpus, work_dir, env_add, nics, &a) != 0)
        goto out;
    if (!(jt = calloc(1, sizeof *jt))) {
        jni_throw_oom(env, TASK);
        goto out;
    }
    snprintf(jt->log_prefix, sizeof jt->log_prefix, "hvd-task[%d]", (int)index);
    cfg.index = (uint32_t)index;
    cfg.driver_addrs = a.addrs;
    cfg.n_driver_addrs = a.naddrs;
    cfg.host_hash = a.host_hash;
    cfg.gpus = (const char *const *)a.gpus;
    cfg.work_dir = a.work_dir;
    cfg.base_env = a.env; /* NULL: environ */
    cfg.nics = (const char *const *)a.nics;
    cfg.start_timeout_ms = start_timeout_ms;
    cfg.grace_ms = grace_ms;
    cfg.min_lifetime_ms = min_lifetime_ms;
    cfg.log = task_log;
    cfg.log_user = jt;
    cfg.log_level = log_level;
    cfg.elastic = elastic;
    task_open(env, jt, secret, &cfg);
    if (!jt->t) {
        free(jt);
        jt = NULL;
    }
out:
    task_args_free(&a);
    return (jlong)(intptr_t)jt;
}

JNIEXPORT jint JNICALL Java_org_hvdbridge_TaskService_nativeRun(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    jni_task *jt = jni_handle(env, h, TASK);
    if (!jt) return -1;
    int code = -1;
    hvd_err err = {0};
    if (hvd_task_run(jt->t, &code, &err) != 0) {
        jni_throw_err(env, &err);
        return -1;
    }
    return code;
}

JNIEXPORT void JNICALL Java_org_hvdbridge_TaskService_nativeAbort(JNIEnv *env, jclass cls,
                                                                  jlong h) {
    (void)cls;
    jni_task *jt = jni_handle(env, h, TASK);
    if (jt) hvd_task_abort(jt->t);
}

JNIEXPORT jobject JNICALL Java_org_hvdbridge_TaskService_nativeResult(JNIEnv *env, jclass cls,
                                                                      jlong h) {
    (void)cls;
    jni_task *jt = jni_handle(env, h, TASK);
    if (!jt) return NULL;
    hvd_result_msg r;
    if (hvd_task_result(jt->t, &r) != 0) {
        jni_throw_hvd(env, HVD_E_INTERNAL, "cannot read the task's result (out of memory?)");
        return NULL;
    }
    /* A RankResult like the driver's, with no host hash. */
    hvd_rank_result rr = {.rank = r.rank,
                          .index = r.index,
                          .present = true,
                          .status = r.status,
                          .data = r.result.data,
                          .len = r.result.len,
                          .error = r.error};
    jobject out = r.present ? jni_new_rank_result(env, &rr) : NULL;
    hvd_msg_free(&hvd_result_desc, &r);
    return out;
}

JNIEXPORT jint JNICALL Java_org_hvdbridge_TaskService_nativePort(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    jni_task *jt = jni_handle(env, h, TASK);
    return jt ? (jint)hvd_task_port(jt->t) : -1;
}

JNIEXPORT void JNICALL Java_org_hvdbridge_TaskService_nativeStop(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    jni_task *jt = jni_handle(env, h, TASK);
    if (!jt) return;
    hvd_task_stop(jt->t);
    free(jt);
}

JNIEXPORT jbyteArray JNICALL Java_org_hvdbridge_TaskService_nativeHostHash(JNIEnv *env, jclass cls,
                                                                           jbyteArray salt) {
    (void)cls;
    char *s = NULL;
    if (jni_text(env, salt, true, "the host hash salt", &s) != 0) return NULL;
    char out[HVD_HOST_HASH_MAX];
    hvd_err err = {0};
    int rc = hvd_host_hash(out, s, &err);
    free(s);
    if (rc != 0) {
        jni_throw_err(env, &err);
        return NULL;
    }
    return jni_new_text(env, out);
}
