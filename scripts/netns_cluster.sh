#!/usr/bin/env bash
# A cluster of emulated hosts with real NIC limits, on one machine (issue 31;
# docs/scale.md "The testbed"): 2 to 8 network namespaces as hosts, joined by
# a bridge in a namespace of its own (the switch), each host's link shaped
# with a token bucket to --rate in both directions, ranks placed per host,
# and MPI jobs run across them as in scripts/netns_mpirun.sh.
#
#   scripts/netns_cluster.sh [-H HOSTS] [-r RANKS_PER_HOST] [--rate RATE] [--] COMMAND [ARGS...]
#   scripts/netns_cluster.sh [-H HOSTS] [-r RANKS_PER_HOST] [--rate RATE] --script FILE [ARGS...]
#   e.g. scripts/netns_cluster.sh -H 4 -r 2 --rate 200mbit -- build/eplb run --bootstrap mpi --nodes 4
#
# What it builds (everything is removed on exit, also on Ctrl-C or TERM):
#   namespace <prefix>sw  "switch": bridge br0 with ports p0..p(H-1)
#   namespace <prefix>hI  "host" eplb-hostI: interface eplb0 = 10.78.0.(I+1)/24,
#                         the other end of a veth pair, port pI on br0
#   shaping: `tc tbf` at --rate (default 200mbit) on eplb0 (the host's egress)
#   and on pI (the switch's egress towards the host, i.e. the host's ingress);
#   burst 64 KiB, queue --queue-ms (default 100: RATE x 100 ms of bytes; a
#   shallow queue, e.g. 2, drops packets when several senders meet). Nothing is attached
#   to the machine's own network namespace: traffic stays inside these.
# Ranks: HOSTS x RANKS_PER_HOST, in blocks (ranks [I*r, (I+1)*r) on
# eplb-hostI), which is how `eplb run --nodes HOSTS` numbers its nodes.
# Inside a host every rank shares the host's namespaces (network, UTS, IPC),
# so UCX reaches its same-host peers through shared memory and the others
# through TCP over eplb0: UCX_TLS=posix,sysv,cma,tcp,self and
# UCX_NET_DEVICES=eplb0 unless set in the environment.
#
# COMMAND mode: one `mpirun -np HOSTS*RANKS_PER_HOST COMMAND ARGS`, then the
# bytes every host's link carried each way. --script mode: `bash FILE ARGS`
# runs in the launcher's namespace with CLUSTER_MPIRUN (a command: mpirun
# with the testbed's arguments, e.g. "$CLUSTER_MPIRUN" build/eplb run ...),
# CLUSTER_LINKS (a command printing every host's link counters as JSON:
# {"hosts": [{"host": 0, "tx_bytes": .., "rx_bytes": ..}, ...]}),
# CLUSTER_HOSTS, CLUSTER_RANKS_PER_HOST and CLUSTER_RATE exported, so that
# one testbed serves several jobs (measurements side by side).
# Exit status: the job's (script's); 77 (skip) when namespaces or tc are not
# available here (needs root, or CAP_SYS_ADMIN + CAP_NET_ADMIN); 2 on usage.
set -euo pipefail

hosts=4
ranks_per_host=2
rate=200mbit
queue_ms=100
script=""
while (($#)); do
  case "$1" in
    -H|--hosts) hosts="$2"; shift 2 ;;
    -r|--ranks-per-host) ranks_per_host="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --queue-ms) queue_ms="$2"; shift 2 ;;
    --script) script="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
