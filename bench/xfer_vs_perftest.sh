#!/usr/bin/env bash
# Runs `eplb xfer-bench --op read` side by side with `ucx_perftest -t ucp_get`
# (Debian ucx-utils) on this machine: same block sizes, same iteration
# counts, same UCX transport, same CPUs, interleaved so that both see the
# same machine. Prints one table with the bandwidth ratio and how sure it is.
#
# Usage: bench/xfer_vs_perftest.sh [--transport shm|tcp] [--sizes "1M 4M 16M 64M"]
#                                  [--iterations N] [--repeat R] [--no-pin] [--no-quiet] [--user]
#                                  [--runs] [--aa] [--through-ucx] [--build DIR]
#   --transport  shm: UCX_TLS=posix,sysv,cma,self   tcp: UCX_TLS=tcp,self, UCX_NET_DEVICES=lo
#   --sizes      block sizes (K, M, G); default "4K 64K 1M 4M 16M 64M"
#   --iterations requests per run (default: ~4 GiB per run, 100..200000:
#                4K 200000 (a few ms), 64K 65536, 1M 4096, 64M 100)
#   --repeat     runs of each tool per size (default 9), in pairs: perftest
#                then eplb, eplb then perftest, ... (the order alternates)
#   --no-pin     do not pin; by default (2+ CPUs) the initiators (perftest
#                client, eplb) run on CPU 1 and the targets (perftest server,
#                eplb's forked target) on CPU 0
#   --no-quiet   skip the "quiet target" column (shm only): eplb again, with
#                its target sleeping 100 ms between progress calls
#                (xfer-bench's default) instead of 1 ms like perftest's server
#   --user       also run eplb with --memory user (heap buffers registered
#                with register_memory, a request made per iteration)
#   --runs       also print every pair's numbers
#   --through-ucx  eplb's READs go through ucp_get_nbx like perftest's
#                (xfer-bench --through-ucx); default: eplb copies mapped peer
#                memory with one memcpy in post (AgentConfig::copy_mapped_memory)
#   --aa         A/A calibration: ucx_perftest in place of eplb, i.e. perftest
#                against itself; its intervals show how wide the machine's
#                noise alone makes them
# eplb runs with --memory ucx --reuse-request --target-poll-ms 1: buffers
# allocated by UCX, as ucx_perftest allocates its own, one request reposted,
# as perftest reposts its get, and a target that wakes once a millisecond,
# as perftest's server does. Bandwidth is GB/s (10^9 B/s); perftest's MB/s (2^20 B/s)
# is converted. Columns: each tool's median GB/s over its R runs, "paired":
# the median of the R per-pair ratios eplb/perftest with a distribution-free
# ~95 % confidence interval for that median (order statistics), "p50": the
# same for block / median request time (perftest's 50th percentile latency
# vs xfer-bench's median post + completion of every 16th request), which ignores descheduled
# requests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
transport=shm
sizes="4K 64K 1M 4M 16M 64M"
iterations=0
build="$root/build"
repeat=9
pin=1
user=0
quiet=1
show_runs=0
aa=0
through_ucx=()
while (($#)); do
  case "$1" in
    --transport) transport="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --iterations) iterations="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --no-pin) pin=0; shift ;;
    --user) user=1; shift ;;
    --no-quiet) quiet=0; shift ;;
    --runs) show_runs=1; shift ;;
    --aa) aa=1; shift ;;
    --through-ucx) through_ucx=(--through-ucx); shift ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "xfer_vs_perftest.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
eplb="$build/eplb"
[[ -x "$eplb" ]] || { echo "xfer_vs_perftest.sh: $eplb not built (cmake --build $build --target eplb)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "xfer_vs_perftest.sh: ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "xfer_vs_perftest.sh: python3 missing" >&2; exit 2; }
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "xfer_vs_perftest.sh: --repeat must be a positive number" >&2; exit 2; }
(($(nproc) >= 2)) || pin=0
[[ "$transport" == shm && "$aa" == 0 ]] || quiet=0  # the target's sleep only matters over shm

case "$transport" in
  shm) export UCX_TLS=posix,sysv,cma,self; unset UCX_NET_DEVICES; perftest_flags=() ;;
  tcp) export UCX_TLS=tcp,self; export UCX_NET_DEVICES=lo; perftest_flags=(-e) ;;  # -e: peer error handling, as eplb
  *) echo "xfer_vs_perftest.sh: --transport must be shm or tcp" >&2; exit 2 ;;
