#!/usr/bin/env bash
# Downloads, HERE (Debian 12, with apt's network), the Debian packages that building the Python
# extension eplb._eplb needs and that the GPU machine lacks, into gpu-deps/ (git-ignored), for
# bench/gpu_check.sh to unpack there with dpkg -x (or Python). Carry gpu-deps/ with the tree.
#
# Contract: what the build asks for (CMakeLists.txt, src/*/CMakeLists.txt, python/CMakeLists.txt):
#   find_package(nlohmann_json 3), find_package(CLI11), find_package(fmt)  (top level, always)
#   pkg_check_modules(UCX ucx) + find_package(PkgConfig), find_package(OpenSSL)  (src/xfer)
#   the plain library `xxhash` (src/common, src/migrate, python)
# and the shared libraries those load at run time (libucx0 -> libnuma1; libfmt9, libxxhash0,
# libssl3; libibverbs1/librdmacm1/libnl-* for UCX's optional InfiniBand modules). MPI is optional
# (bootstrap builds without it) and pybind11, Python, cmake and the compiler are there.
# Writes gpu-deps/*.deb and gpu-deps/MANIFEST (name version sha256). Idempotent.
# Usage: bash bench/gpu_deps.sh [DIR]   (default: gpu-deps in the repository root)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/gpu-deps}"
packages=(
  nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libxxhash-dev libxxhash0
  libucx-dev libucx0 libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libssl-dev libssl3 pkgconf pkgconf-bin libpkgconf3
)
mkdir -p "$dir"
cd "$dir"
for package in "${packages[@]}"; do
  if ! compgen -G "${package}_*.deb" >/dev/null; then
    timeout 120 apt-get download -qq "$package" 2> >(grep -v unsandboxed >&2)
  fi
done
for deb in *.deb; do
  printf '%s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)"
done >MANIFEST
echo "gpu-deps: $(ls *.deb | wc -l) packages, $(du -sh . | cut -f1) in $dir (Debian $(cat /etc/debian_version))"
