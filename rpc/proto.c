/* Descriptions of the driver and task service messages (include/hvd/proto.h). */
#include "hvd/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hvd_task_service_name(uint32_t index, char out[HVD_SERVICE_NAME_MAX]) {
    snprintf(out, HVD_SERVICE_NAME_MAX, "task %u", index);
}

static const hvd_field addr_fields[] = {
    HVD_FIELD_CHARS(hvd_addr, ifname),
    HVD_FIELD_CHARS(hvd_addr, host),
    HVD_FIELD(hvd_addr, port, HVD_F_U16),
};
const hvd_msg_desc hvd_addr_desc = HVD_MSG(0, "address", hvd_addr, addr_fields);

static const hvd_field task_info_fields[] = {
    HVD_FIELD(hvd_task_info, index, HVD_F_U32),
    HVD_FIELD(hvd_task_info, host_hash, HVD_F_STR),
    HVD_FIELD_LIST(hvd_task_info, addrs, hvd_addr_desc),
    HVD_FIELD(hvd_task_info, gpus, HVD_F_STRV),
    HVD_FIELD(hvd_task_info, work_dir, HVD_F_STR),
    HVD_FIELD(hvd_task_info, free_port, HVD_F_U16),
    HVD_FIELD(hvd_task_info, elastic, HVD_F_BOOL),
};
const hvd_msg_desc hvd_register_task_desc =
    HVD_MSG(HVD_MSG_REGISTER_TASK, "register_task", hvd_task_info, task_info_fields);
const hvd_msg_desc hvd_task_info_desc =
    HVD_MSG(HVD_MSG_TASK_INFO_REPLY, "task_info", hvd_task_info, task_info_fields);

static const hvd_field index_fields[] = {HVD_FIELD(hvd_index_msg, index, HVD_F_U32)};
const hvd_msg_desc hvd_task_addrs_desc =
    HVD_MSG(HVD_MSG_TASK_ADDRS, "task_addrs", hvd_index_msg, index_fields);
const hvd_msg_desc hvd_task_info_req_desc =
    HVD_MSG(HVD_MSG_TASK_INFO, "task_info_request", hvd_index_msg, index_fields);
const hvd_msg_desc hvd_index_desc = HVD_MSG(HVD_MSG_INDEX, "index", hvd_index_msg, index_fields);

static const hvd_field addrs_fields[] = {HVD_FIELD_LIST(hvd_addrs_msg, addrs, hvd_addr_desc)};
const hvd_msg_desc hvd_addrs_desc = HVD_MSG(HVD_MSG_ADDRS, "addrs", hvd_addrs_msg, addrs_fields);

static const hvd_field host_fields[] = {HVD_FIELD(hvd_host_msg, host_hash, HVD_F_STR)};
const hvd_msg_desc hvd_host_indices_desc =
    HVD_MSG(HVD_MSG_HOST_INDICES, "host_indices", hvd_host_msg, host_fields);

static const hvd_field indices_fields[] = {HVD_FIELD(hvd_indices_msg, indices, HVD_F_U32V)};
const hvd_msg_desc hvd_indices_desc =
    HVD_MSG(HVD_MSG_INDICES, "indices", hvd_indices_msg, indices_fields);

static const hvd_field local_rank_fields[] = {
    HVD_FIELD(hvd_local_rank_msg, host_hash, HVD_F_STR),
    HVD_FIELD(hvd_local_rank_msg, local_rank, HVD_F_U32),
    HVD_FIELD(hvd_local_rank_msg, rank, HVD_F_U32),
};
const hvd_msg_desc hvd_set_local_rank_desc =
    HVD_MSG(HVD_MSG_SET_LOCAL_RANK, "set_local_rank", hvd_local_rank_msg, local_rank_fields);

static const hvd_field rank_fields[] = {HVD_FIELD(hvd_rank_msg, rank, HVD_F_U32)};
const hvd_msg_desc hvd_index_by_rank_desc =
    HVD_MSG(HVD_MSG_INDEX_BY_RANK, "index_by_rank", hvd_rank_msg, rank_fields);
