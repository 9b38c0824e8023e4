#!/usr/bin/env bash
# Installs the Debian packages that hvd-bridge needs to build and test.
# Idempotent: when everything is present it only checks and exits (well under a second).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libmsgpack-dev libssl-dev libssh2-1-dev libjansson-dev libelf-dev
  openmpi-bin libopenmpi-dev
  openssh-server openssh-client
  clang libclang-rt-14-dev clang-format
  iproute2 procps psmisc python3 python3-venv strace valgrind
  gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
