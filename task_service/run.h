/* What hvd_task_run (task_run.c) leaves running after it returns. Private to task_service/;
 * above held.h, below task.c (see state.h). */
#ifndef HVD_TASK_RUN_H
#define HVD_TASK_RUN_H

#include "hvd/task.h"

/* Stops the driver watcher hvd_task_run left running (hvd_task_stop). */
void task_watch_stop(hvd_task *t);

#endif
