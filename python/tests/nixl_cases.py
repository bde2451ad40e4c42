"""One two-process NIXL script, run on real `nixl` or on `eplb.nixl` (conformance, issue 28 item 3).

run_pair(backend) starts two spawned processes, "initiator" and "target", each with an agent of the
backend module ("nixl" -> `nixl._api`, "eplb" -> `eplb.nixl`) on DRAM with the UCX backend. They talk
over a multiprocessing pipe only to exchange metadata and addresses and to keep step. Every NIXL call
is recorded as a row (role, call, kind, value): `kind` is what the comparison uses (the result's type
name, a state, a bool, or "raises"), `value` what the table shows. Returns the rows of both roles, or
raises RuntimeError naming the role and its traceback when a process failed or overran its deadline.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import time
import traceback

import numpy as np

MODULES = {"nixl": "nixl._api", "eplb": "eplb.nixl"}
CONFIG_ATTRS = ("backends", "enable_pthread", "enable_listen", "port", "capture_telemetry", "num_threads",
                "sync_mode")  # what real nixl's nixl_agent_config stores
SLOT, SLOTS = 4096, 8  # each side registers SLOTS slots of SLOT bytes
STATES = ("DONE", "PROC", "ERR")
POLL_S = 10.0  # every wait's deadline


def describe(value) -> tuple[str, str]:
    """(kind, value) of a call's result, as the comparison and the table show it."""
    if value is None:
        return "None", "None"
    if isinstance(value, bool):
        return f"bool:{value}", str(value)
    if isinstance(value, str):
        return (f"state:{value}" if value in STATES else "str"), value
    if isinstance(value, int):
        return "int", str(value)
    if isinstance(value, bytes):
        return "bytes", f"{len(value)} B"
    if isinstance(value, dict):
        shown = {str(k): [bytes(m) for m in v] for k, v in sorted(value.items())}
        return f"dict:{shown}", str(shown)
    return type(value).__name__, type(value).__name__


