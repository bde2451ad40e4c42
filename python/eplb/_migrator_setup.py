"""What eplb.Migrator does before the C++ set-up: check the options and the local tensors, choose the
data plane, allocate the swap commit's spares, and describe every tensor (dtype and shape included)
for the one layout check, which is C++'s (include/eplb/migrate.h check_layouts_agree). Private to
eplb.Migrator; a local problem becomes the reason every rank's set-up fails with (refuse_setup).
"""
from __future__ import annotations

import math

from eplb import _eplb
from eplb.errors import Error
from eplb.group import ProcessGroup
from eplb.memory import TRANSPORTS, agent_of, transfer_agent

MAX_TIMEOUT_SECONDS = 86400  # the CLI's cap: no deadline is "never"
PATH_AGENT = "agent memory (zero-copy)"
PATH_HEAP = "heap memory (registered in place)"
COMMIT_MODES = ("copy", "swap")
# transport -> data plane: eplb's UCX agent ("ucx", and "shm"/"tcp" choosing UCX's transports), the
# engine's torch.distributed data group, device rows staged through host memory, a real NIXL agent.
PLANES = {"ucx": "ucx", "shm": "ucx", "tcp": "ucx", "torch": "torch", "staged": "staged", "nixl": "nixl"}
TRANSPORT_NAMES = ("auto", *PLANES)


def is_sequence(value) -> bool:
    return isinstance(value, (list, tuple))


