"""eplb.Migrator: moves an engine's own expert tensors between ranks, layer by layer, verified.

Contract:
- `Migrator(expert_weights, *, group=None, ...)` is collective. expert_weights[layer] is a list of
  CPU tensors [num_local_slots, ...], contiguous; they are adopted in place (registered with the
  transfer layer, never copied; eplb.empty tensors are used as allocated). Before anything moves,
  every rank's layout (layers, tensors per layer, bytes per expert, dtype, shape) is compared:
  a difference, or a rank whose tensors cannot be used (CUDA, not contiguous), raises
  eplb.LayoutError on every rank naming the rank, layer, tensor and both sizes.
- `migrate(old_phy2log, new_phy2log, *, layers=None)` is collective: afterwards every local slot
  holds exactly its new expert's bytes. It returns a report dict (per layer and totals). A failure
  raises eplb.MigrationError (TimeoutError, PeerLostError) on every rank that is still there; every
  layer is then wholly old or wholly new on every rank, and the error says which
  (`committed_layers`). The GIL is released while the engine runs.
- `start(old_phy2log, new_phy2log, *, layers=None, lead_steps=2)` is collective: the same round
  overlapped with serving, returning an eplb.AsyncMigration (eplb/async_migration.py) whose
  commit_ready() the serving loop calls once per step. One round at a time per Migrator.
- Checksums: every row a peer reads is checked against its source's checksum. By default a round
  hashes its sources afresh (the engine may have written its tensors since the last round). With
  `reuse_checksums=True` the checksums of rows eplb hashed, received or committed in earlier rounds
  are reused, saving one read of every moved row per round; the engine then calls
  `weights_rewritten(layers)` after writing expert rows itself (a weight reload). A stale checksum
  is never trusted silently: the receiving rank's check fails and the round raises MigrationError.
- Commit: `commit="copy"` (default) writes each committed layer's new rows into the engine's tensors
  from a staging area. `commit="swap"` gives every tensor a spare of the same size (eplb.empty for
  eplb.empty tensors, else torch.empty), READs land in the spare, and the commit re-points the
  engine's tensor objects to the other buffer with Tensor.set_(): the same Python objects (and
  nn.Parameters) then see the new rows, no row is copied at commit, and the expert memory doubles.
  Views or data_ptr()s the engine took of a swapped tensor keep seeing the old buffer, so swap
  refuses tensors that are views of another tensor; take views again after each round.
"""
from __future__ import annotations

import json
import re

import numpy as np

from eplb import _eplb
from eplb.async_migration import AsyncMigration
from eplb.errors import Error, LayoutError, MigrationError, PeerLostError, TimeoutError
from eplb.group import ProcessGroup
from eplb.memory import TRANSPORTS, agent_of, transfer_agent

__all__ = ["Migrator"]

MAX_TIMEOUT_SECONDS = 86400  # the CLI's cap: no deadline is "never"
PATH_AGENT = "agent memory (zero-copy)"
PATH_HEAP = "heap memory (registered in place)"
COMMIT_MODES = ("copy", "swap")


