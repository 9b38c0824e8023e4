#!/usr/bin/env bash
# hvd-bridge against Horovod-on-Spark and ssh, on this machine, in one run (issue: side-by-side
# benchmarks). One command:
#
#   bash bench/compare/run.sh             full run (5 timed runs per cell, ~15-20 min on 2 cores),
#                                         then writes docs/performance.md's "Against Horovod on
#                                         Spark" section and docs/img/compare-*.png
#   bash bench/compare/run.sh --smoke     one run of each cell at the smallest sizes, checks that
#                                         every measure still works; writes nothing in docs/
#                                         (CI runs this)
#   extra arguments go to compare.py (e.g. --runs 7 --hosts 1,2,4,8,16)
#
# Sets up the peer from registries only: a virtual environment (build/compare-venv, with the
# system's site packages, where scripts/install-spark.sh put pyspark) gets horovod==0.28.1 from
# PyPI built without any framework plugin (HOROVOD_WITHOUT_*: only the pure-Python launcher is
# used), plus the packages horovod.spark imports (numpy<2, pyarrow<11, fsspec). Needs a build
# with the JNI layer (build/, as scripts/test.sh makes it), Open MPI, gnuplot, Java, sshd.
# Measure "pyspark" runs the Python package the build stages in build/python
# (PYTHONPATH) in that same environment, on the driver and the executors: its extension must
# have been built for the same Python version as python3's.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  shift
fi
build=$(realpath -m "${HVD_BUILD:-build}")
venv=$(realpath -m "${HVD_COMPARE_VENV:-$build/compare-venv}")
py=${PYTHON:-python3}

bash scripts/install-spark.sh >/dev/null
for t in mpirun gnuplot java sshd cc; do
  command -v "$t" >/dev/null || { echo "compare: $t is missing: run scripts/install-deps.sh" >&2; exit 2; }
done
# hvd-bridge.jar with org.hvdbridge.spark (HorovodSpark), which CMake adds when it finds Spark.
has_horovod_spark() {
  "$py" -c 'import sys, zipfile
sys.exit("org/hvdbridge/spark/HorovodSpark.class" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$1" 2>/dev/null
}
if [ ! -x "$build/bin/hvd-rsh" ] || ! has_horovod_spark "$build/lib/hvd-bridge.jar" ||
   ! ls "$build"/python/hvd_bridge/_core.*.so >/dev/null 2>&1; then
  echo "compare: building hvd-bridge in $build" >&2
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j"$(nproc)" >/dev/null
fi

if ! "$venv/bin/python" -c 'import horovod, horovod.spark' 2>/dev/null; then
  echo "compare: setting up $venv (horovod==0.28.1 from PyPI, no framework plugin)" >&2
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITHOUT_GLOO=1 "$venv/bin/pip" install --quiet --disable-pip-version-check \
    --no-cache-dir "horovod==0.28.1" "numpy<2" "pyarrow<11" fsspec >&2
  "$venv/bin/python" -c 'import horovod, horovod.spark, pyspark' ||
    { echo "compare: horovod.spark does not import in $venv" >&2; exit 1; }
fi

PYTHONPATH="$build/python" "$venv/bin/python" -c 'import hvd_bridge._core, hvd_bridge.spark' ||
  { echo "compare: $build/python/hvd_bridge does not import in $venv (built for another Python?)" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ $smoke = 1 ]; then
  "$py" bench/compare/compare.py --python "$venv/bin/python" --bin "$build/bin" \
    --jar "$build/lib/hvd-bridge.jar" \
    --runs 1 --rss-runs 1 --hosts 1,2 --spark-tasks 2 --pyspark-tasks 2 --pyspark-warmups 0 --stream-mib 16 \
    --pythonpath "$build/python" --json "$out/smoke.json" "$@"
  "$py" bench/compare/report.py "$out/smoke.json"
  echo "compare: smoke run passed"
else
  rc=0  # failed runs are listed in the tables too; the exit status says so afterwards
  "$py" bench/compare/compare.py --python "$venv/bin/python" --bin "$build/bin" \
    --jar "$build/lib/hvd-bridge.jar" \
    --pythonpath "$build/python" --json "$out/compare.json" "$@" || rc=$?
  [ -s "$out/compare.json" ] || exit "${rc/#0/1}"
  cp "$out/compare.json" docs/compare-results.json
  "$py" bench/compare/report.py docs/compare-results.json --doc docs/performance.md --plots docs/img
  exit $rc
fi