esac
target_pin=() initiator_pin=() eplb_pin=()
if ((pin)); then
  target_pin=(taskset -c 0) initiator_pin=(taskset -c 1) eplb_pin=(--cpu 1 --target-cpu 0)
fi

bytes_of() {
  local text="$1" number="${1%[KMG]}"
  case "$text" in
    *K) echo $((number << 10)) ;;
    *M) echo $((number << 20)) ;;
    *G) echo $((number << 30)) ;;
    *) echo "$number" ;;
  esac
}

iterations_for() {  # ~4 GiB per run, 100..200000 (fewer made 16 MiB rows hinge on a few descheduled copies;
  # 4000 timed 4 KiB READs in 0.2 ms)
  local bytes="$1" n
  if ((iterations > 0)); then echo "$iterations"; return; fi
  n=$(((4 << 30) / bytes))
  ((n < 100)) && n=100
  ((n > 200000)) && n=200000
  echo "$n"
}

port=$((20000 + RANDOM % 20000))
perftest_run() {  # size_bytes iterations -> "GB/s_overall GB/s_at_p50"
  local size="$1" n="$2" server_pid line="" output
  port=$((port + 1))
  "${target_pin[@]}" ucx_perftest -t ucp_get -s "$size" -n "$n" -w 5 -p "$port" "${perftest_flags[@]}" >/dev/null 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do
    # The output is parsed after the run: nothing else starts while it runs.
    output=$(timeout 120 "${initiator_pin[@]}" ucx_perftest 127.0.0.1 -t ucp_get -s "$size" -n "$n" -w 5 -p "$port" \
      "${perftest_flags[@]}" 2>/dev/null) || true
    line=$(awk '/^Final:/ {print $7, $3}' <<<"$output")
    [[ -n "$line" ]] && break
    sleep 0.1
  done
  wait "$server_pid" 2>/dev/null || true
  [[ -n "$line" ]] || { echo "xfer_vs_perftest.sh: ucx_perftest gave no result for $size bytes" >&2; exit 1; }
  read -r mbs p50 <<<"$line"
  awk -v mbs="$mbs" -v p50="$p50" -v size="$size" \
    'BEGIN {printf "%.3f %.3f", mbs * 1048576 / 1e9, (p50 > 0 ? size / (p50 * 1e3) : 0)}'
}

eplb_run() {  # size_text iterations memory [extra...]; --aa: a perftest run in eplb's format
  if ((aa)); then
    echo "$(perftest_run "$(bytes_of "$1")" "$2") 0 0"
    return
  fi
  eplb_real_run "$@" "${through_ucx[@]}"
}

eplb_real_run() {  # size_text iterations memory [extra...] -> "GB/s_overall GB/s_at_p50 prepare_us post_us"
  local size_text="$1" n="$2" memory="$3" output
  shift 3
  # The JSON is parsed after the run: a python3 started beside it (a pipe)
  # took CPU from the timed loop and cut its overall GB/s by up to 20 %.
  output=$("$eplb" xfer-bench --op read --transport "$transport" --memory "$memory" --block-sizes "$size_text" \
    --iterations "$n" --warmup 5 --json "${eplb_pin[@]}" "$@")
  python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print("%.3f %.3f %.2f %.2f" % (r["gigabytes_per_second"], r["block_bytes"] / (r["median_latency_us"] * 1e3), r["prepare_us"], r["post_us"]))' <<<"$output"
}

