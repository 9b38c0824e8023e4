#!/usr/bin/env bash
# sshd-test-env.sh: a private OpenSSH server on a loopback address, for tests.
#
# Usage:
#   sshd-test-env.sh setup DIR ADDR PORT   generate keys and sshd_config into DIR (DIR must exist)
#   sshd-test-env.sh exec  DIR             exec sshd in the foreground (-D -e), logging to stderr;
#                                          for a parent that supervises it (and kills it)
#   sshd-test-env.sh start DIR ADDR PORT   setup, then start sshd in the background, wait until it
#                                          accepts connections; its pid goes to DIR/sshd.pid
#   sshd-test-env.sh stop  DIR             kill the sshd started by `start` (and wait for it)
#
# What `setup` leaves in DIR (all paths absolute):
#   ssh_host_ed25519_key{,.pub} ssh_host_ecdsa_key{,.pub}   host keys
#   id_ed25519{,.pub}      user key, listed in authorized_keys
#   id_other{,.pub}        user key NOT listed in authorized_keys (for "wrong key" tests)
#   authorized_keys        AuthorizedKeysFile for every user who logs in
#   sshd_config            the configuration (no PAM, no passwords, StrictModes off)
#   sshd.log               sshd's log (with `start`)
#
# The server accepts public-key logins of the user running it (root in CI). It needs
# /run/sshd (the privilege separation directory) when run as root; `setup` creates it.
#
# Exit codes: 0 ok, 1 failure, 2 usage, 77 "cannot run sshd here" (missing binaries, or sshd
# rejects its configuration), so a test can skip with that reason.
set -euo pipefail

die() {
    echo "sshd-test-env: $*" >&2
    exit 1
}
skip() {
    echo "sshd-test-env: SKIP: $*" >&2
    exit 77
}
usage() {
    sed -n '2,12p' "$0" >&2
    exit 2
}

find_sshd() {
    local p
    for p in "$(command -v sshd 2>/dev/null || true)" /usr/sbin/sshd /usr/local/sbin/sshd; do
        if [[ -n "$p" && -x "$p" ]]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

abs_dir() {
    [[ -d "$1" ]] || die "directory $1 does not exist"
    (cd "$1" && pwd -P)
}

cmd_setup() {
    local dir=$1 addr=$2 port=$3
    if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
        die "bad port '$port'"
    fi
    SSHD=$(find_sshd) || skip "sshd not found (install openssh-server)"
    command -v ssh-keygen >/dev/null || skip "ssh-keygen not found (install openssh-client)"

    # sshd refuses to start as root without its privilege separation directory.
    if [[ $(id -u) -eq 0 && ! -d /run/sshd ]]; then
        if ! mkdir -p /run/sshd || ! chmod 0755 /run/sshd; then
            skip "cannot create /run/sshd"
        fi
    fi

    local t
    for t in ed25519 ecdsa; do
        rm -f "$dir/ssh_host_${t}_key" "$dir/ssh_host_${t}_key.pub"
        ssh-keygen -q -t "$t" -N '' -C "hvd-test-host-$t" -f "$dir/ssh_host_${t}_key" \
            || die "ssh-keygen -t $t failed"
    done
    for t in id_ed25519 id_other; do
        rm -f "$dir/$t" "$dir/$t.pub"
        ssh-keygen -q -t ed25519 -N '' -C "hvd-test-$t" -f "$dir/$t" || die "ssh-keygen failed"
    done
    cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
    chmod 0600 "$dir/authorized_keys"

    # Only what the tests need; nothing is read from /etc/ssh.
    cat >"$dir/sshd_config" <<EOF
ListenAddress $addr:$port
HostKey $dir/ssh_host_ed25519_key
HostKey $dir/ssh_host_ecdsa_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY yes
PrintMotd no
PrintLastLog no
UseDNS no
LoginGraceTime 30
MaxStartups 64:30:128
MaxSessions 16
LogLevel VERBOSE
EOF
    local out
    if ! out=$("$SSHD" -t -f "$dir/sshd_config" 2>&1); then
        skip "sshd -t rejects the test configuration: $out"
    fi
}

cmd_exec() {
    local dir=$1
    [[ -f "$dir/sshd_config" ]] || die "$dir/sshd_config missing: run setup first"
    SSHD=$(find_sshd) || skip "sshd not found (install openssh-server)"
    # -D: stay in the foreground (the caller owns the process); -e: log to stderr.
    exec "$SSHD" -D -e -f "$dir/sshd_config"
}

# Succeeds once something accepts TCP connections on ADDR:PORT.
port_open() {
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

cmd_start() {
    local dir=$1 addr=$2 port=$3
    cmd_setup "$dir" "$addr" "$port"
    if port_open "$addr" "$port"; then
        die "something already listens on $addr:$port"
    fi
    rm -f "$dir/sshd.pid"
    # Started in the foreground (-D) in the background of this script, so that its pid is known
    # at once and `stop` kills exactly this process.
    "$SSHD" -D -E "$dir/sshd.log" -f "$dir/sshd_config" </dev/null >/dev/null 2>&1 &
    local pid=$!
    echo "$pid" >"$dir/sshd.pid.start"
    local i
    for ((i = 0; i < 100; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null || true
            die "sshd exited at startup; log: $(tail -n 5 "$dir/sshd.log" 2>/dev/null | tr '\n' ' ')"
        fi
        if port_open "$addr" "$port" && kill -0 "$pid" 2>/dev/null; then
            echo "$pid" >"$dir/sshd.pid"
            rm -f "$dir/sshd.pid.start"
            echo "$pid"
            return 0
        fi
        sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    die "sshd did not start listening on $addr:$port within 5 s"
}

cmd_stop() {
    local dir=$1 pid f
    for f in "$dir/sshd.pid" "$dir/sshd.pid.start"; do
        [[ -f "$f" ]] || continue
        pid=$(cat "$f")
        rm -f "$f"
        [[ "$pid" =~ ^[0-9]+$ ]] || continue
        kill -TERM "$pid" 2>/dev/null || continue
        local i
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

[[ $# -ge 2 ]] || usage
cmd=$1
DIR=$(abs_dir "$2")
case "$cmd" in
setup)
    [[ $# -eq 4 ]] || usage
    cmd_setup "$DIR" "$3" "$4"
    ;;
exec)
    [[ $# -eq 2 ]] || usage
    cmd_exec "$DIR"
    ;;
start)
    [[ $# -eq 4 ]] || usage
    cmd_start "$DIR" "$3" "$4"
    ;;
stop)
    [[ $# -eq 2 ]] || usage
    cmd_stop "$DIR"
    ;;
*) usage ;;
esac