class Migrator:
    """Migration of adopted expert tensors (see the module's docstring).

    Args:
        expert_weights: [layer][tensor] CPU tensors [num_local_slots, ...], contiguous.
        group: eplb.ProcessGroup, a torch.distributed gloo group, or None (the default torch group,
            else eplb's launcher / mpirun environment).
        num_nodes: nodes the ranks span (consecutive ranks per node), for the intra/inter-node bytes.
        transport: "auto" (UCX's choice), "shm" or "tcp"; eplb.empty tensors bring their own agent.
        timeout: seconds the transfers of one layer attempt may take, and the set-up; a collective
            waits up to twice that (the slowest rank's transfers, then its own exchange).
        retries: extra attempts of a layer whose transfers or checksums failed.
        verify: after each round the ranks confirm they committed the same mapping (report["verified"]).
        on_layer: optional callable(layer_report) called on every rank after each layer.
        inject: fault injection for tests, e.g. "err=0.2,seed=3" (a private agent; plain tensors only).
        reuse_checksums: reuse the checksums of earlier rounds for rows the engine has not written
            since (see the module's docstring); False: every round hashes its sources again.
        commit: "copy" (write new rows into the engine's tensors) or "swap" (a spare buffer per
            tensor, the engine's tensor objects re-pointed at commit; see the module's docstring).
    """

    def __init__(self, expert_weights, *, group=None, num_nodes: int = 1, transport: str = "auto",
                 timeout: float = 30.0, retries: int = 2, verify: bool = True, on_layer=None, inject: str = "",
                 reuse_checksums: bool = False, commit: str = "copy"):
        _check_options(num_nodes, transport, timeout, retries)
        if commit not in COMMIT_MODES:
            raise Error(f"commit must be one of {', '.join(COMMIT_MODES)}, got {commit!r}")
        if not isinstance(reuse_checksums, bool):
            raise Error(f"reuse_checksums must be True or False, got {reuse_checksums!r}")
        self._reuse_checksums = reuse_checksums
        self._group = _as_group(group)
        self._timeout, self._verify = float(timeout), bool(verify)
        self._weights = [list(layer) for layer in expert_weights] if _is_sequence(expert_weights) else None
        described, problem = _describe(self._weights)
        agent, paths = None, []
        if not problem:
            agent, paths, problem = _choose_agent(self._weights, transport, inject)
        self._commit, self._buffers = commit, None
        if not problem and commit == "swap":
            self._buffers, problem = _swap_buffers(self._weights, paths)
        mine = {"layout": described, "problem": problem, "agent": agent.name if agent is not None else ""}
        gathered = [json.loads(item) for item in self._group.allgather(json.dumps(mine).encode(), self._timeout)]
        _check_layouts(gathered, self._group.rank)
        self._agent_names = [item["agent"] for item in gathered]
        self._paths = paths
        self._slots = described[0][0]["slots"]
        self._native = _eplb.Migration(self._group._native, agent, self._tensor_arguments(paths), self._slots,
                                       int(num_nodes), self._timeout, int(retries), on_layer, commit)
        self._front = [0] * len(self._weights)  # per layer: the buffer the engine's tensors show
        self._broken = None
        self._async = None
        self._observers = []  # eplb.metrics collectors: observe_round(layer_reports), observe_stall(seconds)

    @property
    def group(self) -> ProcessGroup:
        return self._group

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

    def migrate(self, old_phy2log, new_phy2log, *, layers=None) -> dict:
        """Collective: moves every layer (or `layers`) from old_phy2log to new_phy2log ([layers][slots])."""
        old, new, experts = self._round_arguments(old_phy2log, new_phy2log, layers)
        if not self._reuse_checksums:
            self._native.forget_checksums([])
        try:
            code, message, layer_reports, seconds, retries, alone, callback_error = self._native.migrate(
                old, new, experts)
        finally:
            self._repoint_swapped()
        self._observe_round(layer_reports)
        if code != "ok":
            error = self._round_error(code, message, layer_reports, seconds)
            if alone and self._verify:  # the others completed the round and wait in the agreement: tell them
                self._native.agree(new, experts, seconds, message)
            raise error from callback_error
        report = self._round_report(layer_reports, seconds, retries)
        if self._verify:
            agreed, failure, slowest = self._native.agree(new, experts, seconds, "")
            report["verified"], report["slowest_rank_seconds"] = agreed, slowest
            if not agreed:
                raise MigrationError(f"after the round, the ranks disagree: {failure}", "mismatch",
                                     rank=self._group.rank, operation="agreeing on the round", elapsed_s=seconds,
                                     committed_layers=[item["layer"] for item in layer_reports if item["committed"]])
        return report

    def weights_rewritten(self, layers=None) -> None:
        """Tells eplb the engine wrote these layers' expert rows itself (None: every layer).

        Only needed with reuse_checksums=True: the checksums eplb remembers for those rows are
        dropped, and the next round hashes them again. Not while a round started by start() runs.
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
        self._async = AsyncMigration(self, native, make_error=self._round_error, make_report=self._round_report)
        return self._async

    def _round_arguments(self, old_phy2log, new_phy2log, layers):
        """(old, new, number of experts) of a round, checked; refused while this Migrator cannot run one."""
        if self._broken:
            raise Error(f"this Migrator stopped for good: {self._broken}", "not allowed")
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

    def _tensor_arguments(self, paths):
        """The engine's tensors (and spares) as the native layer takes them, [layer][tensor]."""
        layers = []
        for l, (layer, path) in enumerate(zip(self._weights, paths)):
            layers.append([])
            for t, tensor in enumerate(layer):
                spare = self._buffers[l][1][t] if self._buffers else None
                layers[-1].append(_eplb.TensorArgument(
                    f"tensor {t}", tensor.data_ptr(), _row_bytes(tensor), path == PATH_AGENT,
                    spare.data_ptr() if spare is not None else 0, path == PATH_AGENT))
        return layers

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

    def _observe_round(self, layer_reports) -> None:
        for observer in self._observers:
            observer.observe_round(layer_reports)

    def _observe_stall(self, seconds: float) -> None:
        for observer in self._observers:
            observer.observe_stall(seconds)

    def _round_report(self, layer_reports, seconds, retries) -> dict:
        for item in layer_reports:
            item["path"] = self._paths[item["layer"]]
            item["verified"] = item["committed"]
        report = _report(layer_reports, seconds, retries)
        report["commit"] = self._commit
        return report

    def _round_error(self, code, message, layer_reports, seconds) -> MigrationError:
        """The typed exception of a failed round; a Migrator whose group is broken refuses later rounds."""
        for item in layer_reports:
            item["path"] = self._paths[item["layer"]]
        if self._reuse_checksums and "checksum mismatch" in message:
            message += ("; reuse_checksums=True: if the engine wrote its expert rows since an earlier round, "
                        "call Migrator.weights_rewritten() after writing them")
        error = _migration_error(code, message, layer_reports, seconds, self._group.rank, self._agent_names)
        if isinstance(error, (PeerLostError, TimeoutError)):
            self._broken = str(error)
        return error

    def _phy2log(self, phy2log, name: str) -> np.ndarray:
        array = phy2log.detach().cpu().numpy() if hasattr(phy2log, "detach") else np.asarray(phy2log)
        if array.ndim != 2 or array.shape != (self.num_layers, self.num_slots):
            raise Error(f"{name} must be [layers][slots] = [{self.num_layers}][{self.num_slots}], "
                        f"got shape {tuple(array.shape)}")
        if not np.issubdtype(array.dtype, np.integer) or array.min() < 0:
            raise Error(f"{name} must hold expert indices >= 0, got dtype {array.dtype}, min {array.min()}")
        return np.ascontiguousarray(array, dtype=np.int64)