# stdin: lines "perftest perftest_p50 eplb eplb_p50 [quiet quiet_p50] [user user_p50 user_overhead]"
# -> one table row (block text, iterations, quiet?, user? in $1..$4).
summarize() {
  python3 -c '
import statistics, sys
block, iterations, with_quiet, with_user = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
rows = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
def median_ci(values):
    """Median and a distribution-free ~95 % confidence interval (order statistics)."""
    v, n = sorted(values), len(values)
    half = 0.98 * n ** 0.5  # 1.96 * sqrt(n) / 2
    lo, hi = max(int((n + 1) / 2 - half), 1), min(int((n + 1) / 2 + half + 0.999), n)
    return statistics.median(v), v[lo - 1], v[hi - 1]
def ratio(a, b): return a / b if b > 0 else float("nan")
pt, pt50, ep, ep50 = ([r[i] for r in rows] for i in range(4))
paired, lo, hi = median_ci([ratio(e, p) for e, p in zip(ep, pt)])
paired50, lo50, hi50 = median_ci([ratio(e, p) for e, p in zip(ep50, pt50)])
line = "%-6s %5d %3d | %8.2f %8.2f %6.2f | %6.2f  [%4.2f, %4.2f] | %6.2f  [%4.2f, %4.2f]" % (
    block, iterations, len(rows), statistics.median(pt), statistics.median(ep),
    ratio(statistics.median(ep), statistics.median(pt)), paired, lo, hi, paired50, lo50, hi50)
at = 4
if with_quiet:
    quiet = [r[at] for r in rows]
    quiet_paired, quiet_lo, quiet_hi = median_ci([ratio(q, p) for q, p in zip(quiet, pt)])
    line += " | %8.2f %6.2f  [%4.2f, %4.2f]" % (statistics.median(quiet), quiet_paired, quiet_lo, quiet_hi)
    at += 2
if with_user:
    user = [r[at] for r in rows]
    line += " | %8.2f %6.2f %8.2f" % (statistics.median(user), ratio(statistics.median(user), statistics.median(pt)),
                                      statistics.median([r[at + 2] for r in rows]))
print(line)
' "$@"
}

echo "# eplb xfer-bench READ vs ucx_perftest -t ucp_get, transport $transport (UCX_TLS=$UCX_TLS), $(nproc) cores," \
  "$( ((pin)) && echo "initiators on CPU 1, targets on CPU 0" || echo "not pinned"), $repeat runs each," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
((aa)) && echo "# A/A calibration: the 'eplb' columns are a second ucx_perftest run"
header1=$(printf '%-16s | %8s %8s %6s | %-20s | %-20s' "block  iters   R" perftest eplb ratio \
  "paired eplb/perftest" "p50 eplb/perftest")
header2=$(printf '%-16s | %8s %8s %6s | %-20s | %-20s' "" GB/s GB/s "(med)" "median  [95% CI]" "median  [95% CI]")
if ((quiet)); then
  header1+=$(printf ' | %-29s' "eplb, quiet target")
  header2+=$(printf ' | %8s %-20s' GB/s "paired  [95% CI]")
fi
if ((user)); then
  header1+=$(printf ' | %8s %6s %8s' "eplb usr" ratio "usr p+p")
  header2+=$(printf ' | %8s %6s %8s' GB/s "" us)
fi
echo "$header1"
echo "$header2"
runs_text=""
for size_text in $sizes; do
  size=$(bytes_of "$size_text")
  n=$(iterations_for "$size")
  pairs=""
  for k in $(seq "$repeat"); do
    if ((k % 2)); then
      perftest=$(perftest_run "$size" "$n")
      read -r eplb_gbps eplb_p50 _ _ <<<"$(eplb_run "$size_text" "$n" ucx --reuse-request --target-poll-ms 1)"
    else
      read -r eplb_gbps eplb_p50 _ _ <<<"$(eplb_run "$size_text" "$n" ucx --reuse-request --target-poll-ms 1)"
      perftest=$(perftest_run "$size" "$n")
    fi
    pair="$perftest $eplb_gbps $eplb_p50"
    if ((quiet)); then
      read -r quiet_gbps quiet_p50 _ _ <<<"$(eplb_run "$size_text" "$n" ucx --reuse-request)"
      pair+=" $quiet_gbps $quiet_p50"
    fi
    if ((user)); then
      read -r user_gbps user_p50 user_prepare user_post <<<"$(eplb_run "$size_text" "$n" user)"
      pair+=" $user_gbps $user_p50 $(awk -v a="$user_prepare" -v b="$user_post" 'BEGIN {printf "%.2f", a + b}')"
    fi
    pairs+="$pair"$'\n'
    runs_text+="$size_text run $k: perftest $(cut -d' ' -f1-2 <<<"$perftest") | eplb $eplb_gbps $eplb_p50"
    ((quiet)) && runs_text+=" | quiet $quiet_gbps $quiet_p50"
    runs_text+=$'\n'
  done
  summarize "$size_text" "$n" "$quiet" "$user" <<<"$pairs"
done
if ((show_runs)); then
  echo "# every pair (GB/s overall, GB/s at p50):"
  printf '%s' "$runs_text"
fi
