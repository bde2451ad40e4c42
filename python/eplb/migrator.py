"""eplb.Migrator: moves an engine's own expert tensors between ranks, layer by layer, verified.

Contract:
- `Migrator(expert_weights, *, group=None, data_group=None, transport="auto", ...)` is collective.
  expert_weights[layer] is a list of tensors [num_local_slots, ...], contiguous, all on one device
  (CPU or CUDA), of any dtypes and shapes (an expert may be FP8 weights, float32 block scales and
  bf16 biases: all move and are checked together). They are adopted in place, never copied.
- The protocol is the C++ library's, once (plan, stage, transfer, verify, vote, commit or abort,
  retries, deadlines); rows move through a data plane (`transport`):
  "ucx" (eplb's UCX agent, host memory; "shm"/"tcp" choose UCX's transports), "torch" (the
  engine's torch.distributed `data_group`: NCCL for CUDA tensors, gloo for CPU tensors),
  "staged" (device rows through pinned host buffers over a gloo `data_group`), "nixl" (READs
  through a real NIXL agent). "auto": ucx for CPU tensors, torch for CUDA tensors with an NCCL
  data_group, staged otherwise. `group` (gloo, or eplb's bootstraps) carries digests, votes,
  deadlines and errors; `data_group` only rows, so a broken data plane is still reported on every
  rank. The report names the plane of every layer.
- Before anything moves, the one layout check (C++) compares every rank's layers, tensors, bytes
  per expert, dtypes and shapes: a difference, or a rank whose tensors cannot be used, raises
  eplb.LayoutError on every rank naming the rank, layer, tensor and both sides.
- `migrate(old_phy2log, new_phy2log, *, layers=None)` is collective: afterwards every local slot
  holds exactly its new expert's bytes; it returns a report dict. A failure raises
  eplb.MigrationError (TimeoutError, PeerLostError) on every rank that is still there; every layer
  is then wholly old or wholly new on every rank (`committed_layers`). The GIL is released while
  the engine runs. Ranks that pass different placements are refused before anything moves.
- `start(...)`: the same round overlapped with serving (eplb/async_migration.py).
- `transfer_schedule` ("off", "ranks", "hosts", "ranks-fenced", "hosts-fenced"): each layer's READs in
  the contention-aware rounds of eplb's plan (schedule_transfers), as `eplb run --transfer-schedule`;
  "-fenced": every rank waits for every rank's round before the next; one-sided planes only (tested
  on ucx; nixl accepts it, untested); torch and staged refuse it at set-up.
- Deadlines: `timeout` (seconds per layer attempt's transfers) or None: automatic, derived by the
  library from the bytes each layer reads, as the CLI's --timeout 0 (every other deadline derives
  from it: collectives, set-up, the serving wait, draining a closed async round).
- The torch plane cannot cancel a point-to-point wait: past its deadline every rank raises
  eplb.TimeoutError and the data group is unusable (an NCCL communicator is aborted); the Migrator
  says so and refuses rounds until set_data_group() gives it a new one.
- Digests: XXH3-64 of host rows on the ucx plane; eplb-dev64 (eplb/digest.py), computed on the
  rows' device, on the others. `reuse_checksums=True` reuses the digests of earlier rounds; the
  engine then calls `weights_rewritten(layers)` after writing expert rows itself.
- Commit: "copy" (default) writes committed rows into the engine's tensors (on a device, on the
  engine's current stream, after the side stream the transfers ran on). "swap" (CPU tensors only)
  gives every tensor a spare, READs land in it and the commit re-points the engine's tensor objects
  (Tensor.set_()); views of a larger tensor are refused; CUDA tensors are refused (CUDA graphs
  captured on the old storage would keep reading it).
"""
from __future__ import annotations

import numpy as np

from eplb import _eplb
from eplb import _migrator_setup as setup
from eplb.async_migration import AsyncMigration
from eplb.errors import Error, LayoutError, MigrationError, PeerLostError, TimeoutError
from eplb.group import ProcessGroup

