/* Tests of the command environment builder (task_service/env.c). */
#include "common/env.h"
#include "testutil.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Whether envp is exactly the given entries, in order (the list ends with NULL). */
static int env_is(char **envp, ...) {
    va_list ap;
    va_start(ap, envp);
    size_t i = 0;
    int same = envp != NULL;
    for (const char *want; same && (want = va_arg(ap, const char *)); i++)
        same = envp[i] && strcmp(envp[i], want) == 0;
    va_end(ap);
    return same && envp[i] == NULL;
}

static void dump(char **envp) {
    for (size_t i = 0; envp && envp[i]; i++)
        fprintf(stderr, "  [%zu] %s\n", i, envp[i]);
}

#define CHECK_ENV(envp, ...)                                                                       \
    do {                                                                                           \
        int ok_ = env_is(envp, __VA_ARGS__, (const char *)NULL);                                   \
        CHECK(ok_);                                                                                \
        if (!ok_) dump(envp);                                                                      \
    } while (0)

/* What Open MPI's singleton MPI_Init leaves goes only when its marker is there; a user's
 * PMIX_MCA_* and other OMPI_MCA_* stay. */
static void test_without_mpi_singleton(void) {
    char *singleton[] = {"A=1",
                         "OMPI_MCA_ess=singleton",
                         "OMPI_MCA_btl_tcp_if_include=eth0",
                         "PMIX_SERVER_URI4=1.0;tcp4://127.0.0.1:5",
                         "PMIX_MCA_gds=hash",
                         "OMPI_MCA_orte_launch=1",
                         "OMPI_APP_CTX_NUM_PROCS=1",
                         "B",
                         NULL};
    char **env = hvd_env_without_mpi_singleton(singleton);
    CHECK_ENV(env, "A=1", "OMPI_MCA_btl_tcp_if_include=eth0", "PMIX_MCA_gds=hash", "B");
    free(env);
    char *plain[] = {"OMPI_MCA_ess=env", "PMIX_RANK=0", "OMPI_MCA_orte_launch=1", NULL};
    env = hvd_env_without_mpi_singleton(plain);
    CHECK_ENV(env, "OMPI_MCA_ess=env", "PMIX_RANK=0", "OMPI_MCA_orte_launch=1");
    free(env);
    env = hvd_env_without_mpi_singleton(NULL);
    CHECK(env && env[0] == NULL);
    free(env);
}

static void test_set_unset(void) {
    char *base[] = {"A=1", "B=2", "C=3", NULL};
    hvd_env_change ch[] = {{"B", "x"}, {"D", "4"}, {"A", NULL}, {"E", ""}};
    hvd_err err = {0};
    char **env = hvd_env_build(base, ch, 4, &err);
    CHECK_ENV(env, "B=x", "C=3", "D=4", "E=");
    CHECK(strcmp(hvd_env_get(env, "D"), "4") == 0);
    CHECK(strcmp(hvd_env_get(env, "E"), "") == 0);
    CHECK(hvd_env_get(env, "A") == NULL);
    hvd_env_free(env);
    /* base is untouched */
    CHECK(strcmp(base[1], "B=2") == 0);
}

static void test_order(void) {
    char *base[] = {"A=1", NULL};
    hvd_env_change set_then_unset[] = {{"A", "2"}, {"A", NULL}, {"N", "1"}, {"N", NULL}};
    char **env = hvd_env_build(base, set_then_unset, 4, NULL);
    CHECK_ENV(env, NULL);
    hvd_env_free(env);
    hvd_env_change unset_then_set[] = {{"A", NULL}, {"A", "3"}, {"N", NULL}, {"N", "5"}};
    env = hvd_env_build(base, unset_then_set, 4, NULL);
    CHECK_ENV(env, "A=3", "N=5");
    hvd_env_free(env);
    hvd_env_change twice[] = {{"N", "a"}, {"M", "m"}, {"N", "b"}};
    env = hvd_env_build(base, twice, 3, NULL);
    CHECK_ENV(env, "A=1", "M=m", "N=b");
    hvd_env_free(env);
}

static void test_duplicates_and_odd_entries(void) {
    char *base[] = {"A=1", "AB=2", "A=3", "BARE", "X==y", NULL};
    hvd_env_change set[] = {{"A", "9"}};
    char **env = hvd_env_build(base, set, 1, NULL);
    CHECK_ENV(env, "A=9", "AB=2", "BARE", "X==y");
    hvd_env_free(env);
    hvd_env_change unset[] = {{"A", NULL}, {"BARE", NULL}};
    env = hvd_env_build(base, unset, 2, NULL);
    CHECK_ENV(env, "AB=2", "X==y");
    CHECK(strcmp(hvd_env_get(env, "X"), "=y") == 0);
    hvd_env_free(env);
    hvd_env_change replace_bare[] = {{"BARE", "now"}};
    env = hvd_env_build(base, replace_bare, 1, NULL);
    CHECK_ENV(env, "A=1", "AB=2", "A=3", "BARE=now", "X==y");
    CHECK(strcmp(hvd_env_get(env, "A"), "1") == 0); /* first wins */
    hvd_env_free(env);
}

static void test_empty_inputs(void) {
    hvd_env_change ch[] = {{"ONLY", "v a l"}};
    char **env = hvd_env_build(NULL, ch, 1, NULL);
    CHECK_ENV(env, "ONLY=v a l");
    hvd_env_free(env);
    env = hvd_env_build(NULL, NULL, 0, NULL);
    CHECK_ENV(env, NULL);
    hvd_env_free(env);
    char *base[] = {"K=v", NULL};
    env = hvd_env_build(base, NULL, 0, NULL);
    CHECK_ENV(env, "K=v");
    CHECK(env[0] != base[0]); /* a copy */
    hvd_env_free(env);
    hvd_env_free(NULL);
}

static void test_invalid_names(void) {
    char *base[] = {"A=1", NULL};
    hvd_env_change bad[][1] = {{{"", "x"}}, {{"A=B", "x"}}, {{"=", NULL}}, {{NULL, "x"}}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hvd_err err = {0};
        char **env = hvd_env_build(base, bad[i], 1, &err);
        CHECK(env == NULL);
        CHECK(err.code == HVD_E_INVALID);
        CHECK(strstr(err.msg, "invalid environment variable name") != NULL);
        CHECK(hvd_env_build(base, bad[i], 1, NULL) == NULL); /* err may be NULL */
    }
}

int main(void) {
    RUN(test_set_unset);
    RUN(test_without_mpi_singleton);
    RUN(test_order);
    RUN(test_duplicates_and_odd_entries);
    RUN(test_empty_inputs);
    RUN(test_invalid_names);
    return test_finish();
}
