#!/usr/bin/env bash
# Installs every Debian package eplb needs to build, test, benchmark and fuzz.
# Idempotent: packages already present are not reinstalled; `apt-get update`
# runs first whenever something has to be installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev libfmt-dev
  libucx-dev ucx-utils
  libopenmpi-dev openmpi-bin
  clang libclang-rt-14-dev libfuzzer-14-dev
  valgrind iproute2 procps
  # the Python package (docs/python.md): built by pip from Debian's interpreter, offline
  python3-dev python3-venv python3-pip python3-setuptools python3-wheel pybind11-dev
  python3-numpy python3-torch python3-pytest python3-matplotlib python3-prometheus-client
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all ${#packages[@]} packages present"
fi
