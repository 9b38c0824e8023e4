/* hvd-keeper: the keeper of one command (keeper.h), exec'd by the process runner of hvd-task,
 * hvd-driver, hvd-exec and the JVM and Python libraries, so that a large owner (a JVM
 * executor) is not duplicated by a fork that lives as long as its command. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "keeper.h"

static const char usage[] =
    "usage: hvd-keeper --owner PID --grace-ms MS --extra-fds N [--done-pipe] [--fallbacks]\n"
    "                  [--end-with-command] [--cwd DIR] [--hostname NAME] [--cleanup-dir DIR]\n"
    "                  -- PROGRAM ARGV0 [ARG...]\n"
    "\n"
    "Keeps one command of hvd-bridge: runs PROGRAM in its own session and process group, reports\n"
    "its pid and exit code to its owner over descriptor 3, and ends it and every process it left\n"
    "(SIGTERM, SIGKILL after MS) when the owner asks or dies. The command has ended when PROGRAM\n"
    "and every process it left have exited; with --end-with-command, what PROGRAM left is ended\n"
    "(SIGTERM, SIGKILL after MS) as soon as PROGRAM exits. Not started by hand: the process\n"
    "runner of hvd-task, hvd-driver, hvd-exec and the JVM and Python libraries execs it with its\n"
    "descriptors in place (3 control socket, 4 and 5 the command's stdout and stderr, 6 the done\n"
    "pipe, 7.. the command's extra descriptors).\n"
    "\n"
    "Environment (read by the process runner that starts it):\n"
    "  HVD_KEEPER    the keeper program to run, or 'none': keep commands in a forked copy of\n"
    "                the owner instead (default: hvd-keeper in $HVD_BIN_DIR, else beside the\n"
    "                program or library that starts it, else 'none')\n";

int main(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    static struct keeper k;
    char why[256];
    if (hvd_keeper_parse_argv(&k, argc, argv, why, sizeof why) != 0) {
        fprintf(stderr,
                "hvd-keeper: %s (it is started by hvd-bridge's process runner, not by hand: "
                "hvd-keeper --help)\n",
                why);
        /* An owner waiting on descriptor 3 hears why (its stderr is /dev/null). */
        struct ctl_msg m = {MSG_FAIL, STEP_ARGS, 0};
        (void)send(KEEPER_FD_CTL, &m, sizeof m, MSG_NOSIGNAL);
        return 2;
    }
    hvd_keeper_run(&k);
}