const hvd_msg_desc hvd_rank_watch_desc =
    HVD_MSG(HVD_MSG_RANK_WATCH, "rank_watch", hvd_rank_msg, rank_fields);

static const hvd_field code_fields[] = {
    HVD_FIELD(hvd_code_msg, kind, HVD_F_U32),   HVD_FIELD(hvd_code_msg, argv, HVD_F_STRV),
    HVD_FIELD(hvd_code_msg, object, HVD_F_BIN), HVD_FIELD(hvd_code_msg, symbol, HVD_F_STR),
    HVD_FIELD(hvd_code_msg, arg, HVD_F_BIN),
};
const hvd_msg_desc hvd_code_req_desc = HVD_MSG_EMPTY(HVD_MSG_CODE, "code");
const hvd_msg_desc hvd_code_desc =
    HVD_MSG(HVD_MSG_CODE_REPLY, "code_reply", hvd_code_msg, code_fields);

static const hvd_field reach_fields[] = {
    HVD_FIELD(hvd_reach, to, HVD_F_U32),
    HVD_FIELD_LIST(hvd_reach, addrs, hvd_addr_desc),
};
static const hvd_msg_desc reach_desc = HVD_MSG(0, "reach", hvd_reach, reach_fields);
static const hvd_field reachable_fields[] = {
    HVD_FIELD(hvd_reachable_msg, from, HVD_F_U32),
    HVD_FIELD_LIST(hvd_reachable_msg, reach, reach_desc),
};
const hvd_msg_desc hvd_reachable_desc =
    HVD_MSG(HVD_MSG_REPORT_REACHABLE, "report_reachable", hvd_reachable_msg, reachable_fields);

static const hvd_field result_fields[] = {
    HVD_FIELD(hvd_result_msg, rank, HVD_F_I32),     HVD_FIELD(hvd_result_msg, index, HVD_F_U32),
    HVD_FIELD(hvd_result_msg, present, HVD_F_BOOL), HVD_FIELD(hvd_result_msg, status, HVD_F_I32),
    HVD_FIELD(hvd_result_msg, result, HVD_F_BIN),   HVD_FIELD(hvd_result_msg, error, HVD_F_STR),
    HVD_FIELD(hvd_result_msg, stopped, HVD_F_BOOL),
};
const hvd_msg_desc hvd_report_result_desc =
    HVD_MSG(HVD_MSG_REPORT_RESULT, "report_result", hvd_result_msg, result_fields);
const hvd_msg_desc hvd_register_result_desc =
    HVD_MSG(HVD_MSG_REGISTER_RESULT, "register_result", hvd_result_msg, result_fields);
const hvd_msg_desc hvd_result_desc =
    HVD_MSG(HVD_MSG_RESULT, "result", hvd_result_msg, result_fields);

static const hvd_field peers_fields[] = {
    HVD_FIELD(hvd_peers_msg, probe, HVD_F_BOOL),
    HVD_FIELD_LIST(hvd_peers_msg, tasks, hvd_task_info_desc),
};
const hvd_msg_desc hvd_registration_done_desc =
    HVD_MSG(HVD_MSG_REGISTRATION_DONE, "registration_done", hvd_peers_msg, peers_fields);

static const hvd_field run_fields[] = {
    HVD_FIELD(hvd_run_msg, command, HVD_F_STR),
    HVD_FIELD(hvd_run_msg, env_set, HVD_F_STRV),
    HVD_FIELD(hvd_run_msg, env_unset, HVD_F_STRV),
    HVD_FIELD(hvd_run_msg, prefix_output, HVD_F_BOOL),
    HVD_FIELD(hvd_run_msg, timestamps, HVD_F_BOOL),
    HVD_FIELD(hvd_run_msg, attach, HVD_F_BOOL),
};
const hvd_msg_desc hvd_run_desc =
    HVD_MSG(HVD_MSG_RUN_COMMAND, "run_command", hvd_run_msg, run_fields);

