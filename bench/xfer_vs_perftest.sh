#!/usr/bin/env bash
# Runs `eplb xfer-bench --op read` side by side with `ucx_perftest -t ucp_get`
# (Debian ucx-utils) on this machine: same block sizes, same iteration
# counts, same UCX transport, alternating per block size so that both see
# the same machine load. Prints one table with the bandwidth ratio.
#
# Usage: bench/xfer_vs_perftest.sh [--transport shm|tcp] [--sizes "4K 64K 1M 16M 64M"]
#                                  [--iterations N] [--build DIR] [--repeat R] [--pick median|best]
#   shm: UCX_TLS=posix,sysv,cma,self     tcp: UCX_TLS=tcp,self, UCX_NET_DEVICES=lo
# eplb runs twice per size: with --memory ucx --reuse-request (buffers
# allocated by UCX, as ucx_perftest allocates its own, and one request
# reposted, as perftest reposts its get: the like-for-like ratio) and with
# --memory user (heap buffers registered with register_memory, a request
# made and released per iteration).
# Bandwidth is in GB/s (10^9 bytes/s); ucx_perftest's MB/s (2^20 bytes/s) is
# converted. With --repeat R the two tools run R times, alternating, and each
# column shows the median of its R runs (--pick best: the best run instead).
# Two ratios: "overall" (bytes / wall time of the timed loop, what both tools
# print) and "p50" (block / median time of one request: perftest's 50%ile
# latency vs xfer-bench's median prepare+post+completion), which is robust
# to the process being descheduled on a loaded machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
transport=shm
sizes="4K 64K 1M 4M 16M 64M"
iterations=0
build="$root/build"
repeat=1
pick=median
while (($#)); do
  case "$1" in
    --transport) transport="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --iterations) iterations="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --pick) pick="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "xfer_vs_perftest.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
eplb="$build/eplb"
[[ -x "$eplb" ]] || { echo "xfer_vs_perftest.sh: $eplb not built (cmake --build $build --target eplb)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "xfer_vs_perftest.sh: ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 2; }

case "$transport" in
  shm) export UCX_TLS=posix,sysv,cma,self; unset UCX_NET_DEVICES; perftest_flags=() ;;
  tcp) export UCX_TLS=tcp,self; export UCX_NET_DEVICES=lo; perftest_flags=(-e) ;;  # -e: peer error handling, as eplb
  *) echo "xfer_vs_perftest.sh: --transport must be shm or tcp" >&2; exit 2 ;;
esac

bytes_of() {
  local text="$1" number="${1%[KMG]}"
  case "$text" in
    *K) echo $((number << 10)) ;;
    *M) echo $((number << 20)) ;;
    *G) echo $((number << 30)) ;;
    *) echo "$number" ;;
  esac
}

iterations_for() {  # ~4 GiB per run, 100..4000 (fewer made 16 MiB rows hinge on a few descheduled copies)
  local bytes="$1" n
  if ((iterations > 0)); then echo "$iterations"; return; fi
  n=$(((4 << 30) / bytes))
  ((n < 100)) && n=100
  ((n > 4000)) && n=4000
  echo "$n"
}

port=$((20000 + RANDOM % 20000))
perftest_gbps() {  # size_bytes iterations -> "GB/s_overall GB/s_at_p50" 
  local size="$1" n="$2" server_pid line
  port=$((port + 1))
  ucx_perftest -t ucp_get -s "$size" -n "$n" -w 5 -p "$port" "${perftest_flags[@]}" >/dev/null 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do
    line=$(timeout 120 ucx_perftest 127.0.0.1 -t ucp_get -s "$size" -n "$n" -w 5 -p "$port" "${perftest_flags[@]}" 2>/dev/null \
      | awk '/^Final:/ {print $7, $3}') && [[ -n "$line" ]] && break
    sleep 0.1
  done
  wait "$server_pid" 2>/dev/null || true
  read -r mbs p50 <<<"${line:-0 0}"
  awk -v mbs="$mbs" -v p50="$p50" -v size="$size" \
    'BEGIN {printf "%.3f %.3f", mbs * 1048576 / 1e9, (p50 > 0 ? size / (p50 * 1e3) : 0)}'
}

eplb_row() {  # size_text iterations memory [extra] -> "gbps latency_us prepare_us post_us gbps_at_p50"
  "$eplb" xfer-bench --op read --transport "$transport" --memory "$3" --block-sizes "$1" --iterations "$2" --warmup 5 --json ${4:-} \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print("%.3f %.2f %.2f %.2f %.3f" % (r["gigabytes_per_second"], r["average_latency_us"], r["prepare_us"], r["post_us"], r["block_bytes"] / (r["median_latency_us"] * 1e3)))'
}

best() { printf '%s\n' "$@" | sort -g | tail -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
pick() { if [[ "$pick" == best ]]; then best "$@"; else median "$@"; fi; }

echo "# eplb xfer-bench READ vs ucx_perftest -t ucp_get, transport $transport (UCX_TLS=$UCX_TLS), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %5s | %9s %9s %6s | %9s %9s %6s | %9s %6s %9s | %8s\n' block iters "perftest" "eplb ucx" ratio \
  "perftest" "eplb ucx" ratio "eplb user" ratio "user p50" "user p+p"
printf '%-6s %5s | %9s %9s %6s | %9s %9s %6s | %9s %6s %9s | %8s\n' "" "" "GB/s" "GB/s" overall \
  "p50 GB/s" "p50 GB/s" p50 "GB/s" overall "GB/s" "us"
for size_text in $sizes; do
  size=$(bytes_of "$size_text")
  n=$(iterations_for "$size")
  perftest_runs=() perftest_p50_runs=() ucx_runs=() ucx_p50_runs=() user_runs=() user_line=""
  for _ in $(seq "$repeat"); do
    read -r overall p50 <<<"$(perftest_gbps "$size" "$n")"
    perftest_runs+=("$overall"); perftest_p50_runs+=("$p50")
    read -r gbps _ _ _ p50 <<<"$(eplb_row "$size_text" "$n" ucx --reuse-request)"
    ucx_runs+=("$gbps"); ucx_p50_runs+=("$p50")
    line=$(eplb_row "$size_text" "$n" user)
    user_runs+=("${line%% *}")
    if [[ -z "$user_line" || "${line%% *}" == "$(best "${user_runs[@]}")" ]]; then user_line="$line"; fi
  done
  perftest=$(pick "${perftest_runs[@]}"); perftest_p50=$(pick "${perftest_p50_runs[@]}")
  ucx=$(pick "${ucx_runs[@]}"); ucx_p50=$(pick "${ucx_p50_runs[@]}")
  read -r user_gbps _ user_prepare user_post user_p50 <<<"$user_line"
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
  overhead=$(awk -v a="$user_prepare" -v b="$user_post" 'BEGIN {printf "%.2f", a + b}')
  printf '%-6s %5d | %9s %9s %6s | %9s %9s %6s | %9s %6s %9s | %8s\n' "$size_text" "$n" \
    "$perftest" "$ucx" "$(ratio "$ucx" "$perftest")" "$perftest_p50" "$ucx_p50" "$(ratio "$ucx_p50" "$perftest_p50")" \
    "$user_gbps" "$(ratio "$user_gbps" "$perftest")" "$user_p50" "$overhead"
done
