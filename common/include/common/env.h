/* An environment with changes applied: the task service builds its command's from the
 * executor's and a request's changes (Horovod's task service: `env = command_env.copy()`, then
 * each key set, or deleted when its value is None); hvd-driver builds mpirun's from its own. */
#ifndef HVD_COMMON_ENV_H
#define HVD_COMMON_ENV_H

#include <stddef.h>

#include "hvd/error.h"

typedef struct hvd_env_change {
    const char *name;  /* variable name: not empty, no '=' */
    const char *value; /* its new value, or NULL to remove the variable */
} hvd_env_change;

/* Builds a new environment: base (NULL-terminated "NAME=VALUE" strings; NULL means empty)
 * with the changes applied in order, so a later change of a name wins. A set replaces the
 * first entry of that name in place and drops any duplicates; a name not in base is appended.
 * An unset removes every entry of that name. Entries of base without '=' are kept unless a
 * change names them. Returns a NULL-terminated array that is one allocation, independent of
 * base and changes; free it with hvd_env_free. Returns NULL and fills err if a name is NULL,
 * empty or contains '=' (HVD_E_INVALID) or memory runs out (HVD_E_INTERNAL). */
char **hvd_env_build(char *const *base, const hvd_env_change *changes, size_t n_changes,
                     hvd_err *err);

/* env (NULL-terminated "NAME=VALUE" strings) without what Open MPI's singleton MPI_Init put
 * there, when it did: a process that called MPI_Init without mpirun (hvd.init() in a notebook
 * or a driver program) has OMPI_MCA_ess=singleton, with which a child mpirun ends at once,
 * and PMIX_* pointing at the singleton's PMIx server. Without that marker env is copied as it
 * is; PMIX_MCA_* (a user's settings) are always kept. Returns a new NULL-terminated array of
 * env's own strings (free the array alone, with free), or NULL when out of memory. */
char **hvd_env_without_mpi_singleton(char *const *env);

/* Frees an environment from hvd_env_build. NULL is ignored. */
void hvd_env_free(char **envp);

/* The value of name in envp, or NULL if it is not there (the first entry wins). */
const char *hvd_env_get(char *const *envp, const char *name);

#endif
