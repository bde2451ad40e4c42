#!/usr/bin/env bash
# Sets up everything eplb needs to build, test, benchmark and fuzz: every
# Debian package, then the Python environment .venv from PyPI
# (scripts/setup_python.sh, pinned by requirements.lock).
# Idempotent: packages already present are not reinstalled (`apt-get update`
# runs first whenever something has to be installed), and .venv is made
# again only when requirements.lock changed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev libfmt-dev
  libucx-dev ucx-utils
  libssl-dev  # HMAC-SHA256 seals of agent metadata (src/xfer/metadata.cpp)
  libopenmpi-dev openmpi-bin
  clang libclang-rt-14-dev libfuzzer-14-dev
  valgrind iproute2 procps
  # the Python package's build (docs/python.md): Debian's interpreter and headers, pybind11;
  # its packages (torch, vllm, nixl, sglang, numpy, ...) come from PyPI (scripts/setup_python.sh)
  python3-dev python3-venv pybind11-dev
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

bash "$(dirname "${BASH_SOURCE[0]}")/setup_python.sh"
