/* The task service's warm interpreter (warm.c). */
#ifndef HVD_TASK_WARM_H
#define HVD_TASK_WARM_H

#include "common/env.h"
#include "hvd/task.h"

/* Before the command's environment is built (and the service registers): makes the
 * interpreter's directory and listening socket, and fills ch with the variables that name
 * the socket and the interpreter. Returns how many it filled (2), or 0 if there is no warm
 * interpreter (none configured, or its directory or socket could not be made: logged). */
int task_warm_prepare(hvd_task *t, const hvd_task_config *cfg, hvd_env_change ch[2]);
/* Starts the interpreter (after task_warm_prepare); a failure is logged, and ranks start
 * cold. */
void task_warm_start(hvd_task *t, const hvd_task_config *cfg);
/* Kills the interpreter (and every rank forked from it) and removes its directory. */
void task_warm_stop(hvd_task *t);

#endif
