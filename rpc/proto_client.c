/* Connecting to the driver and to task services (include/hvd/proto.h). */
#include <stdlib.h>
#include <time.h>

#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "hvd/rpc.h"

/* Connects with a stagger between addresses, again when the service did not finish the
 * handshake in time (a busy service: the next try is likely to find it less busy), up to
 * HVD_CONNECT_ATTEMPTS times. */
static hvd_client *connect_patiently(hvd_client_config *cc, hvd_err *err) {
    cc->stagger_ms = HVD_CONNECT_STAGGER_MS;
    hvd_err local;
    if (!err) err = &local;
    hvd_client *c = NULL;
    for (int attempt = 0; !c && attempt < HVD_CONNECT_ATTEMPTS; attempt++) {
        if (attempt > 0) {
            struct timespec ts = {0, 100L * 1000000L * attempt};
            nanosleep(&ts, NULL);
        }
        c = hvd_client_connect(cc, err);
        if (!c && err->code != HVD_E_TIMEOUT) break;
    }
    return c;
}

hvd_client *hvd_driver_connect_env(hvd_secret *secret_out, hvd_err *err) {
    const char *text = getenv(HVD_DRIVER_ADDRS_ENV);
    if (!text || !*text) {
        hvd_err_set(err, HVD_E_INVALID,
                    "%s is not set: it must hold the driver's addresses (hvd-driver sets it for "
                    "mpirun and the task services)",
                    HVD_DRIVER_ADDRS_ENV);
        return NULL;
    }
    hvd_addr *addrs;
    size_t n;
    if (hvd_addrs_parse(text, &addrs, &n, err) != 0) {
        hvd_err_prefix(err, "%s: ", HVD_DRIVER_ADDRS_ENV);
        return NULL;
    }
    hvd_secret secret;
    if (hvd_secret_load_env(&secret, err) != 0) {
        free(addrs);
        return NULL;
    }
    hvd_client_config cc = {
        .service = HVD_DRIVER_SERVICE, .secret = secret, .addrs = addrs, .naddrs = n};
    hvd_client *c = connect_patiently(&cc, err);
    free(addrs);
    if (c && secret_out) *secret_out = secret;
    hvd_secret_wipe(&secret);
    hvd_secret_wipe(&cc.secret);
    return c;
}

hvd_client *hvd_task_connect(hvd_client *driver, const hvd_secret *secret, uint32_t index,
                             hvd_err *err) {
    hvd_index_msg req = {index};
    hvd_addrs_msg resp;
    if (hvd_client_call(driver, &hvd_task_addrs_desc, &req, &hvd_addrs_desc, &resp, 0,
                        HVD_CALL_RETRY, err) != 0)
        return NULL;
    char name[HVD_SERVICE_NAME_MAX];
    hvd_task_service_name(index, name);
    hvd_client_config cc = {
        .service = name, .secret = *secret, .addrs = resp.addrs.v, .naddrs = resp.addrs.n};
    hvd_client *c = NULL;
    if (resp.addrs.n == 0)
        hvd_err_set(err, HVD_E_NOT_FOUND, "the driver knows no address of task %u", index);
    else
        c = connect_patiently(&cc, err);
    hvd_msg_free(&hvd_addrs_desc, &resp);
    hvd_secret_wipe(&cc.secret);
    return c;
}
