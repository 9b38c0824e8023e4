#!/bin/sh
# Runs test_timeline on 2 ranks with HOROVOD_TIMELINE set, then validates the file.
# Usage: run_timeline.sh TEST_PROGRAM CHECK_SCRIPT
set -u
command -v python3 >/dev/null 2>&1 || { echo "skipped: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
HOROVOD_TIMELINE="$dir/timeline.json" "$HVD_MPIRUN" --oversubscribe -np 2 "$1" || exit 1
python3 "$2" "$dir/timeline.json"