usage() { echo "usage: $0 [-H HOSTS (2-8)] [-r RANKS_PER_HOST (1-8)] [--rate RATE] [--queue-ms MS] [--script FILE | --] COMMAND [ARGS...]" >&2; exit 2; }
[[ "$hosts" =~ ^[2-8]$ && "$ranks_per_host" =~ ^[1-8]$ ]] || usage
[[ "$queue_ms" =~ ^[1-9][0-9]{0,3}$ ]] || { echo "netns_cluster: --queue-ms must be 1-9999" >&2; exit 2; }
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || { echo "netns_cluster: --rate must be like 200mbit, 1gbit, 500kbit" >&2; exit 2; }
[[ -n "$script" || $# -gt 0 ]] || usage
for tool in ip tc mpirun unshare; do
  if ! command -v "$tool" >/dev/null; then
    echo "netns_cluster: skipped: '$tool' is not installed (scripts/setup.sh installs iproute2 and openmpi-bin)" >&2
    exit 77
  fi
done

prefix="eplbc$$"
switch="${prefix}sw"
work="$(mktemp -d /tmp/eplb-cluster-XXXXXX)"
created=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for ns in "${created[@]}"; do
    # Processes left in our namespaces (daemons of an interrupted job).
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! error_text="$(ip netns add "$switch" 2>&1)"; then
  echo "netns_cluster: skipped: cannot create network namespaces here ($error_text); needs root or CAP_SYS_ADMIN+CAP_NET_ADMIN" >&2
  exit 77
fi
created+=("$switch")
ip -n "$switch" link add br0 type bridge
ip -n "$switch" link set br0 up
ip -n "$switch" link set lo up

# tbf: 64 KiB burst (a GSO segment fits), a queue of --queue-ms at the rate.
shape() {  # NAMESPACE DEVICE
  if ! error_text="$(ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 64kb latency "${queue_ms}ms" 2>&1)"; then
    echo "netns_cluster: skipped: tc cannot shape $2 here ($error_text)" >&2
    exit 77
  fi
}

for ((i = 0; i < hosts; ++i)); do
  ns="${prefix}h$i"
  ip netns add "$ns"
  created+=("$ns")
  ip link add "v${prefix}h$i" netns "$ns" type veth peer name "v${prefix}p$i" netns "$switch"
  ip -n "$ns" link set "v${prefix}h$i" name eplb0
  ip -n "$switch" link set "v${prefix}p$i" name "p$i"
  ip -n "$switch" link set "p$i" master br0
  ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev eplb0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eplb0 up
  ip -n "$switch" link set "p$i" up
  shape "$ns" eplb0
  shape "$switch" "p$i"
done

# Every link up and every host reachable from host 0 before anything starts.
for ((i = 0; i < hosts; ++i)); do
  for attempt in $(seq 1 50); do
    state="$(ip netns exec "${prefix}h$i" cat /sys/class/net/eplb0/operstate 2>/dev/null || echo missing)"
    [[ "$state" == up ]] && break
    if ((attempt == 50)); then echo "netns_cluster: eplb-host$i's link did not come up within 5 s ($state)" >&2; exit 1; fi
    sleep 0.1
  done
done
if command -v ping >/dev/null; then
  for ((i = 1; i < hosts; ++i)); do
    ok=""
    for attempt in $(seq 1 30); do
      if ip netns exec "${prefix}h0" ping -c 1 -W 1 "10.78.0.$((i + 1))" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1  # the bridge learns its ports
    done
    [[ -n "$ok" ]] || { echo "netns_cluster: eplb-host0 cannot reach eplb-host$i (10.78.0.$((i + 1)))" >&2; exit 1; }
  done
fi

# The rsh agent: `agent [ssh-style options] HOST WORDS...` runs WORDS with sh in HOST's namespaces.
{
  echo '#!/bin/sh'
  echo 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done'
  echo 'host="$1"; shift'
  echo 'case "$host" in'
  for ((i = 0; i < hosts; ++i)); do echo "  eplb-host$i) ns=${prefix}h$i ;;"; done
  echo '  *) echo "netns_cluster agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$ns" unshare --uts --ipc sh -c '"'"'hostname "$1"; shift; exec sh -c "$*"'"'"' agent "$host" "$@"'
} > "$work/agent"
chmod +x "$work/agent"
for ((i = 0; i < hosts; ++i)); do echo "eplb-host$i slots=$ranks_per_host"; done > "$work/hosts"

export UCX_NET_DEVICES="${UCX_NET_DEVICES:-eplb0}"
export UCX_TLS="${UCX_TLS:-posix,sysv,cma,tcp,self}"
ranks=$((hosts * ranks_per_host))
cat > "$work/mpirun" <<MPIRUN
#!/bin/sh
exec mpirun --allow-run-as-root --oversubscribe -np $ranks --hostfile "$work/hosts" --map-by slot \\
  --mca plm_rsh_agent "$work/agent" --mca plm_rsh_no_tree_spawn 1 \\
  --mca oob_tcp_if_include eplb0 --mca btl_tcp_if_include eplb0 \\
  --mca pml ob1 --mca btl self,vader,tcp -x UCX_NET_DEVICES -x UCX_TLS \${NETNS_CLUSTER_MPIRUN_ARGS:-} "\$@"
MPIRUN
{
  echo '#!/bin/sh'
  echo 'printf "{\"hosts\": ["'
  for ((i = 0; i < hosts; ++i)); do
    sep=$([[ $i -gt 0 ]] && echo ", " || true)
    echo "printf '${sep}{\"host\": $i, \"tx_bytes\": %s, \"rx_bytes\": %s}' \$(ip netns exec ${prefix}h$i cat /sys/class/net/eplb0/statistics/tx_bytes) \$(ip netns exec ${prefix}h$i cat /sys/class/net/eplb0/statistics/rx_bytes)"
  done
  echo 'printf "]}\n"'
} > "$work/links"
chmod +x "$work/mpirun" "$work/links"

echo "netns_cluster: $ranks ranks on $hosts hosts ($ranks_per_host per host), each host's link shaped to $rate each way" \
  "(tbf), bridge in netns $switch, hosts in netns ${prefix}h0..${prefix}h$((hosts - 1)), UCX_TLS=$UCX_TLS" >&2
links_before="$("$work/links")"
set +e
if [[ -n "$script" ]]; then
  # shellcheck disable=SC2086
  ip netns exec "${prefix}h0" unshare --uts --ipc env CLUSTER_MPIRUN="$work/mpirun" CLUSTER_LINKS="$work/links" \
    CLUSTER_HOSTS="$hosts" CLUSTER_RANKS_PER_HOST="$ranks_per_host" CLUSTER_RATE="$rate" \
    sh -c 'hostname eplb-launcher; exec bash "$@"' launcher "$script" "$@"
else
  ip netns exec "${prefix}h0" unshare --uts --ipc sh -c 'hostname eplb-launcher; exec "$@"' launcher "$work/mpirun" "$@"
fi
status=$?
set -e
links_after="$("$work/links")"
python3 - "$links_before" "$links_after" <<'PY' >&2 || true
import json, sys
before, after = (json.loads(text)["hosts"] for text in sys.argv[1:3])
for b, a in zip(before, after):
    tx, rx = a["tx_bytes"] - b["tx_bytes"], a["rx_bytes"] - b["rx_bytes"]
    print(f"netns_cluster: eplb-host{a['host']} link carried {tx / 2**20:.1f} MiB out ({tx} bytes) and {rx / 2**20:.1f} MiB in ({rx} bytes)")
PY
exit "$status"
