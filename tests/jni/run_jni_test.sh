#!/bin/sh
# Runs one JVM test case: "run_jni_test.sh JAVA ARGS..." (tests/jni/CMakeLists.txt).
# Exits 77 (skip) where the JNI layer cannot be tested: a sanitizer build, no mpirun.
if [ -n "$HVD_SANITIZE" ]; then
    echo "skip: a JVM cannot host the $HVD_SANITIZE build of libhvd_jni.so"
    exit 77
fi
if ! command -v mpirun >/dev/null 2>&1; then
    echo "skip: mpirun (Open MPI) is not installed"
    exit 77
fi
exec "$@"