def _is_sequence(value) -> bool:
    return isinstance(value, (list, tuple))


def _check_options(num_nodes, transport, timeout, retries) -> None:
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise Error(f"num_nodes must be an int >= 1, got {num_nodes!r}")
    if transport not in TRANSPORTS:
        raise Error(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise Error(f"timeout must be in (0, {MAX_TIMEOUT_SECONDS}] seconds (a day, as the CLI's --timeout), "
                    f"got {timeout!r}")
    if not isinstance(retries, int) or retries < 0:
        raise Error(f"retries must be an int >= 0, got {retries!r}")


def _as_group(group) -> ProcessGroup:
    if isinstance(group, ProcessGroup):
        return group
    if group is not None:
        return ProcessGroup.from_torch(group)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return ProcessGroup.from_torch(None)
    except ImportError:
        pass
    return ProcessGroup.from_env()


def _row_bytes(tensor) -> int:
    return tensor[0].numel() * tensor.element_size()


def _describe(weights):
    """(this rank's layout as JSON-able lists, the reason its tensors cannot be used or "")."""
    if not weights:
        return [], "expert_weights must be a non-empty list over layers of lists of tensors"
    described = []
    for l, layer in enumerate(weights):
        if not _is_sequence(layer) or not layer:
            return [], f"expert_weights[{l}] must be a non-empty list of tensors"
        described.append([])
        for t, tensor in enumerate(layer):
            where = f"layer {l} tensor {t}"
            if not hasattr(tensor, "data_ptr") or not hasattr(tensor, "is_contiguous"):
                return [], f"{where} is a {type(tensor).__name__}, not a torch tensor"
            if tensor.device.type != "cpu":
                return [], (f"{where} is on {tensor.device}: eplb migrates host memory only (device memory needs a "
                            "CUDA-enabled UCX, and Debian's UCX is built without CUDA); pass CPU tensors")
            if not tensor.is_contiguous():
                return [], f"{where} of shape {tuple(tensor.shape)} is not contiguous (rows must be packed)"
            if tensor.dim() < 1 or tensor.shape[0] < 1 or tensor.numel() == 0:
                return [], f"{where} of shape {tuple(tensor.shape)} must be [num_local_slots, ...] and non-empty"
            described[-1].append({"slots": int(tensor.shape[0]), "bytes": _row_bytes(tensor),
                                  "dtype": str(tensor.dtype).replace("torch.", ""),
                                  "shape": list(tensor.shape[1:])})
    slots = {item["slots"] for layer in described for item in layer}
    if len(slots) > 1:
        return [], f"every tensor must have the same number of local slots (dimension 0), got {sorted(slots)}"
    return described, ""


def _choose_agent(weights, transport, inject):
    """(agent, per-layer path, problem): the agent of the eplb.empty tensors, else one for `transport`."""
    owners = [[agent_of(tensor) for tensor in layer] for layer in weights]
    agents = {id(owner[1]): owner for layer in owners for owner in layer if owner is not None}
    if len(agents) > 1:
        return None, [], "the eplb.empty tensors come from agents of different transports"
    if agents:
        owner_transport, agent = next(iter(agents.values()))
        if transport not in ("auto", owner_transport):
            return None, [], f"the eplb.empty tensors use transport {owner_transport!r}, not {transport!r}"
        if inject:
            return None, [], "inject needs plain tensors (eplb.empty tensors use their own agent)"
    else:
        agent = transfer_agent(transport, inject)
    paths = []
    for layer in owners:
        mine = [owner is not None for owner in layer]
        paths.append(PATH_AGENT if all(mine) else PATH_HEAP if not any(mine) else "mixed")
    return agent, [p if p != "mixed" else PATH_HEAP for p in paths], ""


def _swap_buffers(weights, paths):
    """([layer] = (aliases of the engine's tensors, spares), problem) for commit="swap".

    The aliases share the engine's storage, so a buffer stays alive while the engine's tensor
    object points at the other one; spares come from the same kind of memory as the tensors.
    """
    import torch

    from eplb.memory import empty_like

    heap_bytes = sum(t.numel() * t.element_size() for layer, path in zip(weights, paths) if path != PATH_AGENT
                     for t in layer)
    try:  # eplb.empty_like spares are admitted by their agent; torch.empty_like ones here, all together
        _eplb.admit_memory(heap_bytes, False, "Migrator(commit='swap'): the spare buffers")
    except Error as failure:
        return None, str(failure)
    buffers = []
    for l, (layer, path) in enumerate(zip(weights, paths)):
        for t, tensor in enumerate(layer):
            if not _spans_its_storage(tensor):
                return None, (f"layer {l} tensor {t} is a view of part of a larger tensor: commit='swap' re-points "
                              "tensor objects, and the larger tensor would keep the old rows; pass whole tensors "
                              "or use commit='copy'")
        try:
            spares = [empty_like(tensor, transport=agent_of(tensor)[0]) if path == PATH_AGENT
                      else torch.empty_like(tensor) for tensor in layer]
        except (Error, RuntimeError, MemoryError) as failure:
            return None, f"cannot allocate the spare buffers of layer {l} for commit='swap': {failure}"
        with torch.no_grad():
            aliases = [torch.empty(0, dtype=tensor.dtype).set_(tensor) for tensor in layer]
            for spare in spares:  # fault the pages in now, not during the first round's transfers
                spare.view(torch.uint8).zero_()
        buffers.append((aliases, spares))
    return buffers, ""


def _spans_its_storage(tensor) -> bool:
    """True when `tensor` is all of its storage (no other tensor sees rows it does not)."""
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    return tensor.storage_offset() == 0 and storage.nbytes() == tensor.numel() * tensor.element_size()


def _check_layouts(gathered, me: int) -> None:
    for r, item in enumerate(gathered):
        if item["problem"]:
            raise LayoutError(f"rank {r} cannot migrate its expert tensors: {item['problem']}")
    reference = gathered[0]["layout"]
    for r, item in enumerate(gathered[1:], start=1):
        theirs = item["layout"]
        if len(theirs) != len(reference):
            raise LayoutError(f"layout mismatch: rank {r} has {len(theirs)} layers, rank 0 has {len(reference)}")
        for l, (layer, layer0) in enumerate(zip(theirs, reference)):
            if len(layer) != len(layer0):
                raise LayoutError(f"layout mismatch: rank {r} has {len(layer)} tensors in layer {l}, "
                                  f"rank 0 has {len(layer0)}")
            for t, (tensor, tensor0) in enumerate(zip(layer, layer0)):
                if tensor != tensor0:
                    raise LayoutError(
                        f"nbytes_per_expert mismatch: rank {r} has layer {l} tensor {t} of {tensor['bytes']} B per "
                        f"expert ({tensor['slots']} slots of {tensor['dtype']} {tensor['shape']}), rank 0 has "
                        f"{tensor0['bytes']} B ({tensor0['slots']} slots of {tensor0['dtype']} {tensor0['shape']}); "
                        "every rank must hold the same tensors (nothing was moved)")


def _layer_index(layer, count: int) -> int:
    index = int(layer)
    if not 0 <= index < count:
        raise Error(f"layers: {layer} is not a layer in [0, {count})")
    return index


BYTE_FIELDS = ("bytes_kept", "bytes_local", "bytes_intra_node", "bytes_inter_node")


def _report(layer_reports, seconds: float, retries: int) -> dict:
    totals = {field: sum(item[field] for item in layer_reports if item["committed"]) for field in BYTE_FIELDS[1:]}
    totals["bytes_kept"] = sum(item["bytes_kept"] for item in layer_reports)
    moved = totals["bytes_local"] + totals["bytes_intra_node"] + totals["bytes_inter_node"]
    totals.update(bytes_moved=moved, bytes_read_here=sum(item["bytes_read_here"] for item in layer_reports),
                  seconds=seconds, retries=retries, gb_per_s=moved / seconds / 1e9 if seconds > 0 else 0.0,
                  layers_committed=sum(item["committed"] for item in layer_reports))
    return {"layers": layer_reports, "totals": totals, "verified": None}


def _migration_error(code, message, layer_reports, seconds, me, agent_names) -> MigrationError:
    committed = [item["layer"] for item in layer_reports if item["committed"]]
    layer = layer_reports[-1]["layer"] if layer_reports else None
    operation = re.search(r"at layer \d+ \(([^()]*)\)", message)
    operation = operation.group(1) if operation else ("transfers and verification" if code == "aborted" else None)
    state = (f"layer {layer} and later: old placement on every rank; layers {committed or 'none'}: new placement"
             if layer is not None else "nothing moved")
    kind = {"timeout": TimeoutError, "remote disconnect": PeerLostError}.get(code, MigrationError)
    return kind(message, code, layer=layer, rank=me, peer=_peer(message, me, agent_names), operation=operation,
                state=state, elapsed_s=seconds, committed_layers=committed)


def _peer(message: str, me: int, agent_names) -> int | None:
    """The first other rank a failure message names (as "rank N" or by its agent's name)."""
    for match in re.finditer(r"\branks? (\d+)", message):
        if int(match.group(1)) != me:
            return int(match.group(1))
    for rank, name in enumerate(agent_names):
        if rank != me and name and name in message:
            return rank
    return None
