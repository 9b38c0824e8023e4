/* What hvd_task_run (task_run.c) leaves running after it returns. Private to task_service/;
 * above held.h, below task.c (see state.h). */
#ifndef HVD_TASK_RUN_H
#define HVD_TASK_RUN_H

#include "hvd/task.h"

/* Stops the driver watcher hvd_task_run left running (hvd_task_stop); a task that ended
 * normally says TASK_EV_DONE to the driver first. */
void task_watch_stop(hvd_task *t);

/* The task is ending early (why): the watcher tells the driver (TASK_EV_ENDING) and lets go of
 * it now. */
void task_watch_ending(hvd_task *t, const char *why);

#endif
