#!/usr/bin/env bash
# Measures migrations on the emulated cluster (scripts/netns_cluster.sh),
# with and without the transfer schedule, side by side in one testbed, and
# writes what bench/cluster_validation.py compares with `eplb simulate`
# (issue 31; docs/scale.md "Validation").
#
#   bench/cluster_testbed.sh OUT_DIR HOSTS RANKS_PER_HOST RATE POLICY [REPEATS] [QUEUE_MS]
#   e.g. bench/cluster_testbed.sh /tmp/tb/h4r2 4 2 200mbit deepseek 3
#
# One configuration: P = HOSTS x RANKS_PER_HOST ranks, 4 layers, 4P experts
# in 6P slots (6 per rank), 1 MiB experts, 3 rounds of 20 steps of a
# lognormal trace (seed 7; 80 steps so that `eplb simulate` replays the
# same 3 rebalances). In one testbed, REPEATS (default 3) pairs of
# `eplb run`, alternating which of the two goes first: --transfer-schedule
# off and hosts. Then calibration pairs in testbeds at 10gbit: the same
# runs (the links no longer bind: what a changed layer costs besides the
# network, CPU included) and the same plans with 4 KiB experts (what it
# costs besides moving bytes at all). CALIBRATION_ONLY=1 redoes only these.
# Writes OUT_DIR/config.json, OUT_DIR/trace.npy, OUT_DIR/run-<mode>-<i>.json
# (eplb run --json) and OUT_DIR/links-<mode>-<i>.json (every host link's
# counters before and after the run). WITH_PYTHON=1: in the same testbed
# and pairs, the Python eplb.Migrator moves the same placements
# (bench/testbed_migrator.py; OUT_DIR/py-<mode>-<i>.json and
# links-py-<mode>-<i>.json; `bench/testbed_migrator.py report OUT_DIR`
# compares the two). SCHEDULE_MODES (default "off hosts") lists the
# --transfer-schedule values of each pair (e.g. "off hosts hosts-fenced";
# bench/testbed_modes.py compares them). SKIP_CALIBRATION=1 leaves the calibration testbeds out
# (a side-by-side comparison that bench/cluster_validation.py does not
# read). Needs root (network namespaces, tc);
# run under `flock /work/.cpu.lock`. Exit 77 when the testbed cannot be made.
set -euo pipefail
(($# >= 5)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
out="$1"; hosts="$2"; per_host="$3"; rate="$4"; policy="$5"; repeats="${6:-3}"; queue_ms="${7:-100}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
eplb="${EPLB:-$root/build/eplb}"
python="${PYTHON:-$root/.venv/bin/python}"
ranks=$((hosts * per_host))
experts=$((4 * ranks))
slots=$((6 * ranks))
mkdir -p "$out"
"$eplb" gen-load --layers 4 --experts "$experts" --dist lognormal --steps 80 --seed 7 --out "$out/trace.npy" >/dev/null
cat > "$out/config.json" <<JSON
{"hosts": $hosts, "ranks_per_host": $per_host, "rate": "$rate", "queue_ms": $queue_ms, "policy": "$policy",
 "layers": 4, "experts": $experts, "slots": $slots, "bytes_per_expert": 1048576, "rounds": 3, "window": 20,
 "repeats": $repeats}
JSON
run_args=(run --bootstrap mpi --nodes "$hosts" --layers 4 --experts "$experts" --replicas "$slots" --groups 1
          --trace "$out/trace.npy" --rounds 3 --window 20 --policy "$policy" --timeout 120)

# The job inside the testbed: pairs of runs, alternating the order.
job="$out/job.sh"
cat > "$job" <<'JOB'
set -euo pipefail
out="$1"; repeats="$2"; shift 2
read -r -a forward <<< "${SCHEDULE_MODES:-off hosts}"
backward=()
for ((m = ${#forward[@]} - 1; m >= 0; --m)); do backward+=("${forward[m]}"); done
for ((i = 1; i <= repeats; ++i)); do
  if ((i % 2)); then modes=("${forward[@]}"); else modes=("${backward[@]}"); fi
  for mode in "${modes[@]}"; do
    before="$("$CLUSTER_LINKS")"
    "$CLUSTER_MPIRUN" "$@" --transfer-schedule "$mode" --json "$out/run-$mode-$i.json" > "$out/run-$mode-$i.txt" 2>&1
    after="$("$CLUSTER_LINKS")"
    printf '{"before": %s, "after": %s}\n' "$before" "$after" > "$out/links-$mode-$i.json"
    [[ -f "$out/py_rank.sh" ]] || continue  # WITH_PYTHON=1 wrote it
    before="$("$CLUSTER_LINKS")"
    "$CLUSTER_MPIRUN" bash "$out/py_rank.sh" --schedule "$mode" --json "$out/py-$mode-$i.json" \
      > "$out/py-$mode-$i.txt" 2>&1
    after="$("$CLUSTER_LINKS")"
    printf '{"before": %s, "after": %s}\n' "$before" "$after" > "$out/links-py-$mode-$i.json"
  done
done
JOB
if [[ "${CALIBRATION_ONLY:-0}" != 1 ]]; then
  rm -f "$out/py_rank.sh" "$out"/py-*.json "$out"/py-*.txt "$out"/links-py-*.json  # no earlier run's rows
  if [[ "${WITH_PYTHON:-0}" == 1 ]]; then
    printf 'exec %q %q rank --trace %q --layers 4 --experts %d --slots %d --hosts %d --rounds 3 --window 20 --policy %q --bytes-per-expert 1048576 "$@"\n' \
      "$python" "$root/bench/testbed_migrator.py" "$out/trace.npy" "$experts" "$slots" "$hosts" "$policy" > "$out/py_rank.sh"
  fi
  "$root/scripts/netns_cluster.sh" -H "$hosts" -r "$per_host" --rate "$rate" --queue-ms "$queue_ms" \
    --script "$job" "$out" "$repeats" "$eplb" "${run_args[@]}" --bytes-per-expert 1MiB
fi
# Calibration: the same runs with links that do not bind (10gbit), and the
# same plans with 4 KiB experts (almost no bytes).
if [[ "${SKIP_CALIBRATION:-0}" == 1 ]]; then exit 0; fi
rm -rf "$out/calibration" "$out/calibration-4k"
mkdir -p "$out/calibration" "$out/calibration-4k"
"$root/scripts/netns_cluster.sh" -H "$hosts" -r "$per_host" --rate 10gbit --script "$job" "$out/calibration" 2 \
  "$eplb" "${run_args[@]}" --bytes-per-expert 1MiB
"$root/scripts/netns_cluster.sh" -H "$hosts" -r "$per_host" --rate 10gbit --script "$job" "$out/calibration-4k" 2 \
  "$eplb" "${run_args[@]}" --bytes-per-expert 4KiB