static const hvd_field exit_fields[] = {HVD_FIELD(hvd_exit_msg, exit_code, HVD_F_I32),
                                        HVD_FIELD(hvd_exit_msg, signal, HVD_F_I32)};
const hvd_msg_desc hvd_exit_desc = HVD_MSG(HVD_MSG_EXIT, "exit", hvd_exit_msg, exit_fields);

static const hvd_field status_fields[] = {
    HVD_FIELD(hvd_status_msg, started, HVD_F_BOOL),
    HVD_FIELD(hvd_status_msg, ended, HVD_F_BOOL),
    HVD_FIELD(hvd_status_msg, exit_code, HVD_F_I32),
};
const hvd_msg_desc hvd_status_desc =
    HVD_MSG(HVD_MSG_STATUS, "status", hvd_status_msg, status_fields);

const hvd_msg_desc hvd_attach_desc = HVD_MSG_EMPTY(HVD_MSG_ATTACH, "attach");
const hvd_msg_desc hvd_abort_desc = HVD_MSG_EMPTY(HVD_MSG_ABORT, "abort");
const hvd_msg_desc hvd_wait_exit_desc = HVD_MSG_EMPTY(HVD_MSG_WAIT_EXIT, "wait_exit");
const hvd_msg_desc hvd_command_status_desc =
    HVD_MSG_EMPTY(HVD_MSG_COMMAND_STATUS, "command_status");
const hvd_msg_desc hvd_resources_desc = HVD_MSG_EMPTY(HVD_MSG_RESOURCES, "resources");
const hvd_msg_desc hvd_get_result_desc = HVD_MSG_EMPTY(HVD_MSG_GET_RESULT, "get_result");
const hvd_msg_desc hvd_wait_shutdown_desc =
    HVD_MSG(HVD_MSG_WAIT_SHUTDOWN, "wait_shutdown", hvd_index_msg, index_fields);
static const hvd_field task_event_fields[] = {
    HVD_FIELD(hvd_task_event_msg, index, HVD_F_U32),
    HVD_FIELD(hvd_task_event_msg, kind, HVD_F_U32),
    HVD_FIELD(hvd_task_event_msg, exit_code, HVD_F_I32),
    HVD_FIELD(hvd_task_event_msg, signal, HVD_F_I32),
    HVD_FIELD(hvd_task_event_msg, text, HVD_F_STR),
};
const hvd_msg_desc hvd_task_event_desc =
    HVD_MSG(HVD_MSG_TASK_EVENT, "task_event", hvd_task_event_msg, task_event_fields);

static const hvd_field agent_fields[] = {HVD_FIELD(hvd_agent_msg, host_hash, HVD_F_STR),
                                         HVD_FIELD(hvd_agent_msg, pid, HVD_F_U32)};
const hvd_msg_desc hvd_agent_watch_desc =
    HVD_MSG(HVD_MSG_AGENT_WATCH, "agent_watch", hvd_agent_msg, agent_fields);

static const hvd_field agent_report_fields[] = {
    HVD_FIELD(hvd_agent_report_msg, host_hash, HVD_F_STR),
    HVD_FIELD(hvd_agent_report_msg, pid, HVD_F_U32),
    HVD_FIELD(hvd_agent_report_msg, index, HVD_F_I32),
    HVD_FIELD(hvd_agent_report_msg, started, HVD_F_BOOL),
    HVD_FIELD(hvd_agent_report_msg, exit_code, HVD_F_I32),
    HVD_FIELD(hvd_agent_report_msg, signal, HVD_F_I32),
    HVD_FIELD(hvd_agent_report_msg, lost, HVD_F_BOOL),
    HVD_FIELD(hvd_agent_report_msg, stopped, HVD_F_BOOL),
    HVD_FIELD(hvd_agent_report_msg, error, HVD_F_STR),
};
const hvd_msg_desc hvd_agent_report_desc =
    HVD_MSG(HVD_MSG_AGENT_REPORT, "agent_report", hvd_agent_report_msg, agent_report_fields);

