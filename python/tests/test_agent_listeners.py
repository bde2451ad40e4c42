"""Python agents listen on loopback unless asked (issue 29 item 15).

eplb.empty, eplb.Migrator and eplb.nixl create their transfer agents through _eplb.Agent; over TCP
each agent listens on a port. By default that port is bound to 127.0.0.1 only (UCX_NET_DEVICES=lo, as
the CLI's local ranks), never to every interface; EPLB_NET_DEVICES (or an agent's net_devices
argument, or UCX_NET_DEVICES) chooses another interface, and the agent's transports say which.
"""
import os
import subprocess
import sys

PROBE = r"""
import os, socket, sys
import torch
import eplb
from eplb.memory import transfer_agent
tensor = eplb.empty((4096,), torch.uint8, transport="tcp")
agent = transfer_agent("tcp")
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        inodes.add(target[8:-1])
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as lines:
        next(lines)
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, ours
                listening.append(fields[1].split(":")[0])
print("transports", agent.transports)
print("listening", " ".join(sorted(set(listening))) or "none")
"""


def probe(**environment):
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_NET_DEVICES", "EPLB_NET_DEVICES", "UCX_TLS")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    return lines["transports"], lines["listening"].split()


def test_an_agent_listens_on_loopback_only_by_default():
    transports, listening = probe()
    assert "UCX_NET_DEVICES=lo (AgentConfig)" in transports, transports
    assert listening, "the TCP agent listens nowhere?"
    assert set(listening) == {"0100007F"}, listening  # 127.0.0.1, nothing else


def test_another_interface_only_when_asked():
    others = sorted(name for name in os.listdir("/sys/class/net") if name != "lo")
    transports, _ = probe(EPLB_NET_DEVICES="lo")
    assert "UCX_NET_DEVICES=lo (AgentConfig)" in transports
    transports, _ = probe(UCX_NET_DEVICES="lo")
    assert "UCX_NET_DEVICES=lo (environment)" in transports
    if others:  # a machine without another interface still checks the choice above
        transports, listening = probe(EPLB_NET_DEVICES=others[0])
        assert f"UCX_NET_DEVICES={others[0]} (AgentConfig)" in transports
        assert "0100007F" not in listening or len(listening) > 1, listening
