/* The task service's warm interpreter (hvd_task_config.warm_python; docs/elastic.md, "Warm
 * Python ranks"): `PY -m hvd_bridge._warm` started with the service, through the process
 * runner like the command (so nothing of it outlives the service), with the modules to
 * import and a Unix socket in a private directory. The command's environment names the
 * socket (HVD_WARM_SOCKET); hvd-exec hands it the ranks that run that interpreter. */
#include "warm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/fs.h"
#include "hvd/defaults.h"
#include "hvd/proto.h"
#include "state.h"

/* The interpreter's listening socket, bound here before the service registers: a rank that
 * comes before the interpreter has started (or finished importing) waits in the backlog
 * instead of finding no socket. -1 with a logged reason. */
static int warm_listen(hvd_task *t) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(t->warm_socket) >= sizeof sa.sun_path) {
        task_log(t, HVD_LOG_WARN, "no warm interpreter: its socket path %s is too long",
                 t->warm_socket);
        return -1;
    }
    memcpy(sa.sun_path, t->warm_socket, strlen(t->warm_socket) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
        task_log(t, HVD_LOG_WARN, "no warm interpreter: its socket %s: %s", t->warm_socket,
                 strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

int task_warm_prepare(hvd_task *t, const hvd_task_config *cfg, hvd_env_change ch[2]) {
    t->warm_fd = -1;
    if (!cfg->warm_python) return 0;
    t->warm_dir = task_temp_dir("hvd-warm");
    if (!t->warm_dir) {
        task_log(t, HVD_LOG_WARN, "no warm interpreter: cannot make a private directory for it");
        return 0;
    }
    snprintf(t->warm_socket, sizeof t->warm_socket, "%s/socket", t->warm_dir);
    t->warm_fd = warm_listen(t);
    if (t->warm_fd < 0) {
        hvd_remove_tree(t->warm_dir);
        free(t->warm_dir);
        t->warm_dir = NULL;
        return 0;
    }
    ch[0] = (hvd_env_change){HVD_WARM_SOCKET_ENV, t->warm_socket};
    ch[1] = (hvd_env_change){HVD_WARM_PYTHON_ENV, cfg->warm_python};
    return 2;
}

void task_warm_start(hvd_task *t, const hvd_task_config *cfg) {
    if (!t->warm_dir) return;
    char grace[16];
    snprintf(grace, sizeof grace, "%d", t->cfg.grace_ms);
    char *argv[] = {(char *)cfg->warm_python,
                    "-m",
                    "hvd_bridge._warm",
                    "--socket-fd",
                    "3",
                    "--imports",
                    (char *)(cfg->warm_imports ? cfg->warm_imports : HVD_WARM_IMPORTS_DEFAULT),
                    "--grace-ms",
                    grace,
                    NULL};
    hvd_proc_spec spec = {.argv = argv,
                          .envp = t->cmd_env,
                          .cwd = t->work_dir,
                          .pass_stdout = true,
                          .stdout_fd = 2,
                          .pass_stderr = true,
                          .stderr_fd = 2,
                          .cleanup_dir = t->warm_dir,
                          .extra_fds = &t->warm_fd,
                          .n_extra_fds = 1,
                          /* if it dies, what ended ranks left with it goes too */
                          .end_with_program = true};
    hvd_err err;
    t->warm = hvd_proc_start(&spec, &err);
    close(t->warm_fd); /* the interpreter's now; without it, ranks are refused and start cold */
    t->warm_fd = -1;
    if (t->warm)
        task_log(t, HVD_LOG_INFO, "warm interpreter %s (pid %d) importing %s", cfg->warm_python,
                 (int)hvd_proc_pid(t->warm), argv[6]);
    else
        task_log(t, HVD_LOG_WARN, "no warm interpreter (ranks start cold): %s", err.msg);
}

void task_warm_stop(hvd_task *t) {
    if (t->warm_fd >= 0) close(t->warm_fd); /* prepared, never started */
    t->warm_fd = -1;
    if (t->warm) hvd_proc_kill(t->warm); /* a warm interpreter has nothing to save */
    hvd_proc_free(t->warm);
    t->warm = NULL;
    if (t->warm_dir) hvd_remove_tree(t->warm_dir);
    free(t->warm_dir);
    t->warm_dir = NULL;
}
