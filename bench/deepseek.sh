#!/usr/bin/env bash
# Times a full `deepseek` rebalance (58 layers) for the three serving shapes
# of issue 2 on 1 and 2 threads (Google Benchmark, median of repetitions),
# and the PyTorch port of DeepSeek's published algorithm
# (bench/deepseek_reference.py, median of several runs) on the same load in
# the same run; checks that both produce exactly the same phy2log, log2phy
# and logcnt; prints one table.
#
# Usage: bench/deepseek.sh [BUILD_DIR]     (default: build/)
# Env:   EPLB_BENCH_REPETITIONS (5), EPLB_PYTHON_REPEAT (5),
#        EPLB_PYTHON (/usr/bin/python3: Debian's python3-torch and python3-numpy;
#        without torch the Python peer is skipped with a message).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
repetitions="${EPLB_BENCH_REPETITIONS:-5}"
python_repeat="${EPLB_PYTHON_REPEAT:-5}"
python="${EPLB_PYTHON:-/usr/bin/python3}"
json_python="$(command -v python3 || echo "$python")"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); fi
  cmake -S "$root" -B "$build" "${generator[@]}" >/dev/null
fi
cmake --build "$build" --target deepseek_bench --parallel "${EPLB_JOBS:-1}" >/dev/null

work="$(mktemp -d /tmp/eplb_deepseek_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

"$build/bench/deepseek_bench" --benchmark_format=json --benchmark_repetitions="$repetitions" \
  --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 >"$work/bench.json"
"$build/bench/deepseek_bench" --dump "$work"

have_torch=0
if "$python" -c 'import torch, numpy' >/dev/null 2>&1; then
  have_torch=1
else
  echo "note: Python peer skipped: $python cannot import torch and numpy" \
       "(apt-get install python3-torch python3-numpy to measure it)" >&2
fi

# case name, replicas, groups, nodes, ranks
cases=("v3_hierarchical 288 8 4 32" "v3_one_node 288 8 1 32" "v3_36_ranks 288 8 3 36")
: >"$work/python.txt"
for entry in "${cases[@]}"; do
  read -r name replicas groups nodes ranks <<<"$entry"
  if ((have_torch)); then
    shape=(--replicas "$replicas" --groups "$groups" --nodes "$nodes" --ranks "$ranks")
    "$python" "$root/bench/deepseek_reference.py" place "$work/load.json" "${shape[@]}" --out "$work/$name.py.json"
    seconds="$("$python" "$root/bench/deepseek_reference.py" time "$work/load.json" "${shape[@]}" \
                 --repeat "$python_repeat")"
    ties="$("$python" "$root/bench/deepseek_reference.py" ties "$work/load.json" "${shape[@]}")"
    echo "$name $seconds $ties" >>"$work/python.txt"
  else
    echo "$name - - -" >>"$work/python.txt"
  fi
done

"$json_python" - "$work" <<'EOF'
import json, sys, os
work = sys.argv[1]
bench = json.load(open(os.path.join(work, "bench.json")))
median = {}
median_cpu = {}
counters = {}
for b in bench["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    # name: BM_DeepSeek/case:0/threads:1/real_time_median
    parts = dict(p.split(":") for p in b["run_name"].split("/")[1:] if ":" in p)
    key = (int(parts["case"]), int(parts["threads"]))
    unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    median[key] = b["real_time"] * unit
    median_cpu[key] = b["cpu_time"] * unit
    counters[key] = b
names = ["v3_hierarchical", "v3_one_node", "v3_36_ranks"]
shapes = ["L=58 E=256 R=288 G=8 N=4 P=32", "L=58 E=256 R=288 G=8 N=1 P=32", "L=58 E=256 R=288 G=8 N=3 P=36"]
variants = ["hierarchical", "hierarchical, 1 node", "global (8 % 3 != 0)"]
python, python_cpu, ties = {}, {}, {}
for line in open(os.path.join(work, "python.txt")):
    name, wall, cpu, rest = (line.rstrip("\n").split(" ", 3) + [""])[:4]
    python[name] = None if wall == "-" else float(wall)
    python_cpu[name] = None if cpu == "-" else float(cpu)
    ties[name] = json.loads(rest) if rest.strip().startswith("{") else None

def ms(seconds):
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"

exact_all = True
print(f"{'case':<16} {'shape':<30} {'variant':<21} {'eplb 1 thread':>13} {'eplb 2 threads':>14} "
      f"{'Python ref':>10} {'ratio':>6} | {'eplb CPU':>9} {'Python CPU':>10} {'ratio':>6} {'exact':>5}")
for i, name in enumerate(names):
    one, two = median[(i, 1)], median[(i, 2)]
    peer, peer_cpu = python.get(name), python_cpu.get(name)
    exact = "-"
    py_json = os.path.join(work, name + ".py.json")
    if peer is not None and os.path.exists(py_json):
        mine = json.load(open(os.path.join(work, name + ".json")))
        theirs = json.load(open(py_json))
        same = all(mine[k] == theirs[k] for k in ("phy2log", "log2phy", "logcnt"))
        exact = "yes" if same else "NO"
        exact_all &= same
    ratio = f"{peer / one:.0f}x" if peer else "-"
    cpu_one = median_cpu[(i, 1)]
    cpu_ratio = f"{peer_cpu / cpu_one:.0f}x" if peer_cpu else "-"
    print(f"{name:<16} {shapes[i]:<30} {variants[i]:<21} {ms(one):>13} {ms(two):>14} "
          f"{ms(peer):>10} {ratio:>6} | {ms(cpu_one):>9} {ms(peer_cpu):>10} {cpu_ratio:>6} {exact:>5}")
print()
c = counters[(0, 1)]
print(f"memory per call (v3_hierarchical, 1 thread): {int(c['allocs_per_call'])} allocations, "
      f"{c['alloc_bytes_per_call'] / 1024:.0f} KiB allocated (input {c['input_bytes'] / 1024:.0f} KiB); "
      f"peak RSS of the benchmark process {c['peak_rss_kib'] / 1024:.1f} MiB")
for i, name in enumerate(names):
    c = counters[(i, 1)]
    print(f"  {name}: {c['alloc_bytes_per_call'] / 1024:.0f} KiB per call "
          f"(most of it log2phy, whose width is the largest replica count)")
if any(ties.values()):
    version = next(t["torch"] for t in ties.values() if t)
    print(f"published code's default (unstable) torch sort, torch {version}, vs eplb's stable tie rule:")
    for name in names:
        t = ties.get(name)
        if t:
            print(f"  {name}: phy2log differs in {t['layers_differing']} of {t['layers']} layers; "
                  f"sorted rank loads identical: {'yes' if t['same_sorted_rank_loads'] else 'NO'}")
print(f"eplb: median of {os.environ.get('EPLB_BENCH_REPETITIONS', '5')} Google Benchmark repetitions; "
      f"Python: median of {os.environ.get('EPLB_PYTHON_REPEAT', '5')} runs, torch.set_num_threads(1). "
      "Left: wall time; right: CPU time of the timed thread (1 thread), robust when the machine is shared.")
sys.exit(0 if exact_all else 1)
EOF
