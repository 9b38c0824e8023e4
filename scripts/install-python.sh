#!/usr/bin/env bash
# Creates, or reuses, the virtual environment of the Python tests and benchmarks (docs/python.md,
# tests/python, bench/compare): $HVD_VENV, default ~/.cache/hvd-bridge/venv, with the packages
# of scripts/python-requirements.txt (torch, pyspark, scikit-learn, cloudpickle, ...). The path is
# fixed so that CI machines that keep ~/.cache reuse it, and pip's cache, across runs.
# Idempotent: when the environment holds what the requirements file says it only checks (well
# under a second). Prints the environment's python on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${HVD_VENV:-$HOME/.cache/hvd-bridge/venv}
req=scripts/python-requirements.txt
python=${PYTHON:-python3}
stamp="$venv/.hvd-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
echo "install-python: preparing $venv (torch and pyspark: a few GB the first time)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "$venv/bin/python"
