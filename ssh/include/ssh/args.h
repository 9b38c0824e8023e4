/* Parsing of an ssh-style command line, as Open MPI hands it to its rsh agent:
 *
 *     hvd-rsh [options] [user@]HOST [options] WORDS...
 *
 * (shared/reference/openmpi_rsh_agent.md, sections 0, 1c, 1d). Options are read before the
 * host and again after it, up to the first word that is not an option (or `--`), as OpenSSH
 * does: `-p 2222` may follow the host. The remaining words are joined with single spaces into
 * the remote command, each word kept as is (Open MPI's first word is " orted", with a leading
 * space). The host may also be given as ssh://[user@]host[:port].
 *
 * Understood options:
 *   -p PORT, -l USER, -i FILE (repeatable), -q, -v (repeatable), -x, -o KEY=VALUE or
 *   -o "KEY VALUE" with KEY one of (case-insensitive) StrictHostKeyChecking, UserKnownHostsFile,
 *   GlobalKnownHostsFile, HashKnownHosts, Port, User, IdentityFile, ConnectTimeout.
 * Accepted and ignored: every other -o KEY, every other flag OpenSSH knows
 * (46AaCfGgKkMNnsTtVXYy) and every other OpenSSH option that takes an argument
 * (bcDEeFIJLmOQRSWw: the argument is consumed). Any other letter is an error, as in ssh.
 *
 * As in OpenSSH, the first value given for a setting wins (`-l a b@host` logs in as a; `-p 1
 * -p 2` uses port 1), except for the lists (-i, IdentityFile) which accumulate. */
#ifndef HVD_SSH_ARGS_H
#define HVD_SSH_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#include "hvd/error.h"

/* Most identity files or known_hosts files one command line may name. */
#define HVD_SSH_ARGS_LIST_MAX 16

/* StrictHostKeyChecking as given on the command line. */
typedef enum hvd_ssh_hostkey_policy {
    HVD_SSH_HOSTKEY_UNSET = 0,  /* not given: the caller's default applies */
    HVD_SSH_HOSTKEY_STRICT,     /* yes / ask / true: unknown hosts are refused */
    HVD_SSH_HOSTKEY_ACCEPT_NEW, /* accept-new, and also no / off / false: unknown hosts are
                                   added; a changed key is refused in every case */
} hvd_ssh_hostkey_policy;

/* The parsed command line. Every string is owned by the struct (hvd_ssh_args_free). */
typedef struct hvd_ssh_args {
    char *host; /* host name or address, without user@ (never NULL) */
    char *user; /* login name, or NULL if none was given */
    int port;   /* 1..65535, or 0 if none was given */
    char *identity_files[HVD_SSH_ARGS_LIST_MAX];     /* -i / IdentityFile, in order, unexpanded */
    size_t n_identity_files;                         /* how many */
    char *user_known_hosts[HVD_SSH_ARGS_LIST_MAX];   /* UserKnownHostsFile words, unexpanded */
    size_t n_user_known_hosts;                       /* how many (0 = not given) */
    char *global_known_hosts[HVD_SSH_ARGS_LIST_MAX]; /* GlobalKnownHostsFile words */
    size_t n_global_known_hosts;                     /* how many (0 = not given) */
    hvd_ssh_hostkey_policy hostkey_policy;           /* StrictHostKeyChecking */
    int hash_known_hosts;                            /* HashKnownHosts: 1 yes, 0 no, -1 not given */
    int connect_timeout_ms;                          /* ConnectTimeout in ms, or 0 if not given */
    int verbose;                                     /* number of -v */
    bool quiet;                                      /* -q */
    char *command;  /* the words after the host joined by single spaces, or NULL if none */
    int first_word; /* argv index of the first command word, or argc if none */
} hvd_ssh_args;

/* Parses argv[1..argc-1] (argv[0] is the program) into *out. Returns 0, or -1 with err set
 * (code HVD_E_INVALID) and *out left empty: missing host, unknown option, option without its
 * argument, bad port, bad -o value. hvd_ssh_args_free(out) is safe to call either way. */
int hvd_ssh_args_parse(int argc, char *const argv[], hvd_ssh_args *out, hvd_err *err);

/* Frees every string in a and zeroes it. */
void hvd_ssh_args_free(hvd_ssh_args *a);

#endif
