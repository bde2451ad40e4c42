#!/usr/bin/env bash
# Times a full rebalance (58 layers, 256 experts, 288 slots on 32 ranks) by
# every policy on the standard drifting trace, 4 nodes and 1 node, one thread
# (and 4 nodes on two threads), Google Benchmark medians; prints one table
# with each policy's CPU time, wall time, and its ratio to deepseek measured
# in the same run. Target (issue 5): every policy < 10 ms on one core.
#
# Usage: bench/policies.sh [BUILD_DIR]     (default: build/)
# Env:   EPLB_BENCH_REPETITIONS (5)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
repetitions="${EPLB_BENCH_REPETITIONS:-5}"
(( repetitions < 2 )) && repetitions=2  # medians need >= 2

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); fi
  cmake -S "$root" -B "$build" "${generator[@]}" >/dev/null
fi
cmake --build "$build" --target policies_bench --parallel "${EPLB_JOBS:-1}" >/dev/null

work="$(mktemp -d /tmp/eplb_policies_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$build/bench/policies_bench" --benchmark_format=csv --benchmark_repetitions="$repetitions" \
  --benchmark_report_aggregates_only=true 2>/dev/null >"$work/bench.csv"

# CSV: name,iterations,real_time,cpu_time,time_unit,...  Keep the medians.
awk -F, '
  $1 ~ /_median"?$/ {
    name = $1; gsub(/"/, "", name); sub(/^BM_Policy\//, "", name); sub(/_median$/, "", name)
    split(name, parts, "_"); policy = parts[1]; shape = substr(name, length(policy) + 2)
    cpu[policy, shape] = $4; wall[policy, shape] = $3; unit = $5
    if (!(shape in seen)) { seen[shape] = 1; shapes[++n] = shape }
    if (!(policy in known)) { known[policy] = 1; policies[++m] = policy }
  }
  END {
    printf "%-12s %-18s %10s %10s %12s %8s\n", "policy", "shape", "cpu (" unit ")", "wall", "cpu/deepseek", "< 10 ms"
    for (s = 1; s <= n; s++)
      for (p = 1; p <= m; p++) {
        key = policies[p] SUBSEP shapes[s]
        if (!(key in cpu)) continue
        ratio = cpu["deepseek", shapes[s]] > 0 ? cpu[key] / cpu["deepseek", shapes[s]] : 0
        printf "%-12s %-18s %10.2f %10.2f %11.1fx %8s\n", policies[p], shapes[s], cpu[key], wall[key], ratio,
               (cpu[key] < 10 ? "yes" : "NO")
      }
  }' "$work/bench.csv"
echo "(CPU time of the calling thread's process; wall time suffers when other work shares the cores)"
