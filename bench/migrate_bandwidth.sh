#!/usr/bin/env bash
# Effective migration bandwidth of `eplb run` (4 ranks, 8 MiB experts, UCX
# shared memory) next to single-thread memcpy DRAM to DRAM, measured in the
# same run. "Migration" is end to end per round: checksums, READs, local
# copies, verification of every received row, vote and commit, on all
# ranks in parallel (the slowest rank's time); the after-round full check
# of every slot is outside it. Bytes are everything moved (local copies +
# reads within + across nodes). The memcpy peer (bench/memcpy_bench) copies
# the same bytes in 8 MiB rows between two distinct buffers each at least
# 4x the last-level cache, one measurement per migration round.
# Also prints the CPU time other processes took during the migration run
# (above 10% of the cores: not a quiet measurement), and whether DAMON
# monitors memory here (on a shadow-paging VM it makes pages cold mid-run).
# Target (issue 16): median ratio >= 0.8.
# WARMUP=N (default 1): rounds run first and left out of the medians, shown
# on their own: a fresh run's first round also pays one-time costs (each
# peer page's first touch through its mapping).
# HUGEPAGES=N (root only): reserve N huge pages of 2 MiB (vm.nr_hugepages)
# for the run and put the previous count back after it, however it ends.
# UCX's System V allocation (UCX_SYSV_HUGETLB_MODE=try, its default) then
# puts the ranks' arenas on them; the run prints the arena's page size.
# 4 ranks at the default shape take about 1100 (copy) or 2100 (swap).
# Usage: [LAYERS=4] [ROUNDS=5] [WARMUP=1] [HUGEPAGES=N] bench/migrate_bandwidth.sh [BUILD_DIR]
#          [extra eplb run options...]
# Prints one row per round, then medians with min-max spread and the ratio
# of the medians, and where the slowest rank's time went (sum over layers).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
shift || true
if [[ ! -x "$build/eplb" || ! -x "$build/bench/memcpy_bench" ]]; then
  cmake --build "$build" -j"${EPLB_JOBS:-1}" --target eplb memcpy_bench >/dev/null
fi
json="$(mktemp /tmp/eplb_bandwidth.XXXXXX.json)"
hugepages_before=""
restore() {
  rm -f "$json"
  if [[ -n "$hugepages_before" ]]; then echo "$hugepages_before" > /proc/sys/vm/nr_hugepages; fi
}
trap restore EXIT
if [[ -n "${HUGEPAGES:-}" ]]; then
  [[ "$HUGEPAGES" =~ ^[0-9]+$ ]] || { echo "HUGEPAGES must be a count of 2 MiB pages, got '$HUGEPAGES'" >&2; exit 2; }
  hugepages_before="$(cat /proc/sys/vm/nr_hugepages)"
  if ! echo "$HUGEPAGES" 2>/dev/null > /proc/sys/vm/nr_hugepages; then
    hugepages_before=""
    echo "HUGEPAGES: cannot write /proc/sys/vm/nr_hugepages (needs root)" >&2
    exit 2
  fi
  echo "huge pages reserved for the run: $(cat /proc/sys/vm/nr_hugepages) of 2 MiB (asked $HUGEPAGES; was $hugepages_before)"
