#!/bin/sh
# Every program we ship answers --help on stdout with exit 0 and starts nothing (no rank
# output, nothing on stderr, done within 5 s), and turns an unknown option into one line on
# stderr that points at --help, with a non-zero exit.
# Usage: check_help.sh PROGRAM...
set -u
fail=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
ran='rank [0-9]+/[0-9]|[0-9]+ ranks, ' # what the examples print when they run
for prog in "$@"; do
    name=$(basename "$prog") bad=0
    timeout 5 "$prog" --help </dev/null >"$out" 2>"$err"
    rc=$?
    if [ "$rc" -ne 0 ] || [ -s "$err" ] || ! [ -s "$out" ]; then
        echo "FAIL $name --help: exit $rc, stderr: $(head -c 200 "$err")"
        bad=1
    elif grep -Eq "$ran" "$out"; then
        echo "FAIL $name --help ran something: $(grep -Em1 "$ran" "$out")"
        bad=1
    fi
    timeout 5 "$prog" --no-such-option </dev/null >"$out" 2>"$err"
    rc=$?
    lines=$(wc -l <"$err")
    if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -q -- "--help" "$err"; then
        echo "FAIL $name --no-such-option: exit $rc, $lines stderr line(s): $(head -c 200 "$err")"
        bad=1
    fi
    if [ "$bad" -eq 0 ]; then echo "ok   $name"; else fail=1; fi
done
exit "$fail"
