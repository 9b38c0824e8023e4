#!/bin/sh
# Runs a program under mpirun and checks that it succeeded and that its combined output
# matches every given extended regular expression, and none of those written !REGEX.
# Usage: run_and_grep.sh NP PROGRAM [!]REGEX...
set -u
np=$1 prog=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$HVD_MPIRUN" --oversubscribe -np "$np" "$prog" >"$log" 2>&1
rc=$?
cat "$log"
[ "$rc" -eq 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
for re in "$@"; do
  case $re in
    !*) ! grep -Eq -- "${re#!}" "$log" || { echo "FAIL: output matches: ${re#!}"; exit 1; } ;;
    *) grep -Eq -- "$re" "$log" || { echo "FAIL: output does not match: $re"; exit 1; } ;;
  esac
done
echo "output matches all $# patterns"