class Recorder:
    def __init__(self, role: str):
        self.role, self.rows = role, []

    def call(self, name: str, fn, *args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except Exception as failure:  # recorded: a call that raises is a row too
            self.rows.append((self.role, name, f"raises:{type(failure).__name__}", str(failure)[:160]))
            return None
        kind, shown = describe(result)
        if name.startswith("transfer(") and result in ("DONE", "PROC"):
            kind = "state:DONE|PROC"  # NIXL: DONE when the call itself completed it, else PROC
        self.rows.append((self.role, name, kind, shown))
        return result

    def note(self, name: str, value) -> None:
        self.rows.append((self.role, name, *describe(value)))


def poll(fn, until, deadline_s: float = POLL_S):
    """Calls fn() until until(result) or the deadline; returns the last result."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = fn()
        if until(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.0005)


def _setup(rec: Recorder, api, name: str, fill: int):
    config = rec.call("nixl_agent_config(backends=['UCX'])", api.nixl_agent_config, backends=["UCX"])
    rec.note("nixl_agent_config attributes", all(hasattr(config, a) for a in CONFIG_ATTRS))
    agent = rec.call("nixl_agent(name, config)", api.nixl_agent, name, config)
    memory = np.full(SLOT * SLOTS, fill, dtype=np.uint8)
    memory[:] += np.arange(memory.size, dtype=np.uint64).astype(np.uint8)
    rows = np.array([[memory.ctypes.data, memory.nbytes, 0]], dtype=np.uint64)
    reg = rec.call("get_reg_descs(Nx3 array, 'DRAM')", agent.get_reg_descs, rows, "DRAM")
    rec.call("nixlRegDList.descCount()", reg.descCount)
    rec.call("register_memory(reg descs)", agent.register_memory, reg)
    metadata = rec.call("get_agent_metadata()", agent.get_agent_metadata)
    return agent, memory, reg, metadata


def _slots(memory, indices):
    return [(memory.ctypes.data + i * SLOT, SLOT, 0) for i in indices]


def _initiator(rec: Recorder, api, conn) -> None:
    agent, memory, reg, metadata = _setup(rec, api, "initiator", 1)
    conn.send((metadata, memory.ctypes.data))
    peer_metadata, peer_address = conn.recv()
    peer = rec.call("add_remote_agent(peer metadata)", agent.add_remote_agent, peer_metadata)
    rec.note("add_remote_agent returns the peer's name", peer in (b"target", "target"))
    xfer = rec.call("get_xfer_descs(tuples, 'DRAM')", agent.get_xfer_descs, _slots(memory, range(4)), "DRAM")
    rec.call("nixlXferDList.descCount()", xfer.descCount)
    local = rec.call("prep_xfer_dlist('NIXL_INIT_AGENT', tuples, 'DRAM')", agent.prep_xfer_dlist,
                     "NIXL_INIT_AGENT", _slots(memory, range(SLOTS)), "DRAM")
    remote_slots = [(peer_address + i * SLOT, SLOT, 0) for i in range(SLOTS)]
    remote = rec.call("prep_xfer_dlist(peer, tuples, 'DRAM')", agent.prep_xfer_dlist, "target", remote_slots, "DRAM")
    read = rec.call("make_prepped_xfer('READ', [0, 1], [2, 3], b'read-done')", agent.make_prepped_xfer, "READ",
                    local, [0, 1], remote, [2, 3], b"read-done")
    rec.call("check_xfer_state(READ) before transfer", agent.check_xfer_state, read)
    rec.call("transfer(READ)", agent.transfer, read)
    rec.call("check_xfer_state(READ) polled", poll, lambda: agent.check_xfer_state(read), lambda s: s != "PROC")
    conn.send("read posted")
    expected = np.full(2 * SLOT, 2, dtype=np.uint8) + np.arange(2 * SLOT, 4 * SLOT, dtype=np.uint64).astype(np.uint8)
    rec.note("READ landed byte-exact", bool(np.array_equal(memory[: 2 * SLOT], expected)))
    rec.call("transfer(READ) again (repost)", agent.transfer, read)
    rec.call("check_xfer_state(READ repost) polled", poll, lambda: agent.check_xfer_state(read),
             lambda s: s != "PROC")
    write = rec.call("make_prepped_xfer('WRITE', [4], [5], b'write-done')", agent.make_prepped_xfer, "WRITE",
                     local, np.array([4], dtype=np.int32), remote, np.array([5], dtype=np.int32), b"write-done")
    rec.call("transfer(WRITE)", agent.transfer, write)
    rec.call("check_xfer_state(WRITE) polled", poll, lambda: agent.check_xfer_state(write), lambda s: s != "PROC")
    rec.call("transfer(WRITE, b'write-again') (new notification)", agent.transfer, write, b"write-again")
    rec.call("check_xfer_state(WRITE again) polled", poll, lambda: agent.check_xfer_state(write),
             lambda s: s != "PROC")
    conn.send("write done")
    rec.note("target saw READ and WRITE", conn.recv())
    _refusals(rec, agent, local, remote, peer_address)
    rec.call("release_xfer_handle(READ)", agent.release_xfer_handle, read)
    rec.call("release_xfer_handle twice", agent.release_xfer_handle, read)
    rec.call("check_xfer_state after release", agent.check_xfer_state, read)
    rec.call("make_prepped_xfer index out of range", agent.make_prepped_xfer, "READ", local, [0], remote, [SLOTS])
    rec.call("make_prepped_xfer lengths differ", agent.make_prepped_xfer, "READ", local, [0, 1], remote, [0])
    rec.call("send_notif(peer, b'hello')", agent.send_notif, "target", b"hello")
    rec.call("get_new_notifs() polled", poll, agent.get_new_notifs, bool)
    rec.call("get_new_notifs() when none", agent.get_new_notifs)
    rec.call("nixl_xfer_handle.release() (WRITE)", write.release)
    rec.call("release_dlist_handle(local)", agent.release_dlist_handle, local)
    rec.call("nixl_prepped_dlist_handle.release() (remote)", remote.release)
    conn.send("released")
    conn.recv()
    rec.call("remove_remote_agent(peer)", agent.remove_remote_agent, "target")
    rec.call("deregister_memory(reg descs)", agent.deregister_memory, reg)


def _refusals(rec: Recorder, agent, local, remote, peer_address) -> None:
    """What both must refuse: unknown peers, memory the peer did not register, bad memory types."""
    rec.call("prep_xfer_dlist(unknown agent)", agent.prep_xfer_dlist, "nobody", [(peer_address, SLOT, 0)], "DRAM")
    outside = [(peer_address + SLOT * SLOTS, SLOT, 0)]
    prepped = rec.call("prep_xfer_dlist(peer, outside its memory)", agent.prep_xfer_dlist, "target", outside, "DRAM")
    if prepped is not None:  # NIXL checks at make_prepped_xfer
        rec.call("make_prepped_xfer(outside its memory)", agent.make_prepped_xfer, "READ", local, [0], prepped, [0])
    rec.call("make_prepped_xfer('COPY')", agent.make_prepped_xfer, "COPY", local, [0], remote, [0])
    rec.call("prep_xfer_dlist('NIXL_INIT_AGENT', tuples, 'VRAM')", agent.prep_xfer_dlist, "NIXL_INIT_AGENT",
             [(peer_address, SLOT, 0)], "VRAM")


def _target(rec: Recorder, api, conn) -> None:
    agent, memory, reg, metadata = _setup(rec, api, "target", 2)
    peer_metadata, _ = conn.recv()
    conn.send((metadata, memory.ctypes.data))
    peer = rec.call("add_remote_agent(peer metadata)", agent.add_remote_agent, peer_metadata)
    rec.note("add_remote_agent returns the peer's name", peer in (b"initiator", "initiator"))
    assert conn.recv() == "read posted"
    read_seen = rec.call("check_remote_xfer_done(peer, b'read') polled", poll,
                         lambda: agent.check_remote_xfer_done("initiator", b"read"), bool)
    write_seen = rec.call("check_remote_xfer_done(peer, b'write-done') polled", poll,
                          lambda: agent.check_remote_xfer_done("initiator", b"write-done"), bool)
    rec.call("check_remote_xfer_done(peer, b'again', tag_is_prefix=False) polled", poll,
             lambda: agent.check_remote_xfer_done("initiator", b"again", tag_is_prefix=False), bool)
    assert conn.recv() == "write done"
    expected = np.full(SLOT, 1, dtype=np.uint8) + np.arange(4 * SLOT, 5 * SLOT, dtype=np.uint64).astype(np.uint8)
    rec.note("WRITE landed byte-exact", bool(np.array_equal(memory[5 * SLOT: 6 * SLOT], expected)))
    rec.call("check_remote_xfer_done again (taken)", agent.check_remote_xfer_done, "initiator", b"write-done")
    conn.send(bool(read_seen and write_seen))
    rec.call("get_new_notifs() polled", poll, agent.get_new_notifs, bool)
    rec.call("send_notif(peer, b'bye')", agent.send_notif, "initiator", b"bye")
    assert conn.recv() == "released"
    conn.send("done")
    rec.call("remove_remote_agent(peer)", agent.remove_remote_agent, "initiator")
    rec.call("deregister_memory(reg descs)", agent.deregister_memory, reg)


def _main(role: str, backend: str, conn) -> None:
    rec = Recorder(role)
    try:
        api = importlib.import_module(MODULES[backend])
        (_initiator if role == "initiator" else _target)(rec, api, conn)
        conn.send(("rows", rec.rows))
    except BaseException:  # reported to the parent, which fails with it
        conn.send(("error", f"{role}: {traceback.format_exc()}"))


def run_pair(backend: str, timeout: float = 60.0) -> list[tuple[str, str, str, str]]:
    context = multiprocessing.get_context("spawn")
    a_end, b_end = context.Pipe()
    a_report, a_child = context.Pipe()
    b_report, b_child = context.Pipe()
    pipes = {"initiator": (a_end, a_child, a_report), "target": (b_end, b_child, b_report)}
    procs = {role: context.Process(target=_relay, args=(role, backend, step, child), daemon=True)
             for role, (step, child, _) in pipes.items()}
    for proc in procs.values():
        proc.start()
    rows, deadline = [], time.monotonic() + timeout
    try:
        for role, (_, _, report) in pipes.items():
            if not report.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{backend}: the {role} did not finish within {timeout:g} s")
            kind, value = report.recv()
            if kind == "error":
                raise RuntimeError(f"{backend}: {value}")
            rows.extend(value)
    finally:
        for proc in procs.values():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return rows


def _relay(role: str, backend: str, step, report) -> None:
    """Runs one role: `step` is the pipe to the other role, `report` the one to the parent."""

    class Both:  # the role's calls go to `step`; its final report to `report`
        def send(self, value):
            if isinstance(value, tuple) and value and value[0] in ("rows", "error"):
                report.send(value)
            else:
                step.send(value)

        def recv(self):
            if not step.poll(POLL_S * 2):
                raise TimeoutError(f"{role}: the other process sent nothing within {POLL_S * 2:g} s")
            return step.recv()

    _main(role, backend, Both())
    # The report is sent; leave without running exit handlers: with nixl 1.5.1 on a machine with
    # rdma-core, a process that made a real agent crashes at exit in libnl-route's destructor
    # (docs/python.md, "### NIXL"; eplb.planes.nixl_plane warns of it).
    os._exit(0)


def compare(reference: list, candidate: list) -> list[tuple[str, str, str, str, bool]]:
    """(role, call, reference value, candidate value, same kind?) for every call of either run, in order."""
    ref = {(role, call): (kind, value) for role, call, kind, value in reference}
    cand = {(role, call): (kind, value) for role, call, kind, value in candidate}
    keys = list(dict.fromkeys([(r, c) for r, c, _, _ in reference] + [(r, c) for r, c, _, _ in candidate]))
    out = []
    for key in keys:
        (rk, rv), (ck, cv) = ref.get(key, ("missing", "missing")), cand.get(key, ("missing", "missing"))
        out.append((*key, rv, cv, rk == ck))
    return out


def markdown(table) -> str:
    lines = ["| role | call | real nixl | eplb.nixl | same? |", "| --- | --- | --- | --- | --- |"]
    for role, call, real, ours, same in table:
        cells = [c.replace("|", "\\|") for c in (role, call, real, ours)]
        lines.append(f"| {' | '.join(cells)} | {'yes' if same else '**no**'} |")
    return "\n".join(lines)


if __name__ == "__main__":  # prints the conformance table (docs/python.md, "### NIXL")
    print(markdown(compare(run_pair("nixl"), run_pair("eplb"))))
