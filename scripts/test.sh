#!/usr/bin/env bash
# Installs what is missing, builds hvd-bridge with warnings as errors, and runs the whole
# test suite with ctest.
#   scripts/test.sh                          plain build in build/
#   scripts/test.sh --sanitize address,undefined   (build-asan/, clang)
#   scripts/test.sh --sanitize thread               (build-tsan/, clang)
# Extra arguments after -- go to ctest (e.g. -- -R rpc).
# HVD_TEST_RECORD=FILE appends the run's outcome to FILE (see scripts/test-record.py).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh
bash scripts/install-spark.sh >/dev/null # pyspark from PyPI, for the Spark test
# Open MPI 5 and MPICH for the launcher tests (tests/e2e --mpi): PyPI wheels in fixed virtual
# environments; the tests skip with the reason when they cannot be installed.
bash scripts/install-mpi-wheels.sh all >/dev/null || true
# The Python package's tests run in a virtual environment with torch and pyspark (a fixed
# path, reused across runs: scripts/install-python.sh).
test_python=$(bash scripts/install-python.sh | tail -n 1)

cc_args=()
if [ -n "$sanitize" ]; then
  case "$sanitize" in
    thread) build=${build/#build/build-tsan} ;;
    *) build=${build/#build/build-asan} ;;
  esac
  cc_args=(-DCMAKE_C_COMPILER=clang -DHVD_SANITIZE="$sanitize")
fi

cmake -S . -B "$build" -DHVD_WERROR=ON -DHVD_TEST_PYTHON="$test_python" "${cc_args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
# HVD_TEST_RECORD=FILE: append this run's outcome to FILE (scripts/test-record.py; its doc
# command turns FILE into the sanitizer table of docs/reliability.md).
junit=$(mktemp)
trap 'rm -f "$junit"' EXIT
rc=0
(cd "$build" && ctest --output-on-failure --output-junit "$junit" "$@") || rc=$?
if [ -n "${HVD_TEST_RECORD:-}" ] && [ -s "$junit" ]; then
  python3 scripts/test-record.py add "$junit" "${sanitize:-plain}" "$HVD_TEST_RECORD"
fi
exit $rc