__all__ = ["Migrator"]


class Migrator:
    """Migration of adopted expert tensors (see the module's docstring).

    Args:
        expert_weights: [layer][tensor] tensors [num_local_slots, ...], contiguous, one device.
        group: the control group: eplb.ProcessGroup, a torch.distributed gloo group, or None (the
            default torch group, else eplb's launcher / mpirun environment).
        data_group: the torch.distributed group rows move over for transport "torch" (NCCL or gloo)
            and "staged" (gloo); the same processes in the same order as `group`.
        num_nodes: nodes the ranks span (consecutive ranks per node), for the intra/inter-node bytes.
        transport: "auto", "ucx", "shm", "tcp", "torch", "staged" or "nixl" (the module's docstring).
        timeout: seconds the transfers of one layer attempt may take; None: automatic.
        retries: extra attempts of a layer whose transfers or digests failed.
        verify: after each round the ranks confirm they committed the same mapping (report["verified"]).
        on_layer: optional callable(layer_report dict) called on every rank after each layer; if it
            raises, every rank stops the round at the next vote (a MigrationError caused by it).
        inject: fault injection for tests: the ucx plane's spec ("err=0.2,seed=3", plain tensors only)
            or a Python plane's (eplb/planes/faults.py).
        reuse_checksums: reuse the digests of earlier rounds (see the module's docstring).
        commit: "copy" or "swap" (see the module's docstring).
        transfer_schedule: the order of each layer's READs on a one-sided plane (ucx; nixl, untested):
            "off" (all at once, the default), "ranks" (contention-aware rounds, one expert per NIC per
            round) or "hosts" (also one expert per host link per round), as the CLI's --transfer-schedule;
            "ranks-fenced" / "hosts-fenced": the same rounds, each started once every rank's previous
            round landed (a small allgather per round; faster where shallow NIC queues drop packets when
            several senders meet, slower with deep queues: docs/scale.md).
            Needs num_nodes for the hosts; the torch and staged planes (paired sends and receives) refuse it.
    """

    def __init__(self, expert_weights, *, group=None, data_group=None, num_nodes: int = 1, transport: str = "auto",
                 timeout: float | None = None, retries: int = 2, verify: bool = True, on_layer=None, inject: str = "",
                 reuse_checksums: bool = False, commit: str = "copy", transfer_schedule: str = "off"):
        setup.check_options(num_nodes, transport, timeout, retries, commit, reuse_checksums, transfer_schedule)
        self._reuse_checksums, self._commit, self._verify = reuse_checksums, commit, bool(verify)
        self._transfer_schedule = transfer_schedule
        self._group = setup.as_group(group)
        self._timeout = float(timeout) if timeout is not None else 0.0
        self._options = {"num_nodes": int(num_nodes), "transport": transport, "retries": int(retries),
                         "on_layer": on_layer, "inject": inject}
        self._weights = [list(layer) for layer in expert_weights] if setup.is_sequence(expert_weights) else None
        self._broken, self._async, self._observers, self._buffers = None, None, [], None
        self._set_up(data_group)

    def _set_up(self, data_group) -> None:
        """Collective: chooses the plane, allocates spares, and sets up the native Migrator."""
        weights, options = self._weights, self._options
        problem = setup.local_problem(weights)
        plane, transfer, self._paths = None, None, []
        if not problem:
            plane, problem = setup.choose_plane(options["transport"], weights, data_group)
        if not problem and plane == "ucx":
            transfer, self._paths, problem = setup.choose_agent(weights, options["transport"], options["inject"])
        elif not problem:
            self._paths = [f"{weights[0][0].device.type} memory ({plane})"] * len(weights)
        if not problem and self._commit == "swap" and self._buffers is None:
            self._buffers, problem = setup.swap_buffers(weights, self._paths)
        layers = [] if problem else setup.tensor_arguments(weights, self._buffers, self._paths, plane)
        if not problem and plane != "ucx":
            try:
                transfer = setup.make_plane(plane, weights, self._buffers, data_group, self._group.rank,
                                            options["inject"])
            except Error as failure:
                problem = str(failure)
        slots = int(weights[0][0].shape[0]) if layers else 1
        callback = self._layer_callback(options["on_layer"])
        try:
            self._native = _eplb.Migrator(self._group._native, transfer, layers, [], slots, options["num_nodes"],
                                          self._timeout, options["retries"], callback, self._commit,
                                          self._transfer_schedule, problem)
        except Error as failure:
            if failure.code in ("mismatch", "aborted", "invalid argument"):
                raise LayoutError(str(failure), failure.code, peer=failure.peer) from None
            raise
        self._slots, self._plane_object = slots, transfer
        self._front = [0] * len(weights)  # per layer: the buffer the engine's tensors show

    def set_data_group(self, data_group, *, inject: str | None = None) -> None:
        """Collective: a new data group for a Migrator whose torch plane broke (a timed-out wait).

        inject: the new plane's fault spec (tests; see __init__); None keeps the one given before.
        """
        if self._async is not None and not self._async.done:
            raise Error("set_data_group: an async round is running", "not allowed")
        if inject is not None:
            if not isinstance(inject, str):
                raise Error(f"inject must be a str (a fault spec) or None, got {inject!r}")
            self._options["inject"] = inject
        self._broken = None
        self._set_up(data_group)

    # ---------------------------------------------------------------- properties

    @property
    def group(self) -> ProcessGroup:
        return self._group

    @property
    def plane(self) -> str:
        """The data plane rows move through: "ucx", "torch", "staged" or "nixl"."""
        return self._native.plane

    @property
    def commit(self) -> str:
        """"copy" or "swap" (see the module's docstring)."""
        return self._commit

    @property
    def spare_bytes(self) -> int:
        """Bytes of the spare buffers this rank holds for commit="swap" (0 for copy)."""
        if not self._buffers:
            return 0
        return sum(spare.numel() * spare.element_size() for layer in self._buffers for spare in layer[1])

    @property
    def num_layers(self) -> int:
        return len(self._weights)

    @property
    def num_slots(self) -> int:
        """Physical slots per layer over all ranks."""
        return self._slots * self._group.size

    # ---------------------------------------------------------------- rounds

    def migrate(self, old_phy2log, new_phy2log, *, layers=None) -> dict:
        """Collective: moves every layer (or `layers`) from old_phy2log to new_phy2log ([layers][slots])."""
        old, new, experts = self._round_arguments(old_phy2log, new_phy2log, layers)
        if not self._reuse_checksums:
            self._native.forget_checksums([])
        try:
            result = self._native.migrate(old, new, experts)
        finally:
            self._repoint_swapped()
        self._observe_round(result.layers)
        if not result.ok:
            error = self._round_error(result)
            if result.stopped_alone and self._verify:  # the others completed the round: tell them
                self._native.agree(new, experts, result.seconds, result.message)
            raise error from result.callback_error
        report = self._round_report(result)
        if self._verify:
            agreed, failure, slowest = self._native.agree(new, experts, result.seconds, "")
            report["verified"], report["slowest_rank_seconds"] = agreed, slowest
            if not agreed:
                raise MigrationError(f"after the round, the ranks disagree: {failure}", "mismatch",
                                     rank=self._group.rank, operation="agreeing on the round",
                                     elapsed_s=result.seconds, committed_layers=_committed(result))
        return report

    def weights_rewritten(self, layers=None) -> None:
        """Tells eplb the engine wrote these layers' expert rows itself (None: every layer).

        Only needed with reuse_checksums=True: the digests eplb remembers for those rows are
        dropped, and the next round digests them again. Not while a round started by start() runs.
        """
        if self._async is not None and not self._async.done:
            raise Error("weights_rewritten: an async round is running; call it after the round is done",
                        "not allowed")
        chosen = [] if layers is None else [int(layer) for layer in layers]
        if layers is not None and not chosen:
            return
        self._native.forget_checksums(chosen)

    def start(self, old_phy2log, new_phy2log, *, layers=None, lead_steps: int = 2) -> AsyncMigration:
        """Collective: starts the round of migrate() overlapped with serving and returns at once.

        Args:
            old_phy2log, new_phy2log: [layers][slots] placements, as for migrate().
            layers: only these layers move (the others keep old_phy2log), as for migrate().
            lead_steps: a voted layer commits `lead_steps` serving steps after the latest rank's
                step at the vote (>= 1): larger values make the serving loop wait less often.
        Returns:
            An eplb.AsyncMigration: call its commit_ready() once per serving step until done.
        Raises:
            eplb.Error (ValueError) for bad placements or lead_steps, or while another round runs.
        """
        if not isinstance(lead_steps, int) or not 1 <= lead_steps <= 1000:
            raise Error(f"lead_steps must be an int in [1, 1000], got {lead_steps!r}")
        old, new, experts = self._round_arguments(old_phy2log, new_phy2log, layers)
        if not self._reuse_checksums:
            self._native.forget_checksums([])
        native = self._native.start(old, new, experts, lead_steps)
        drain = _eplb.deadlines(self._timeout)["drain"]
        self._async = AsyncMigration(self, native, make_error=self._round_error, make_report=self._round_report,
                                     drain_seconds=drain)
        return self._async

    # ---------------------------------------------------------------- inside

    def _round_arguments(self, old_phy2log, new_phy2log, layers):
        """(old, new, number of experts) of a round, checked; refused while this Migrator cannot run one."""
        if self._broken:
            raise Error(f"this Migrator stopped for good: {self._broken}", "not allowed")
        if self._native.broken:
            raise Error(f"the {self.plane} data plane cannot be used again ({self._native.broken}): give this "
                        "Migrator a new data group with set_data_group()", "not allowed")
        if self._async is not None and not self._async.done:
            raise Error("an async round of this Migrator is still running (call its commit_ready() until done)",
                        "not allowed")
        old = self._phy2log(old_phy2log, "old_phy2log")
        new = self._phy2log(new_phy2log, "new_phy2log")
        if layers is not None:
            chosen = sorted({_layer_index(layer, len(old)) for layer in layers})
            target = old.copy()
            target[chosen] = new[chosen]
            new = target
        return old, new, int(max(old.max(), new.max())) + 1

    def _layer_callback(self, on_layer):
        if on_layer is None:
            return None
        return lambda layer: on_layer(self._layer_dict(layer))

    def _layer_dict(self, layer) -> dict:
        item = {field: getattr(layer, field) for field in LAYER_FIELDS}
        item["path"] = self._paths[layer.layer]
        item["verified"] = layer.committed
        return item

    def _repoint_swapped(self) -> None:
        """commit="swap": points the engine's tensor objects at each layer's live buffer."""
        if not self._buffers:
            return
        import torch

        for l, live in enumerate(self._native.live_buffers()):
            if live == self._front[l]:
                continue
            with torch.no_grad():
                for tensor, buffer in zip(self._weights[l], self._buffers[l][live]):
                    tensor.set_(buffer)
            self._front[l] = live

    def _observe_round(self, layers) -> None:
        if self._observers:
            dicts = [self._layer_dict(layer) for layer in layers]
            for observer in self._observers:
                observer.observe_round(dicts)

    def _observe_stall(self, seconds: float) -> None:
        for observer in self._observers:
            observer.observe_stall(seconds)

    def _round_report(self, result) -> dict:
        report = _report([self._layer_dict(layer) for layer in result.layers], result.seconds, result.retries)
        report["commit"] = self._commit
        report["plane"] = self.plane
        report["transfer_schedule"] = self._native.transfer_schedule  # what the C++ executor was given
        return report

    def _round_error(self, result) -> MigrationError:
        """The typed exception of a failed round; a Migrator whose group is broken refuses later rounds."""
        message = result.message
        if self._reuse_checksums and "checksum mismatch" in message:
            message += ("; reuse_checksums=True: if the engine wrote its expert rows since an earlier round, "
                        "call Migrator.weights_rewritten() after writing them")
        error = migration_error(result, message, self._group.rank)
        if isinstance(error, (PeerLostError, TimeoutError)) and not self._native.broken:
            self._broken = str(error)
            if self.plane in ("torch", "staged"):  # the data group's peers may be broken though this rank's is not
                self._broken += "; give this Migrator a new data group with set_data_group()"
        return error

    def _phy2log(self, phy2log, name: str) -> np.ndarray:
        array = phy2log.detach().cpu().numpy() if hasattr(phy2log, "detach") else np.asarray(phy2log)
        if array.ndim != 2 or array.shape != (self.num_layers, self.num_slots):
            raise Error(f"{name} must be [layers][slots] = [{self.num_layers}][{self.num_slots}], "
                        f"got shape {tuple(array.shape)}")
        if not np.issubdtype(array.dtype, np.integer) or array.min() < 0:
            raise Error(f"{name} must hold expert indices >= 0, got dtype {array.dtype}, min {array.min()}")
        return np.ascontiguousarray(array, dtype=np.int64)


