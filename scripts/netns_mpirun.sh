#!/usr/bin/env bash
# Multi-host emulation on one machine: runs an MPI job across two network
# namespaces joined by a veth pair, as if on two hosts.
#
#   scripts/netns_mpirun.sh [-n RANKS] [--] COMMAND [ARGS...]
#   e.g. scripts/netns_mpirun.sh -n 4 build/eplb bootstrap-check
#
# What it builds (everything is removed on exit, also on Ctrl-C):
#   namespace <prefix>a "host" eplb-host0: interface eplb0 = 10.77.0.1/24
#   namespace <prefix>b "host" eplb-host1: interface eplb0 = 10.77.0.2/24
#   a veth pair between the two; nothing is attached to the machine's own
#   network namespace, so the traffic stays between the two namespaces.
# mpirun (OpenMPI 4.1) runs inside the first namespace and starts its orted
# daemons on both "hosts" through an rsh agent script (no sshd): the agent
# maps a host name to `ip netns exec <ns> unshare --uts --ipc`, gives the
# daemon that host name, and runs the command line mpirun hands it (the
# same words ssh would get). OOB and the TCP BTL are pinned to eplb0 and the
# ob1 PML is forced, so MPI traffic between the hosts crosses the veth.
# Ranks are mapped in blocks: the first ceil(RANKS/2) on eplb-host0, the rest
# on eplb-host1, which is how `eplb run --nodes 2` numbers its nodes (ranks
# [n*P/N, (n+1)*P/N) form node n), so its "inter-node" bytes cross the veth.
# At the end it prints the bytes the veth carried each way (from the
# interface counters of eplb-host0), e.g.
#   netns_mpirun: veth eplb0 carried 231.4 MiB eplb-host0 -> eplb-host1 (242641920 bytes) and ...
#
# Environment for the ranks: UCX_NET_DEVICES=eplb0 (unless set) so UCX TCP
# uses the veth; everything else is inherited. Extra mpirun arguments:
# NETNS_MPIRUN_ARGS="...".
# Exit status: the job's; 77 (skip) with a message when namespaces cannot
# be created here (needs root, or CAP_SYS_ADMIN + CAP_NET_ADMIN); 2 on usage.
set -euo pipefail

ranks=4
while (($#)); do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if (($# == 0)) || ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [-n RANKS] [--] COMMAND [ARGS...]" >&2
  exit 2
fi
for tool in ip mpirun unshare; do
  if ! command -v "$tool" >/dev/null; then
    echo "netns_mpirun: skipped: '$tool' is not installed (scripts/setup.sh installs iproute2 and openmpi-bin)" >&2
    exit 77
  fi
done

prefix="eplb$$"
ns0="${prefix}a"
ns1="${prefix}b"
work="$(mktemp -d /tmp/eplb-netns-XXXXXX)"
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

if ! error_text="$(ip netns add "$ns0" 2>&1)"; then
  echo "netns_mpirun: skipped: cannot create network namespaces here ($error_text); needs root or CAP_SYS_ADMIN+CAP_NET_ADMIN" >&2
  exit 77
fi
created+=("$ns0")
ip netns add "$ns1"
created+=("$ns1")
# Create the pair directly inside the namespaces, then give both ends the same name.
ip link add "v${prefix}a" netns "$ns0" type veth peer name "v${prefix}b" netns "$ns1"
ip -n "$ns0" link set "v${prefix}a" name eplb0
ip -n "$ns1" link set "v${prefix}b" name eplb0
ip -n "$ns0" addr add 10.77.0.1/24 dev eplb0
ip -n "$ns1" addr add 10.77.0.2/24 dev eplb0
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eplb0 up
done
# Both ends must report carrier before anything starts: a veth end has been
# seen still DOWN right after `link set up` (UCX then finds no eplb0 device).
for attempt in $(seq 1 50); do
  down=""
  for ns in "$ns0" "$ns1"; do
    state="$(ip netns exec "$ns" cat /sys/class/net/eplb0/operstate 2>/dev/null || echo missing)"
    [[ "$state" == up ]] || down+=" $ns:$state"
  done
  [[ -z "$down" ]] && break
  if ((attempt == 50)); then
    echo "netns_mpirun: the veth pair did not come up within 5 s (operstate:$down)" >&2
    exit 1
  fi
  sleep 0.1
done
if ! ip netns exec "$ns0" ping -c 1 -W 2 10.77.0.2 >/dev/null 2>&1; then
  if command -v ping >/dev/null; then
    echo "netns_mpirun: the veth pair does not carry traffic (ping 10.77.0.1 -> 10.77.0.2 failed)" >&2
    exit 1
  fi
fi

# The rsh agent: `agent [ssh-style options] HOST WORDS...` runs WORDS with sh in HOST's namespace.
cat > "$work/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host="\$1"; shift
case "\$host" in
  eplb-host0) ns="$ns0" ;;
  eplb-host1) ns="$ns1" ;;
  *) echo "netns_mpirun agent: unknown host '\$host'" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts --ipc sh -c 'hostname "\$1"; shift; exec sh -c "\$*"' agent "\$host" "\$@"
AGENT
chmod +x "$work/agent"
per_host=$(((ranks + 1) / 2))
printf 'eplb-host0 slots=%d\neplb-host1 slots=%d\n' "$per_host" "$per_host" > "$work/hosts"

export UCX_NET_DEVICES="${UCX_NET_DEVICES:-eplb0}"
echo "netns_mpirun: $ranks ranks on eplb-host0 (netns $ns0, 10.77.0.1) and eplb-host1 (netns $ns1, 10.77.0.2) over veth eplb0" >&2
veth_bytes() { ip netns exec "$ns0" cat "/sys/class/net/eplb0/statistics/$1"; }
sent_before="$(veth_bytes tx_bytes)"
received_before="$(veth_bytes rx_bytes)"
set +e
# shellcheck disable=SC2086
ip netns exec "$ns0" unshare --uts --ipc sh -c 'hostname eplb-launcher; exec "$@"' launcher \
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" --hostfile "$work/hosts" --map-by slot \
  --mca plm_rsh_agent "$work/agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca oob_tcp_if_include eplb0 --mca btl_tcp_if_include eplb0 \
  --mca pml ob1 --mca btl self,vader,tcp \
  ${NETNS_MPIRUN_ARGS:-} "$@"
status=$?
set -e
sent=$(($(veth_bytes tx_bytes) - sent_before))
received=$(($(veth_bytes rx_bytes) - received_before))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "netns_mpirun: veth eplb0 carried $(mib "$sent") eplb-host0 -> eplb-host1 ($sent bytes)" \
  "and $(mib "$received") eplb-host1 -> eplb-host0 ($received bytes)" >&2
exit "$status"
