#!/usr/bin/env bash
# Installs Apache Spark for the Spark tests (tests/spark) and the Spark example
# (examples/spark): the `pyspark` package from PyPI carries Spark's jars (pyspark/jars) and
# its launch scripts (pyspark/bin, pyspark/sbin); SPARK_HOME is the package directory.
# Spark 3.5 supports Java 8, 11 and 17 (the JDK of the build machines is 17).
# Idempotent: when the right version is already installed it only checks (about 0.1 s).
# Prints SPARK_HOME on the last line of stdout.
set -euo pipefail

version=3.5.7
python=${PYTHON:-python3}

spark_home() {
  # Reads the installed version from the package metadata without importing pyspark (fast).
  "$python" - "$version" <<'PY'
import sys, importlib.metadata as md, importlib.util, os
try:
    if md.version("pyspark") != sys.argv[1]:
        sys.exit(1)
except md.PackageNotFoundError:
    sys.exit(1)
spec = importlib.util.find_spec("pyspark")
print(os.path.dirname(spec.origin))
PY
}

if home=$(spark_home 2>/dev/null); then
  echo "$home"
  exit 0
fi

echo "install-spark: installing pyspark==$version with $python -m pip" >&2
"$python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "pyspark==$version" >&2
home=$(spark_home)
# pip does not always keep the execute bits of the launch scripts.
chmod +x "$home"/bin/* "$home"/sbin/* 2>/dev/null || true
echo "$home"