def check_options(num_nodes, transport, timeout, retries, commit, reuse_checksums, transfer_schedule="off") -> None:
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise Error(f"num_nodes must be an int >= 1, got {num_nodes!r}")
    if transport not in TRANSPORT_NAMES:
        raise Error(f"transport must be one of {', '.join(TRANSPORT_NAMES)}, got {transport!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_SECONDS):
        raise Error(f"timeout must be None (automatic) or in (0, {MAX_TIMEOUT_SECONDS}] seconds (a day, as the "
                    f"CLI's --timeout), got {timeout!r}")
    if not isinstance(retries, int) or retries < 0:
        raise Error(f"retries must be an int >= 0, got {retries!r}")
    if commit not in COMMIT_MODES:
        raise Error(f"commit must be one of {', '.join(COMMIT_MODES)}, got {commit!r}")
    if not isinstance(reuse_checksums, bool):
        raise Error(f"reuse_checksums must be True or False, got {reuse_checksums!r}")
    if not isinstance(transfer_schedule, str):
        raise Error(f"transfer_schedule must be a str (one of the names in eplb.Migrator's docstring), "
                    f"got {transfer_schedule!r}")
    try:
        _eplb.check_transfer_schedule(transfer_schedule)
    except Error as failure:
        raise Error(f"transfer_schedule {failure}", failure.code) from None


def as_group(group) -> ProcessGroup:
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


def row_bytes(tensor) -> int:
    return tensor[0].numel() * tensor.element_size()


def _tensor_problem(tensor, where: str) -> str:
    if not hasattr(tensor, "data_ptr") or not hasattr(tensor, "is_contiguous"):
        return f"{where} is a {type(tensor).__name__}, not a torch tensor"
    if not tensor.is_contiguous():
        return f"{where} of shape {tuple(tensor.shape)} is not contiguous (rows must be packed)"
    if tensor.dim() < 1 or tensor.shape[0] < 1 or tensor.numel() == 0:
        return f"{where} of shape {tuple(tensor.shape)} must be [num_local_slots, ...] and non-empty"
    return ""


def local_problem(weights) -> str:
    """Why this rank's tensors cannot be migrated at all, or ""."""
    if not weights:
        return "expert_weights must be a non-empty list over layers of lists of tensors"
    devices, slots = set(), set()
    for l, layer in enumerate(weights):
        if not is_sequence(layer) or not layer:
            return f"expert_weights[{l}] must be a non-empty list of tensors"
        for t, tensor in enumerate(layer):
            problem = _tensor_problem(tensor, f"layer {l} tensor {t}")
            if problem:
                return problem
            devices.add(str(tensor.device))
            slots.add(int(tensor.shape[0]))
    if len(slots) > 1:
        return f"every tensor must have the same number of local slots (dimension 0), got {sorted(slots)}"
    if len(devices) > 1:
        return f"every expert tensor of a rank must be on one device, got {', '.join(sorted(devices))}"
    return ""


def choose_plane(transport: str, weights, data_group) -> tuple:
    """(plane, problem): the data plane `transport` means for these tensors."""
    device = weights[0][0].device
    if transport == "auto":
        if device.type == "cpu":
            return "ucx", ""
        backend = _backend(data_group)
        return ("torch" if backend == "nccl" else "staged"), ""
    plane = PLANES[transport]
    if plane == "ucx" and device.type != "cpu":
        return plane, (f"the tensors are on {device}: transport {transport!r} moves host memory; use transport "
                       "'torch' (an NCCL data_group), 'staged' (a gloo data_group) or 'nixl', or 'auto'")
    if plane in ("torch", "staged") and data_group is None:
        return plane, (f"transport {plane!r} moves rows over data_group, a torch.distributed group of the same "
                       "ranks (NCCL for CUDA tensors, gloo for CPU tensors, gloo for 'staged'); none was given")
    return plane, ""


def _backend(group):
    if group is None:
        return None
    import torch.distributed as dist

    return str(dist.get_backend(group))


def choose_agent(weights, transport: str, inject: str):
    """(agent, per-layer path, problem) of the ucx plane: the eplb.empty tensors' agent, else one."""
    owners = [[agent_of(tensor) for tensor in layer] for layer in weights]
    agents = {id(owner[1]): owner for layer in owners for owner in layer if owner is not None}
    ucx_transport = transport if transport in TRANSPORTS else "auto"
    if len(agents) > 1:
        return None, [], "the eplb.empty tensors come from agents of different transports"
    if agents:
        owner_transport, agent = next(iter(agents.values()))
        if ucx_transport not in ("auto", owner_transport):
            return None, [], f"the eplb.empty tensors use transport {owner_transport!r}, not {transport!r}"
        if inject:
            return None, [], "inject needs plain tensors (eplb.empty tensors use their own agent)"
    else:
        agent = transfer_agent(ucx_transport, inject)
    paths = []
    for layer in owners:
        mine = [owner is not None for owner in layer]
        paths.append(PATH_AGENT if all(mine) else PATH_HEAP)
    return agent, paths, ""


def swap_buffers(weights, paths):
    """([layer] = (aliases of the engine's tensors, spares), problem) for commit="swap".

    The aliases share the engine's storage, so a buffer stays alive while the engine's tensor
    object points at the other one; spares come from the same kind of memory as the tensors.
    """
    import torch

    from eplb.memory import empty_like

    if weights[0][0].device.type != "cpu":
        return None, (f"commit='swap' re-points tensor objects, and CUDA graphs captured on the old storage of "
                      f"{weights[0][0].device} tensors would keep reading it: use commit='copy' for device tensors")
    for l, layer in enumerate(weights):
        for t, tensor in enumerate(layer):
            if not spans_its_storage(tensor):
                return None, (f"layer {l} tensor {t} is a view of part of a larger tensor: commit='swap' re-points "
                              "tensor objects, and the larger tensor would keep the old rows; pass whole tensors "
                              "or use commit='copy'")
    heap_bytes = sum(t.numel() * t.element_size() for layer, path in zip(weights, paths) if path != PATH_AGENT
                     for t in layer)
    try:  # eplb.empty_like spares are admitted by their agent; torch.empty_like ones here, all together
        _eplb.admit_memory(heap_bytes, False, "Migrator(commit='swap'): the spare buffers")
        buffers = []
        for layer, path in zip(weights, paths):
            spares = [empty_like(tensor, transport=agent_of(tensor)[0]) if path == PATH_AGENT
                      else torch.empty_like(tensor) for tensor in layer]
            with torch.no_grad():
                aliases = [torch.empty(0, dtype=tensor.dtype).set_(tensor) for tensor in layer]
                for spare in spares:  # fault the pages in now, not during the first round's transfers
                    spare.view(torch.uint8).zero_()
            buffers.append((aliases, spares))
    except (Error, RuntimeError, MemoryError) as failure:
        return None, f"cannot allocate the spare buffers for commit='swap': {failure}"
    return buffers, ""


def spans_its_storage(tensor) -> bool:
    """True when `tensor` is all of its storage (no other tensor sees rows it does not)."""
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    return tensor.storage_offset() == 0 and storage.nbytes() == tensor.numel() * tensor.element_size()


def tensor_arguments(weights, buffers, paths, plane: str):
    """The tensors (and spares) as the native Migrator takes them, [layer][tensor], dtype and shape included."""
    layers = []
    for l, layer in enumerate(weights):
        layers.append([])
        agent_memory = plane == "ucx" and paths[l] == PATH_AGENT
        for t, tensor in enumerate(layer):
            primary = buffers[l][0][t] if buffers else tensor
            spare = buffers[l][1][t] if buffers else None
            layers[-1].append(_eplb.TensorArgument(
                f"tensor {t}", primary.data_ptr(), row_bytes(tensor), agent_memory,
                spare.data_ptr() if spare is not None else 0, agent_memory,
                str(tensor.dtype).replace("torch.", ""), [int(extent) for extent in tensor.shape[1:]]))
    return layers


def make_plane(plane: str, weights, buffers, data_group, rank: int, inject: str):
    """The Python data plane object for `plane` over these tensors (eplb/planes)."""
    from eplb.planes import NixlPlane, RowSpace, StagedPlane, TorchPlane

    primary = [aliases for aliases, _ in buffers] if buffers else weights
    rows = RowSpace(primary, [spares for _, spares in buffers] if buffers else None)
    if plane == "torch":
        return TorchPlane(rows, data_group, rank=rank, inject=inject)
    if plane == "staged":
        return StagedPlane(rows, data_group, rank=rank, inject=inject)
    return NixlPlane(rows, rank=rank, inject=inject)


def bytes_per_layer(weights) -> int:
    return max(sum(math.prod(t.shape) * t.element_size() for t in layer) for layer in weights)
