/* The ssh transport (ssh/README.md): run one command on a plain host through OpenSSH's
 * protocol (libssh2), like `ssh host command`, so that hvd-rsh can stand in for ssh as Open
 * MPI's plm_rsh_agent on hosts that have no task service, and hvd-driver --ssh-hosts can start
 * task services on plain hosts.
 *
 * One call = one connection = one command:
 *   resolve -> TCP connect -> key exchange -> host key check (known_hosts) -> public key
 *   authentication (ssh-agent, then key files) -> "exec" channel -> stream stdout/stderr
 *   -> exit status.
 * Every step before the command runs has a deadline (connect_timeout_ms each), and every
 * wait is a poll() that also watches interrupt_fd, so nothing blocks forever. A host name (not
 * an address) is resolved on a short-lived thread so that the lookup obeys the deadline too
 * (an abandoned lookup finishes in the background and frees itself). Talking to ssh-agent over
 * its local socket is the one blocking exchange (libssh2 offers no other way). Once the command
 * runs there is no deadline: it runs as long as it runs, like ssh (TCP keepalive is on).
 *
 * Host keys follow OpenSSH's StrictHostKeyChecking=yes by default, or accept-new:
 *   - known key: accepted;
 *   - unknown host: refused, or with accept_new_host_keys appended to the first user
 *     known_hosts file (OpenSSH's accept-new) and accepted;
 *   - the host is known only with keys of other types: refused even with accept-new (the client
 *     asks for the known types first, so an honest server never gets here);
 *   - changed key or a key listed under @revoked: always refused.
 * Host key algorithms: the types known_hosts has for the host first, then OpenSSH's order
 * (ed25519, ECDSA, rsa-sha2-*); never SHA-1 "ssh-rsa"/"ssh-dss" nor certificates (OpenSSH 8.8+
 * defaults). Note: libssh2 1.10 has no rsa-sha2-* host keys, so with it a server that has only
 * an RSA host key cannot be reached (OpenSSH 8.8+ would not accept its "ssh-rsa" either).
 *
 * Stdin: the remote command's stdin is closed at once (like `ssh -n`); hvd-rsh's own stdin is
 * /dev/null under mpirun anyway. A caller may give a few bytes to send first (stdin_data), for
 * what must not appear on the remote command line, such as a job secret. No pty is requested,
 * so stdout and stderr stay separate.
 *
 * Interrupt (interrupt_fd readable, e.g. the process's signal pipe from common/sig.h; never
 * read here, and no signal handler is installed here): see hvd_ssh_run. */
#ifndef HVD_SSH_TRANSPORT_H
#define HVD_SSH_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "hvd/error.h"
#include "ssh/args.h"

#define HVD_SSH_DEFAULT_PORT               22
#define HVD_SSH_DEFAULT_CONNECT_TIMEOUT_MS 15000 /* per setup step */
#define HVD_SSH_DEFAULT_GRACE_MS           3000  /* interrupt: wait for the remote exit */
#define HVD_SSH_EXIT_FAILURE               255   /* exit code for "ssh itself failed" */

/* hvd_ssh_run's return value when interrupt_fd fired (0 = ran to the end, -1 = failed). */
#define HVD_SSH_INTERRUPTED 1

