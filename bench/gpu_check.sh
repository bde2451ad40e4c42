#!/usr/bin/env bash
# The GPU check of issue 30 (docs/gpu.md, "The GPU check"), for a machine with an NVIDIA GPU, Python,
# torch with CUDA, cmake, a C++ compiler and pip, but none of eplb's C++ dependencies and no network.
#
# Contract:
# - Run in the repository root as `bash bench/gpu_check.sh`, with gpu-deps/ carried along (the .deb
#   files bench/gpu_deps.sh downloads on Debian 12). Bounded: every step runs under `timeout`, the
#   whole under GPU_CHECK_LIMIT_S seconds (default 450, inside an 8-minute slot).
# - Unpacks gpu-deps/*.deb (dpkg -x, else Python reads the ar archive) into a temporary prefix,
#   points CMake (CMAKE_PREFIX_PATH), pkg-config (PKG_CONFIG_PATH, .pc prefixes rewritten), the compiler (CPATH,
#   LIBRARY_PATH) and the loader (LD_LIBRARY_PATH) at it, and builds the extension with
#   `pip install --no-build-isolation --no-index --no-deps --target` (the interpreter that has torch
#   sees it through PYTHONPATH; no venv, so no ensurepip and no guessing which site has torch).
# - Debian 12's libraries need glibc >= the newest GLIBC_ symbol they use: if this machine's glibc is
#   older, it says so and skips the build; bench/gpu_check.py then runs what needs only torch (the
#   digest rows) and marks the rest "SKIP: extension not built (why)".
# - Results: $OUT/gpu_check.json (or ./gpu-check-out/) and the table on stdout. The temporary prefix
#   and build are removed on exit: nothing is left in /tmp or /dev/shm.
# - GPU_CHECK_ONLY=configure: unpack and run CMake's configure step only, and print where CMake found
#   each dependency (the simulated run on a machine without a GPU). GPU_CHECK_DEVICE: passed to
#   gpu_check.py --device (default auto: cuda when there is one).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
started=$(date +%s)
limit=${GPU_CHECK_LIMIT_S:-450}
out="${OUT:-$root/gpu-check-out}"
python=${PYTHON:-python3}
work="$(mktemp -d "${TMPDIR:-/tmp}/eplb-gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# Every temporary of Python and pip goes under $work too, so that a driver
# killed by `timeout` leaves nothing behind either.
export TMPDIR="$work"
prefix="$work/prefix"
arch=x86_64-linux-gnu  # Debian's multiarch directory of the amd64 packages, whatever this system calls it
mkdir -p "$out" "$prefix"

left() { echo $((limit - ($(date +%s) - started))); }
say() { echo "gpu_check: $*"; }