static const hvd_field elastic_fields[] = {
    HVD_FIELD(hvd_elastic_msg, epoch, HVD_F_U64),
    HVD_FIELD(hvd_elastic_msg, hosts_updated, HVD_F_BOOL),
};
const hvd_msg_desc hvd_elastic_state_desc = HVD_MSG_EMPTY(HVD_MSG_ELASTIC_STATE, "elastic_state");
const hvd_msg_desc hvd_elastic_desc =
    HVD_MSG(HVD_MSG_ELASTIC, "elastic", hvd_elastic_msg, elastic_fields);

static const hvd_field commit_fields[] = {
    HVD_FIELD(hvd_commit_msg, id, HVD_F_U64),
    HVD_FIELD(hvd_commit_msg, size, HVD_F_U64),
    HVD_FIELD(hvd_commit_msg, state, HVD_F_BIN),
};
const hvd_msg_desc hvd_commit_state_desc =
    HVD_MSG(HVD_MSG_COMMIT_STATE, "commit_state", hvd_commit_msg, commit_fields);
const hvd_msg_desc hvd_latest_commit_desc = HVD_MSG_EMPTY(HVD_MSG_LATEST_COMMIT, "latest_commit");
const hvd_msg_desc hvd_commit_desc =
    HVD_MSG(HVD_MSG_COMMIT, "commit", hvd_commit_msg, commit_fields);

static const hvd_field commit_ref_fields[] = {HVD_FIELD(hvd_commit_ref_msg, id, HVD_F_U64)};
const hvd_msg_desc hvd_fetch_commit_desc =
    HVD_MSG(HVD_MSG_FETCH_COMMIT, "fetch_commit", hvd_commit_ref_msg, commit_ref_fields);
const hvd_msg_desc hvd_stop_command_desc = HVD_MSG_EMPTY(HVD_MSG_STOP_COMMAND, "stop_command");

const hvd_msg_desc *const hvd_proto_all[] = {
    &hvd_register_task_desc,
    &hvd_task_info_desc,
    &hvd_task_addrs_desc,
    &hvd_task_info_req_desc,
    &hvd_index_desc,
    &hvd_addrs_desc,
    &hvd_host_indices_desc,
    &hvd_indices_desc,
    &hvd_set_local_rank_desc,
    &hvd_index_by_rank_desc,
    &hvd_code_req_desc,
    &hvd_code_desc,
    &hvd_reachable_desc,
    &hvd_report_result_desc,
    &hvd_register_result_desc,
    &hvd_result_desc,
    &hvd_registration_done_desc,
    &hvd_run_desc,
    &hvd_exit_desc,
    &hvd_status_desc,
    &hvd_attach_desc,
    &hvd_abort_desc,
    &hvd_wait_exit_desc,
    &hvd_command_status_desc,
    &hvd_resources_desc,
    &hvd_get_result_desc,
    &hvd_wait_shutdown_desc,
    &hvd_agent_watch_desc,
    &hvd_rank_watch_desc,
    &hvd_agent_report_desc,
    &hvd_task_event_desc,
    &hvd_elastic_state_desc,
    &hvd_elastic_desc,
    &hvd_commit_state_desc,
    &hvd_latest_commit_desc,
    &hvd_commit_desc,
    &hvd_fetch_commit_desc,
    &hvd_stop_command_desc,
};
const size_t hvd_proto_count = sizeof hvd_proto_all / sizeof hvd_proto_all[0];

hvd_addr *hvd_addrs_from_list(const hvd_list *l, size_t *n) {
    *n = 0;
    if (l->n == 0) return NULL;
    hvd_addr *a = malloc(l->n * sizeof *a);
    if (!a) return NULL;
    memcpy(a, l->v, l->n * sizeof *a);
    *n = l->n;
    return a;
}
