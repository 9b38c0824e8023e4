/* What launch.c shares with the elastic launches (elastic_*.c) of libhvd_launch; private to
 * driver_service/. */
#ifndef HVD_LAUNCH_INTERNAL_H
#define HVD_LAUNCH_INTERNAL_H

#include "hvd/launch.h"

/* mpirun's environment: this process's, with cfg->extra_env and then the job's variables
 * (which win). Free with hvd_env_free. Returns NULL with err. */
char **mpirun_env(hvd_driver *d, const hvd_launch_config *cfg, hvd_err *err);

/* One line to cfg->log, if any. */
void launch_log(const hvd_launch_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
