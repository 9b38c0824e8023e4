#!/usr/bin/env bash
# The rsh.py experiment of shared/seeds/001_*.txt (section 0x03), reproduced on this machine,
# then the same job through hvd-rsh --verbose. docs/experiments/rsh-experiment.md shows and
# explains the output.
#   scripts/rsh-experiment.sh [BUILD_DIR]      (default: build; run scripts/test.sh first)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"

# The seed's agent, as written (python -> python3): print what mpirun passes, run the rest.
cat > rsh.py <<'PY'
import os
import sys
import subprocess

if __name__ == '__main__':
  command = " ".join(sys.argv[0:])
  print(command)
  new_command = " ".join(sys.argv[2:])
  print(new_command)
  subprocess.Popen(new_command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
PY
echo "print('hello world')" > user_function.py

echo "=== 1. The seed's experiment: mpirun with rsh.py as the agent"
# Two "remote" hosts: loopback addresses that are not interface addresses, so mpirun treats
# them as remote and calls the agent (openmpi_rsh_agent.md section 6). They share this
# machine's hostname, hence rtc_hwloc_vmhole none (section 7).
# rsh.py exits 0 at once and leaves orted behind with a pipe nobody reads as its stdout and
# stderr. If that orted dies before it reports to mpirun, mpirun waits forever (section 5):
# this happened once in 9 runs on a loaded machine, hence the timeout.
rc=0
timeout 60 mpirun --allow-run-as-root -n 4 --host 127.0.0.2:2,127.0.0.3:2 \
  -mca plm_rsh_agent "python3 rsh.py" -mca oob_tcp_if_include lo -mca rtc_hwloc_vmhole none \
  python3 user_function.py || rc=$?
echo "--- mpirun exit status $rc$([ $rc = 124 ] && echo ' (hung: killed after 60 s)')"

echo
echo "=== 2. The same job through hvd-rsh --verbose, orted inside task services"
"$build/bin/hvd-driver" serve -np 4 --env-file job.env -- python3 "$work/user_function.py" \
  2> serve.log &
serve=$!
for _ in $(seq 100); do grep -q -- "--index" serve.log 2>/dev/null && break; sleep 0.1; done
secret_file=$(sed -n 's/.*HVD_SECRET_FILE=\([^ ]*\) hvd-task.*/\1/p' serve.log)
addrs=$(sed -n "s/.*--driver '\([^']*\)'.*/\1/p" serve.log)
# Two fake hosts of two tasks each. Each fake host also gets its own TMPDIR, as --local does:
# the orteds of both share this machine's hostname, so without it they share Open MPI's
# session directory and hwloc/PMIx files (openmpi_rsh_agent.md section 7; seen here as
# "PMIX ERROR: ERROR in file .../dstore_base.c at line 1709").
for i in 0 1 2 3; do
  host=experiment-host$((i / 2))
  mkdir -p "$work/tmp/$host"
  HVD_SECRET_FILE=$secret_file HVD_DRIVER_ADDRS=$addrs HVD_HOST_HASH=$host TMPDIR="$work/tmp/$host" \
    "$build/bin/hvd-task" --index $i 2>> tasks.log &
done
for _ in $(seq 100); do [ -s job.env ] && break; sleep 0.1; done
sleep 0.2
# shellcheck disable=SC1091
. ./job.env
# shellcheck disable=SC2086
timeout 120 mpirun --allow-run-as-root -np "$HVD_NP" -H "$HVD_HOSTS" -mca plm_rsh_agent "$HVD_RSH --verbose" \
  $HVD_MPIRUN_ARGS -mca btl_tcp_if_include "$HVD_IFACES" -mca oob_tcp_if_include "$HVD_IFACES" \
  "$HVD_EXEC"
wait $serve
echo "--- hvd-driver serve said:"
cat serve.log