LAYER_FIELDS = ("layer", "bytes_kept", "bytes_local", "bytes_intra_node", "bytes_inter_node", "requests",
                "descriptors", "bytes_read_here", "seconds", "seconds_checksum", "seconds_transfer", "seconds_verify",
                "seconds_vote", "seconds_commit", "retries", "changed", "committed", "failure", "failure_code",
                "plane")
BYTE_FIELDS = ("bytes_kept", "bytes_local", "bytes_intra_node", "bytes_inter_node")


def _layer_index(layer, count: int) -> int:
    index = int(layer)
    if not 0 <= index < count:
        raise Error(f"layers: {layer} is not a layer in [0, {count})")
    return index


def _committed(result) -> list[int]:
    return [layer.layer for layer in result.layers if layer.committed]


def _report(layer_reports, seconds: float, retries: int) -> dict:
    totals = {field: sum(item[field] for item in layer_reports if item["committed"]) for field in BYTE_FIELDS[1:]}
    totals["bytes_kept"] = sum(item["bytes_kept"] for item in layer_reports)
    moved = totals["bytes_local"] + totals["bytes_intra_node"] + totals["bytes_inter_node"]
    totals.update(bytes_moved=moved, bytes_read_here=sum(item["bytes_read_here"] for item in layer_reports),
                  seconds=seconds, retries=retries, gb_per_s=moved / seconds / 1e9 if seconds > 0 else 0.0,
                  layers_committed=sum(item["committed"] for item in layer_reports))
    return {"layers": layer_reports, "totals": totals, "verified": None}


def migration_error(result, message: str, me: int) -> MigrationError:
    """The typed exception of a failed round (RoundReport from the library: code, peer, layer, operation)."""
    committed = _committed(result)
    layer = result.failed_layer
    if layer is not None:
        state = f"layer {layer} and later: old placement on every rank; layers {committed or 'none'}: new placement"
    else:
        state = f"layers {committed or 'none'}: new placement; the others old" if committed else "nothing moved"
    kinds = {"timeout": TimeoutError, "remote disconnect": PeerLostError}
    kind = kinds.get(result.code, MigrationError)
    failed = [item for item in result.layers if item.layer == layer and item.failure_code in kinds]
    if kind is MigrationError and failed:  # the layer's vote aborted it because its transfers timed out or lost a peer
        kind = kinds[failed[0].failure_code]
    return kind(message, result.code, layer=layer, rank=me, peer=result.peer, operation=result.operation or None,
                state=state, elapsed_s=result.seconds, committed_layers=committed)
