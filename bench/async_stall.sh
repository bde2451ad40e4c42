#!/usr/bin/env bash
# What serving sees during rebalancing rounds, measured on `eplb run` as
# users run it: the same arguments three times side by side, in one
# invocation:
#   sync         eplb run                         (serving waits for the whole round)
#   async copy   eplb run --async --commit copy   (stall = time inside commit_ready/poll)
#   async swap   eplb run --async --commit swap   (commit = pointer swap; 2x expert memory)
# Prints per mode the median [min-max] over the rounds of the migration
# time, the serving stall per round (total and max; sync: the round), the
# step p50/p99 against serving_idle, inconsistent reads; then the ratios
# against the goals of issue 15: copy stall <= 0.35 x sync, swap stall
# <= 5 ms per round, 0 inconsistent reads.
#
# Usage: bench/async_stall.sh [BUILD_DIR] [ROUNDS] [-- EXTRA eplb run ARGS]
#        bench/async_stall.sh --engine [BUILD_DIR] [REPETITIONS]
#   --engine: the engine-level bench instead (Migrator::start with ranks as
#   threads over the loopback backend, no eplb run; sync vs async copy).
# Run it on a quiet machine (here: under flock /work/.cpu.lock) and state
# the load average with the figures. Files go to a temporary directory,
# removed however the script ends.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--engine" ]]; then
  build="${2:-$root/build}"
  exec "$build/bench/async_stall_bench" "${3:-7}"
fi
build="${1:-$root/build}"
rounds="${2:-5}"
shift $(($# < 2 ? $# : 2))
[[ "${1:-}" == "--" ]] && shift
# The shape: eplb run's defaults (4 ranks on 2 nodes, 8 layers x 72 slots,
# 1 MiB experts), the rounds asked for, and whatever the caller adds.
common=(run --rounds "$rounds" "$@")
serving=(--step-ms 5 --serve-share 0.25)
work="$(mktemp -d "${TMPDIR:-/tmp}/eplb_async_stall.XXXXXX")"
# No exec below: the EXIT trap must run to remove the reports.
trap 'rm -rf "$work"' EXIT
echo "async_stall: eplb ${common[*]} (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
"$build/eplb" "${common[@]}" --json "$work/sync.json" > "$work/sync.log" 2>&1 ||
  { cat "$work/sync.log"; exit 1; }
for mode in copy swap; do
  "$build/eplb" "${common[@]}" --async --commit "$mode" "${serving[@]}" --json "$work/$mode.json" \
    > "$work/$mode.log" 2>&1 || { cat "$work/$mode.log"; exit 1; }
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$root/bench/async_stall_table.py" "$work/sync.json" "$work/copy.json" "$work/swap.json"
