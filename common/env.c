/* Building the command's environment: see env.h. */
#include "common/env.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether entry ("NAME=VALUE" or a bare "NAME") is a variable called name[0..len). */
static bool entry_is(const char *entry, const char *name, size_t len) {
    return strncmp(entry, name, len) == 0 && (entry[len] == '=' || entry[len] == '\0');
}

/* The last change of the variable called name[0..len), or NULL. */
static const hvd_env_change *last_change(const hvd_env_change *changes, size_t n, const char *name,
                                         size_t len) {
    for (size_t i = n; i-- > 0;)
        if (strlen(changes[i].name) == len && strncmp(changes[i].name, name, len) == 0)
            return &changes[i];
    return NULL;
}

/* Where one entry of the result comes from: a base entry kept as is, or a change. */
struct source {
    const char *entry;         /* base entry, or NULL */
    const hvd_env_change *set; /* change giving "name=value", when entry is NULL */
};

static size_t source_len(const struct source *s) {
    if (s->entry) return strlen(s->entry);
    return strlen(s->set->name) + 1 + strlen(s->set->value);
}

char **hvd_env_build(char *const *base, const hvd_env_change *changes, size_t n_changes,
                     hvd_err *err) {
    for (size_t i = 0; i < n_changes; i++) {
        const char *name = changes[i].name;
        if (!name || !*name || strchr(name, '=')) {
            hvd_err_set(err, HVD_E_INVALID,
                        "invalid environment variable name '%s': it must be non-empty and "
                        "contain no '='",
                        name ? name : "(null)");
            return NULL;
        }
    }
    size_t n_base = 0;
    while (base && base[n_base])
        n_base++;
    if (n_base > SIZE_MAX / sizeof(struct source) - n_changes - 1) goto oom;
    struct source *src = malloc((n_base + n_changes + 1) * sizeof *src);
    if (!src) goto oom;

    size_t n = 0;
    for (size_t j = 0; j < n_base; j++) {
        const char *e = base[j];
        size_t len = strcspn(e, "=");
        const hvd_env_change *c = last_change(changes, n_changes, e, len);
        if (!c) {
            src[n++] = (struct source){e, NULL};
            continue;
        }
        if (!c->value) continue; /* unset */
        bool first = true;
        for (size_t p = 0; p < j && first; p++)
            if (entry_is(base[p], e, len)) first = false;
        if (first) src[n++] = (struct source){NULL, c}; /* replaced in place */
    }
    for (size_t i = 0; i < n_changes; i++) {
        const hvd_env_change *c = &changes[i];
        size_t len = strlen(c->name);
        if (!c->value || last_change(changes, n_changes, c->name, len) != c) continue;
        bool in_base = false;
        for (size_t j = 0; j < n_base && !in_base; j++)
            if (entry_is(base[j], c->name, len)) in_base = true;
        if (!in_base) src[n++] = (struct source){NULL, c};
    }

    size_t bytes = (n + 1) * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        size_t l = source_len(&src[i]);
        if (l >= SIZE_MAX - bytes) {
            free(src);
            goto oom;
        }
        bytes += l + 1;
    }
    char **envp = malloc(bytes);
    if (!envp) {
        free(src);
        goto oom;
    }
    char *p = (char *)(envp + n + 1);
    for (size_t i = 0; i < n; i++) {
        envp[i] = p;
        if (src[i].entry) {
            size_t l = strlen(src[i].entry);
            memcpy(p, src[i].entry, l + 1);
            p += l + 1;
        } else {
            size_t ln = strlen(src[i].set->name), lv = strlen(src[i].set->value);
            memcpy(p, src[i].set->name, ln);
            p[ln] = '=';
            memcpy(p + ln + 1, src[i].set->value, lv + 1);
            p += ln + 1 + lv + 1;
        }
    }
    envp[n] = NULL;
    free(src);
    return envp;

oom:
    hvd_err_set(err, HVD_E_INTERNAL, "cannot build the command's environment: out of memory");
    return NULL;
}

/* Whether entry is one of the variables Open MPI 4's singleton MPI_Init sets (seen with
 * Open MPI 4.1.4: ess, orte_launch, orte_ess_num_procs, orte_precondition_transports, pmix,
 * the app context's size, the schizo marker, and PMIx's client variables). */
static bool singleton_var(const char *entry) {
    static const char *const names[] = {"OMPI_MCA_ess",
                                        "OMPI_MCA_orte_launch",
                                        "OMPI_MCA_orte_ess_num_procs",
                                        "OMPI_MCA_orte_precondition_transports",
                                        "OMPI_MCA_pmix",
                                        "OMPI_APP_CTX_NUM_PROCS",
                                        "ORTE_SCHIZO_DETECTION",
                                        NULL};
    for (size_t i = 0; names[i]; i++)
        if (entry_is(entry, names[i], strlen(names[i]))) return true;
    return strncmp(entry, "PMIX_", 5) == 0 && strncmp(entry, "PMIX_MCA_", 9) != 0;
}

char **hvd_env_without_mpi_singleton(char *const *env) {
    size_t n = 0;
    bool singleton = false;
    for (; env && env[n]; n++)
        singleton |= strcmp(env[n], "OMPI_MCA_ess=singleton") == 0;
    char **out = malloc((n + 1) * sizeof *out);
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!singleton || !singleton_var(env[i])) out[k++] = env[i];
    out[k] = NULL;
    return out;
}

void hvd_env_free(char **envp) {
    free(envp);
}

const char *hvd_env_get(char *const *envp, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], name, len) == 0 && envp[i][len] == '=') return envp[i] + len + 1;
    return NULL;
}
