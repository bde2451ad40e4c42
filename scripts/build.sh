#!/usr/bin/env bash
# Configures and builds eplb. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# Default BUILD_DIR is build/ (Release). Example sanitizer build:
#   scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEPLB_SANITIZE=address,undefined
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$root/build}"
shift || true
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" "$@" >/dev/null
else
  cmake -S "$root" -B "$build_dir" "$@" >/dev/null
fi
# EPLB_BUILD_TARGETS="t1 t2": build only these targets (default: all).
targets=()
for target in ${EPLB_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" --parallel "${EPLB_JOBS:-$(nproc)}" "${targets[@]}"
