/* The task service's request handlers (handlers.c; include/hvd/proto.h, "task service
 * requests"). Private to task_service/; above held.h, pump.h and probe.h, below task.c (see
 * state.h). */
#ifndef HVD_TASK_HANDLERS_H
#define HVD_TASK_HANDLERS_H

#include "hvd/task.h"

/* Registers every task-service request handler on t->srv. Returns 0 or -1. */
int task_handlers_register(hvd_task *t);

#endif
