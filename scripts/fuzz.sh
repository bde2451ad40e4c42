#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each one
# for SECONDS seconds (default 10) from a copy of its seed corpus in
# fuzz/corpus/<name>/ or fuzz/corpus/<name>_fuzzer/ (the repository corpus is
# never modified), with fuzz/dict/<name>.dict as dictionary if present.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   e.g. scripts/fuzz.sh 60 npy load_csv
# Exits non-zero if a target finds a crash, a leak, a timeout or an invariant
# violation; the reproducer is kept in build-fuzz/findings/<name>/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-10}"
shift || true
build="$root/build-fuzz"

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DEPLB_BUILD_FUZZERS=ON -DEPLB_BUILD_TESTS=OFF -DEPLB_BUILD_BENCH=OFF >/dev/null
else
  cmake -S "$root" -B "$build" >/dev/null
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  for source in "$root"/fuzz/*_fuzzer.cpp; do
    name="$(basename "$source" .cpp)"
    targets+=("${name%_fuzzer}")
  done
fi
build_targets=()
for name in "${targets[@]}"; do build_targets+=("${name}_fuzzer"); done
cmake --build "$build" --parallel "${EPLB_JOBS:-$(nproc)}" --target "${build_targets[@]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=()
for name in "${targets[@]}"; do
  corpus="$work/corpus/$name"
  findings="$build/findings/$name"
  mkdir -p "$corpus" "$findings"
  for seeds in "$root/fuzz/corpus/$name" "$root/fuzz/corpus/${name}_fuzzer"; do
    if [[ -d "$seeds" ]]; then cp -r "$seeds/." "$corpus/"; fi
  done
  dictionary=()
  for candidate in "$root/fuzz/dict/$name.dict" "$root/fuzz/dict/${name#*_}.dict"; do
    if [[ -f "$candidate" ]]; then dictionary=(-dict="$candidate"); break; fi
  done
  echo "fuzz: $name for ${seconds}s"
  if ! "$build/fuzz/${name}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      "${dictionary[@]}" -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" >"$work/$name.log" 2>&1; then
    failed+=("$name")
    tail -n 40 "$work/$name.log"
    echo "fuzz: $name FAILED; reproducer in $findings/"
  else
    runs=$(grep -E '^stat::number_of_executed_units' "$work/$name.log" | awk '{print $2}')
    echo "fuzz: $name ok (${runs:-?} runs, corpus $(ls "$corpus" | wc -l) files)"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean"
