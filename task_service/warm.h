/* The task service's warm interpreter (warm.c). */
#ifndef HVD_TASK_WARM_H
#define HVD_TASK_WARM_H

#include "common/env.h"
#include "hvd/task.h"

/* Before the command's environment is built: makes the interpreter's directory and fills *ch
 * with the variable that names its socket. Returns 1 if it did, 0 if there is no warm
 * interpreter (none configured, or the directory could not be made: logged). */
int task_warm_prepare(hvd_task *t, const hvd_task_config *cfg, hvd_env_change *ch);
/* Starts the interpreter (after task_warm_prepare); a failure is logged, and ranks start
 * cold. */
void task_warm_start(hvd_task *t, const hvd_task_config *cfg);
/* Kills the interpreter (and every rank forked from it) and removes its directory. */
void task_warm_stop(hvd_task *t);

#endif
