#!/usr/bin/env bash
# Effective migration bandwidth of `eplb run` (4 ranks, 8 MiB experts, UCX
# shared memory) next to single-thread memcpy of the same bytes, measured in
# the same run. "Migration" is end to end per round: checksums, READs,
# local copies, verification, vote and commit, on all ranks in parallel;
# bytes are everything moved (local copies + reads within + across nodes).
# Target: ratio >= 0.5.
# Usage: [LAYERS=4] [ROUNDS=5] bench/migrate_bandwidth.sh [BUILD_DIR] [extra eplb run options...]
# Prints one row per round and the median, mean and lowest ratio.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
shift || true
if [[ ! -x "$build/eplb" || ! -x "$build/bench/memcpy_bench" ]]; then
  cmake --build "$build" -j"${EPLB_JOBS:-1}" --target eplb memcpy_bench >/dev/null
fi
json="$(mktemp /tmp/eplb_bandwidth.XXXXXX.json)"
trap 'rm -f "$json"' EXIT
"$build/eplb" run --ranks 4 --nodes 2 --bytes-per-expert 8MiB --layers "${LAYERS:-4}" --rounds "${ROUNDS:-5}" \
  --json "$json" "$@" >/dev/null
python3 - "$json" "$build/bench/memcpy_bench" <<'PY'
import json, subprocess, sys
report = json.load(open(sys.argv[1]))
memcpy = sys.argv[2]
row = 8 << 20
print("%-5s  %10s  %9s  %14s  %14s  %6s" % ("round", "moved", "time", "migrate GB/s", "memcpy GB/s", "ratio"))
ratios = []
for r in report["rounds"]:
    moved, seconds = r["bytes_moved"], r["seconds"]
    out = subprocess.run([memcpy, "--bytes=%d" % moved, "--row=%d" % row, "--benchmark_format=json",
                          "--benchmark_min_time=0.2"], capture_output=True, text=True, check=True).stdout
    bench = json.loads(out)["benchmarks"][0]
    memcpy_gbs = bench["bytes_per_second"] / 1e9
    migrate_gbs = moved / seconds / 1e9 if seconds > 0 else 0.0
    ratio = migrate_gbs / memcpy_gbs if memcpy_gbs > 0 else 0.0
    ratios.append(ratio)
    print("%-5d  %7.2f GiB  %7.2f s  %14.2f  %14.2f  %6.2f" % (r["round"], moved / 2**30, seconds, migrate_gbs,
                                                                memcpy_gbs, ratio))
median = sorted(ratios)[len(ratios) // 2] if ratios else 0.0
print("all slots verified: %s; median ratio %.2f, mean %.2f, lowest %.2f (target >= 0.5)" %
      ("yes" if report["all_verified"] else "NO", median, sum(ratios) / max(len(ratios), 1),
       min(ratios) if ratios else 0.0))
PY
