#!/usr/bin/env bash
# The `deepseek` policy against its two Python peers, measured side by side
# in one run on the four serving shapes of issue 16 (58 layers, 256
# experts, loads round(rand^4 * 1000) + 1):
#   - eplb (deepseek_bench, Google Benchmark, 1 and 2 threads),
#   - bench/deepseek_reference.py: DeepSeek's published algorithm in torch
#     (CPU, one thread), also the exactness check (phy2log, log2phy, logcnt),
#   - bench/deepseek_numpy.py: a numpy port in the style of vLLM's
#     DefaultEplbPolicy.
# Per shape, eplb then its peers run one after the other; every figure is
# the median of its repetitions with the [min-max] range, and the ratios are
# peer median / eplb median (1 thread) with the range
# [peer min / eplb max - peer max / eplb min]. The last lines give the
# weakest shape against the goals (1000x torch, 100x numpy).
#
# Usage: bench/deepseek.sh [--scale] [BUILD_DIR]     (default: build/)
#   --scale   instead: the scale table of deepseek_bench --scale
# Env: EPLB_BENCH_REPETITIONS (7), EPLB_PYTHON_REPEAT (5 for torch, 3x that
#      for numpy), EPLB_PYTHON (.venv/bin/python, made by scripts/setup_python.sh;
#      without torch and numpy the peers are skipped with a message).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scale=0
if [[ "${1:-}" == "--scale" ]]; then scale=1; shift; fi
build="${1:-$root/build}"
repetitions="${EPLB_BENCH_REPETITIONS:-7}"
python_repeat="${EPLB_PYTHON_REPEAT:-5}"
python="${EPLB_PYTHON:-$root/.venv/bin/python}"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); fi
  cmake -S "$root" -B "$build" "${generator[@]}" >/dev/null
fi
cmake --build "$build" --target deepseek_bench --parallel "${EPLB_JOBS:-1}" >/dev/null
if ((scale)); then exec "$build/bench/deepseek_bench" --scale "$repetitions"; fi

work="$(mktemp -d /tmp/eplb_deepseek_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$build/bench/deepseek_bench" --dump "$work"

have_peers=1
if ! "$python" -c 'import torch, numpy' >/dev/null 2>&1; then
  have_peers=0
  echo "note: Python peers skipped: $python cannot import torch and numpy" \
       "(bash scripts/setup_python.sh makes .venv with both)" >&2
fi

# case index, name, replicas, groups, nodes, ranks
cases=("0 v3_4_nodes 288 8 4 32" "1 v3_1_node 288 8 1 32" "2 v3_36_ranks 288 8 3 36" "3 v3_64_ranks 320 8 8 64")
: >"$work/peers.txt"
for entry in "${cases[@]}"; do
  read -r index name replicas groups nodes ranks <<<"$entry"
  "$build/bench/deepseek_bench" --benchmark_filter="BM_DeepSeek/case:$index/" --benchmark_format=json \
    --benchmark_repetitions="$repetitions" --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.2 >"$work/bench_$index.json"
  if ((have_peers)); then
    shape=(--replicas "$replicas" --groups "$groups" --nodes "$nodes" --ranks "$ranks")
    "$python" "$root/bench/deepseek_reference.py" place "$work/load.json" "${shape[@]}" --out "$work/$name.py.json"
    torch="$("$python" "$root/bench/deepseek_reference.py" time "$work/load.json" "${shape[@]}" --repeat "$python_repeat")"
    numpy="$("$python" "$root/bench/deepseek_numpy.py" time "$work/load.json" "${shape[@]}" \
               --repeat $((3 * python_repeat)))"
    ties="$("$python" "$root/bench/deepseek_reference.py" ties "$work/load.json" "${shape[@]}")"
    echo "$name $torch $numpy $ties" >>"$work/peers.txt"
  fi
done

"$(command -v python3 || echo "$python")" "$root/bench/deepseek_table.py" "$work"  # not exec: the EXIT trap removes $work
