#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a bounded time.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      default 20
# Seeds come from fuzz/corpus/<name>/; new inputs go to a scratch copy, so a run does not
# change the repository (set HVD_FUZZ_KEEP=1 to merge what was found back into the seeds).
# Set HVD_FUZZ_RECORD=FILE to append one tab-separated line per target to FILE (date, target,
# seconds, executions, corpus size before and after, result): tests/faults/reldoc.py turns
# that file into the fuzzing table of docs/reliability.md.
# Exits non-zero if any target crashes, leaks or fails an assertion.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
build=${HVD_FUZZ_BUILD:-build-fuzz}
CC=clang cmake -S . -B "$build" -DHVD_FUZZ=ON -DHVD_SANITIZE=address,undefined -DHVD_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_frame fuzz_message fuzz_addrs fuzz_entry >/dev/null
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in frame message addrs entry; do
  mkdir -p "$scratch/$t"
  cp -r fuzz/corpus/$t/. "$scratch/$t/"
  echo "fuzz: fuzz_$t for ${secs}s"
  before=$(ls fuzz/corpus/$t | wc -l)
  result=ok
  if ! "$build/fuzz/fuzz_$t" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 \
      -artifact_prefix="$scratch/" "$scratch/$t" >"$scratch/$t.log" 2>&1; then
    echo "fuzz: fuzz_$t FAILED"; tail -40 "$scratch/$t.log"; status=1; result=FAILED
  else
    grep -E 'stat::number_of_executed_units' "$scratch/$t.log" | sed "s/^/fuzz: fuzz_$t /"
  fi
  if [ "${HVD_FUZZ_KEEP:-0}" = 1 ]; then
    "$build/fuzz/fuzz_$t" -merge=1 fuzz/corpus/$t "$scratch/$t" >/dev/null 2>&1 || true
  fi
  if [ -n "${HVD_FUZZ_RECORD:-}" ]; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log" | tail -1)
    printf '%s\tfuzz_%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%d)" "$t" "$secs" "${execs:-0}" \
      "$before" "$(ls fuzz/corpus/$t | wc -l)" "$result" >>"$HVD_FUZZ_RECORD"
  fi
done
exit $status