typedef struct hvd_ssh_options {
    const char *host; /* name or address to connect to (required) */
    int port;         /* TCP port; 0 = 22 */
    const char *user; /* login name; NULL = the user running this process */

    const char *const *identity_files; /* private key files to try, in order ("~/" expanded);
                                          NULL/0 = ~/.ssh/id_ed25519, id_ecdsa, id_rsa */
    size_t n_identity_files;           /* entries in identity_files */

    const char *const *user_known_hosts;   /* known_hosts files, the first receives new keys;
                                              NULL/0 = ~/.ssh/known_hosts. "none" = skip */
    size_t n_user_known_hosts;             /* entries in user_known_hosts */
    const char *const *global_known_hosts; /* read-only known_hosts files;
                                              NULL/0 = /etc/ssh/ssh_known_hosts */
    size_t n_global_known_hosts;           /* entries in global_known_hosts */

    bool accept_new_host_keys; /* OpenSSH's StrictHostKeyChecking=accept-new */
    bool hash_known_hosts;     /* write new entries hashed (HashKnownHosts=yes) */
    int connect_timeout_ms;    /* deadline of each setup step; 0 = the default above */

    bool use_agent;           /* try the keys of ssh-agent first (if a socket is known) */
    const char *agent_socket; /* the agent's socket; NULL = $SSH_AUTH_SOCK */

    const char *interrupt_signal; /* signal name for the remote command on interrupt, without
                                     "SIG" ("TERM", "INT", "HUP"...); NULL = "TERM" */
    int interrupt_grace_ms;       /* how long to wait for its exit status; 0 = default */
    bool interrupt_kill_exec;     /* on interrupt, also signal through a second exec channel;
                                     see hvd_ssh_run (off by default) */

    int verbose; /* > 0: progress lines ("hvd-rsh: debug1: ...") on err_fd */
    bool quiet;  /* no warnings (such as "Permanently added ...") on err_fd */

    const void *stdin_data; /* sent as the command's stdin, then EOF; NULL/0 = EOF at once. Keep
                               it within the channel window (a few KiB): it is written before
                               any output is read */
    size_t stdin_len;       /* bytes in stdin_data */
    int *started;           /* if non-NULL: set to 1 (atomic store) as soon as the server has
                               accepted the command, so that a caller can tell "failed before
                               anything ran" from "ran"; never reset */
} hvd_ssh_options;

/* Sets the defaults: everything zero/NULL except use_agent = true. */
void hvd_ssh_options_init(hvd_ssh_options *opt);

/* Fills opt from a parsed command line (on top of hvd_ssh_options_init): host, port, user,
 * identity files, known_hosts files, StrictHostKeyChecking, HashKnownHosts, ConnectTimeout,
 * -v, -q. The strings stay owned by args, which must outlive opt. */
void hvd_ssh_options_from_args(hvd_ssh_options *opt, const hvd_ssh_args *args);

/* Runs command on opt->host as `ssh` would (the remote login shell runs it with -c).
 *
 * Remote stdout and stderr are written to out_fd and err_fd as they arrive (-1 discards).
 * These fds are used as they are (never switched to non-blocking: they may be shared with
 * mpirun); writes wait for POLLOUT in pieces of at most PIPE_BUF bytes. If a write fails
 * (EPIPE...), that stream's further output is discarded and the command keeps running; the
 * caller should ignore SIGPIPE. interrupt_fd may be -1.
 *
 * Returns:
 *   0  the command ran and ended: *exit_code is its exit status, or 128+N if it was killed by
 *      signal N. (A server that closes the channel without any exit status gives 0 here:
 *      libssh2 1.10 cannot tell that apart.)
 *   -1 the command could not be run: err says why in one line naming user@host:port and the
 *      step (resolve, connect, key exchange, host key verification, authentication, channel),
 *      *exit_code = 255 (like ssh).
 *   HVD_SSH_INTERRUPTED  interrupt_fd became readable. Before the command started: nothing
 *      ran, *exit_code = 255. After: the remote command is ended as far as the server allows:
 *        1. with libssh2 >= 1.11, a "signal" channel request (RFC 4254 6.9) for
 *           interrupt_signal; OpenSSH sshd >= 7.8 killpg()s the command's process group;
 *        2. with interrupt_kill_exec, if the command is still running (at once with libssh2
 *           1.10, which cannot send signal requests), a second exec channel on the same
 *           connection runs `pgrep -P $PPID` + `kill -SIG -- -PGID` for the sibling sessions,
 *           i.e. the process group of our command (sshd makes each session's shell a session
 *           leader). Needs a POSIX /bin/sh and pgrep on the server, and runs a forced command
 *           (authorized_keys command=, ForceCommand) a second time: hence opt-in;
 *        3. the exit status is awaited for interrupt_grace_ms while output keeps flowing;
 *        4. the channel is closed and the connection dropped. Without a pty, sshd sends no
 *           SIGHUP: the command only sees EOF on stdin (it already had that) and SIGPIPE/EPIPE
 *           at its next write to stdout/stderr. A command that neither writes nor was
 *           signalled keeps running until it ends by itself (exactly as with OpenSSH's ssh).
 *      *exit_code = the remote status if it arrived in time, else 255; err says what was done.
 */
int hvd_ssh_run(const hvd_ssh_options *opt, const char *command, int out_fd, int err_fd,
                int interrupt_fd, int *exit_code, hvd_err *err);

#endif