unpack_deps() {
  local debs=("$root"/gpu-deps/*.deb)
  [[ -e ${debs[0]} ]] || { say "no gpu-deps/*.deb (run bench/gpu_deps.sh on Debian 12 and carry gpu-deps/)"; return 1; }
  for deb in "${debs[@]}"; do
    if command -v dpkg >/dev/null && [[ -z ${GPU_CHECK_NO_DPKG:-} ]]; then
      dpkg -x "$deb" "$prefix"
    else  # a .deb is an ar archive holding data.tar.xz: Python reads both (no ar, no xz needed)
      "$python" - "$deb" "$prefix" <<'PY'
import io, sys, tarfile
blob = open(sys.argv[1], "rb").read()
at = 8  # "!<arch>\n", then 60-byte member headers
while at < len(blob):
    name, size = blob[at:at + 16].decode().strip().rstrip("/"), int(blob[at + 48:at + 58])
    if name.startswith("data.tar"):
        extra = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # keep the relative symlinks
        tarfile.open(fileobj=io.BytesIO(blob[at + 60:at + 60 + size])).extractall(sys.argv[2], **extra)
    at += 60 + size + size % 2
PY
    fi
  done
  local usr="$prefix/usr" lib="$prefix/usr/lib/$arch"
  find "$usr" -name '*.pc' -exec sed -i "s|^prefix *= */usr\$|prefix=$usr|; s|^prefix=/usr\$|prefix=$usr|" {} +
  export CMAKE_PREFIX_PATH="$usr:$lib${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$lib/pkgconfig:$usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CPATH="$usr/include:$usr/include/$arch${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v pkg-config >/dev/null || export PATH="$usr/bin:$PATH"
  say "unpacked ${#debs[@]} packages into $prefix"
}

glibc_ok() {  # 0 when this glibc is at least what the unpacked libraries ask for
  local have need dump
  have="$("$python" -c 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split()[1])')"
  dump="$(command -v objdump >/dev/null && echo 'objdump -T' || echo 'readelf --dyn-syms -W')"
  need="$(find "$prefix" -name '*.so*' -type f -exec $dump {} + 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' |
    sed 's/GLIBC_//' | sort -uV | tail -1)"
  say "glibc here $have; the Debian 12 libraries need ${need:-?}"
  [[ -z $need ]] || [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" == "$need" ]]
}

cmake_args() {  # pybind11 from pip is found through its own --cmakedir
  local pybind
  pybind="$("$python" -m pybind11 --cmakedir 2>/dev/null || true)"
  local lib="$prefix/usr/lib/$arch"  # named outright too: a non-Debian CMake does not search lib/<multiarch>
  echo "-DCMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH -DCMAKE_LIBRARY_PATH=$lib -Dfmt_DIR=$lib/cmake/fmt${pybind:+ -Dpybind11_DIR=$pybind}"
}

configure_only() {  # the simulated run: CMake's configure step, then where each dependency came from
  local build="$work/build"
  timeout "$(left)" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPLB_BUILD_TESTS=OFF \
    -DEPLB_BUILD_BENCH=OFF -DEPLB_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$python")" $(cmake_args) \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; return 1; }
  say "configured; found:"
  grep -E '^(fmt_DIR|nlohmann_json_DIR|CLI11_DIR|OPENSSL_INCLUDE_DIR|OPENSSL_CRYPTO_LIBRARY|pybind11_DIR|PKG_CONFIG_EXECUTABLE)[:=]' \
    "$build/CMakeCache.txt" | sed 's/:[A-Z]*=/ = /'
  grep -E '^(UCX_INCLUDEDIR|UCX_LIBDIR|UCX_VERSION)[:=]' "$build/CMakeCache.txt" | sed 's/:[A-Z]*=/ = /'
  say "xxhash (a plain -lxxhash and <xxhash.h>): through CPATH and LIBRARY_PATH: $(ls "$prefix"/usr/include/xxhash.h)"
}

build_extension() {  # prints nothing on success; the reason on failure
  local jobs log="$work/build.log"
  jobs=$(nproc)
  "$python" -c 'import setuptools' 2>/dev/null || { echo "setuptools is not installed for $python"; return 1; }
  if ! EPLB_PYTHON_BUILD_DIR="$work/build" EPLB_JOBS=$jobs EPLB_CMAKE_ARGS="$(cmake_args)" \
      timeout "$(($(left) - 120))" "$python" -m pip install --quiet --no-build-isolation --no-index --no-deps \
      --target "$work/site" "$root" >"$log" 2>&1; then
    tail -25 "$log" >&2
    echo "pip install failed (exit or timeout; log tail above)"
    return 1
  fi
  PYTHONPATH="$work/site" timeout 60 "$python" -c 'import eplb, eplb.planes' 2>"$work/import.log" ||
    { tail -5 "$work/import.log" >&2; echo "built, but import eplb failed: $(tail -1 "$work/import.log")"; return 1; }
}

main() {
  local why=""
  say "started $(date -u +%H:%M:%S) UTC, limit ${limit} s, out $out"
  unpack_deps || why="the dependencies could not be unpacked"
  if [[ -z $why ]] && ! glibc_ok; then
    why="this machine's glibc is older than Debian 12's libraries need: the extension cannot be built here"
    say "$why"
  fi
  if [[ ${GPU_CHECK_ONLY:-} == configure ]]; then
    [[ -z $why ]] && configure_only
    return
  fi
  if [[ -z $why ]]; then
    say "building the extension ($(nproc) jobs, at most $(($(left) - 120)) s)"
    why="$(build_extension)" || true
    [[ -z $why ]] && say "extension built in $(($(date +%s) - started)) s" || say "$why"
  fi
  local extension=()
  [[ -z $why ]] || extension=(--no-extension "$why")
  say "running bench/gpu_check.py (at most $(($(left) - 5)) s)"
  PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "$(($(left) - 5))" \
    "$python" "$root/bench/gpu_check.py" --out "$out/gpu_check.json" --device "${GPU_CHECK_DEVICE:-auto}" \
    --seconds "$(($(left) - 15))" "${extension[@]}"
}

main "$@"