fi
warmup="${WARMUP:-1}"
rounds="${ROUNDS:-5}"
[[ "$warmup" =~ ^[0-9]+$ && "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "WARMUP must be >= 0 and ROUNDS >= 1" >&2; exit 2; }
python3 - "$json" "$build/bench/memcpy_bench" "$warmup" "$build/eplb" run --ranks 4 --nodes 2 --bytes-per-expert 8MiB \
  --layers "${LAYERS:-4}" --rounds "$((warmup + rounds))" --json "$json" "$@" <<'PY'
import json, os, resource, statistics, subprocess, sys, time


def busy_seconds():
    """CPU seconds every process on this machine has used (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:8]]
    return (sum(fields[:3]) + sum(fields[4:7])) / os.sysconf("SC_CLK_TCK")


def damon_monitoring():
    """True when a DAMON kdamond runs here (its access checks clear page-table accessed bits)."""
    root = "/sys/kernel/mm/damon/admin/kdamonds"
    try:
        return any(open(os.path.join(root, k, "state")).read().strip() == "on" for k in os.listdir(root)
                   if k.isdigit())
    except OSError:
        return False


def children_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# The ranks share the cores with whatever else runs here. flock keeps other
# benchmarks and builds out, not other work (and nice does not help against
# another login session's processes while the kernel groups tasks per
# session, sched_autogroup), so the run reports how much CPU went elsewhere.
busy, own, start = busy_seconds(), children_seconds(), time.monotonic()
subprocess.run(sys.argv[4:], stdout=subprocess.DEVNULL, check=True)
wall = time.monotonic() - start
other = max(0.0, (busy_seconds() - busy) - (children_seconds() - own))
cores = os.cpu_count() or 1
report = json.load(open(sys.argv[1]))
memcpy = sys.argv[2]
warmup = int(sys.argv[3])
for r in report["rounds"][:warmup]:
    print("warm-up round %d: %.2f GiB in %.3f s, %.2f GB/s (left out below)" %
          (r["round"], r["bytes_moved"] / 2**30, r["seconds"], r["bytes_moved"] / max(r["seconds"], 1e-9) / 1e9))
rounds = [r for r in report["rounds"][warmup:] if r["bytes_moved"] > 0 and r["seconds"] > 0]
if not rounds:
    sys.exit("no measured round moved any bytes")
print("%-5s  %10s  %9s  %14s  %14s  %6s" % ("round", "moved", "time", "migrate GB/s", "memcpy GB/s", "ratio"))
migrate, copy = [], []
for r in rounds:
    out = subprocess.run([memcpy, "--bytes=%d" % r["bytes_moved"], "--row=%d" % (8 << 20), "--benchmark_format=json",
                          "--benchmark_min_time=0.3"], capture_output=True, text=True, check=True).stdout
    copy.append(json.loads(out)["benchmarks"][0]["bytes_per_second"] / 1e9)
    migrate.append(r["bytes_moved"] / r["seconds"] / 1e9)
    print("%-5d  %7.2f GiB  %7.3f s  %14.2f  %14.2f  %6.2f" % (r["round"], r["bytes_moved"] / 2**30, r["seconds"],
                                                                migrate[-1], copy[-1], migrate[-1] / copy[-1]))
phases = {}
for r in rounds:
    for layer in r.get("layers", []):
        for key, value in layer.items():
            if key.startswith("seconds_"):
                phases.setdefault(key[8:], []).append(value)
if phases:
    print("time per round in phases (sum over layers, one rank): " +
          ", ".join("%s %.3f s" % (k, sum(v) / len(rounds)) for k, v in phases.items()))
ratio = statistics.median(migrate) / statistics.median(copy)
print("migrate median %.2f GB/s (%.2f-%.2f), memcpy DRAM->DRAM median %.2f GB/s (%.2f-%.2f), %d rounds" %
      (statistics.median(migrate), min(migrate), max(migrate), statistics.median(copy), min(copy), max(copy),
       len(rounds)))
share = other / (wall * cores)
print("other work on this machine during the migration run: %.1f of %.1f CPU-seconds (%.0f%% of %d cores)%s" %
      (other, wall * cores, 100 * share, cores, "; NOT A QUIET MEASUREMENT" if share > 0.1 else ""))
if damon_monitoring():
    print("DAMON (kdamond) monitors memory on this machine: on a shadow-paging VM its access checks make pages "
          "cold again mid-run, and a layer that reads them stalls (docs/migrate.md, Bandwidth)")
page = report.get("arena_page_bytes", 0)
print("rank 0's arena pages: %s" % ("%d KiB%s" % (page // 1024, " (huge pages)" if page > 4096 else "")
                                    if page else "unknown"))
print("all slots verified: %s; ratio of medians %.2f, per-round ratios %.2f-%.2f (target >= 0.8)" %
      ("yes" if report["all_verified"] else "NO", ratio, min(m / c for m, c in zip(migrate, copy)),
       max(m / c for m, c in zip(migrate, copy))))
PY
