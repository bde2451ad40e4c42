"""RowSpace: one rank's expert rows as uint8 views, by (layer, local slot, buffer), for eplb's Python
data planes (eplb/planes/__init__.py).

Contract: buffer 0 is the engine's tensors (their original storage, whatever tensor objects a swap
commit re-pointed), 1 their spares (commit="swap"), 2 the staging rows: one layer's worth, packed,
allocated here on the rows' device unless given (vLLM's expert_buffer, shaped like one layer). Every
tensor is viewed as [slots, bytes per expert] uint8, so rows of any dtype (FP8, packed uint8, bf16)
move and are digested as bytes. copy() batches the row copies of one (layer, source buffer,
destination buffer) into one indexed copy per tensor; digest() returns eplb-dev64 digests
(eplb/digest.py), [row * tensors + tensor].
"""
from __future__ import annotations

from collections import defaultdict

from eplb.digest import digest_selected
from eplb.errors import Error

__all__ = ["RowSpace", "as_rows"]

PRIMARY, SPARE, STAGING = 0, 1, 2


def as_rows(tensor):
    """A contiguous tensor [slots, ...] as [slots, bytes per slot] uint8 (the same memory)."""
    import torch

    if not tensor.is_contiguous():
        raise Error(f"a tensor of shape {tuple(tensor.shape)} is not contiguous: rows must be packed")
    flat = tensor.reshape(tensor.shape[0], -1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


class RowSpace:
    """The rows of one rank's buffers (see the module's docstring)."""

    def __init__(self, primary, spare=None, staging=None):
        import torch

        self._buffers = {PRIMARY: [[as_rows(t) for t in layer] for layer in primary]}
        if spare is not None:
            self._buffers[SPARE] = [[as_rows(t) for t in layer] for layer in spare]
        first = self._buffers[PRIMARY][0][0]
        self.device, self.slots = first.device, first.shape[0]
        if staging is not None:  # the engine's buffer of one layer's shape, for every layer
            views = [as_rows(t) for t in staging]
            self._buffers[STAGING] = [views for _ in primary]
        else:
            widest = max(sum(v.numel() for v in layer) for layer in self._buffers[PRIMARY])
            self._staging = torch.empty(widest, dtype=torch.uint8, device=self.device)
            self._buffers[STAGING] = [self._packed_views(layer) for layer in self._buffers[PRIMARY]]

    def _packed_views(self, layer):
        views, offset = [], 0
        for view in layer:
            views.append(self._staging[offset:offset + view.numel()].view(view.shape))
            offset += view.numel()
        return views

    @property
    def num_layers(self) -> int:
        return len(self._buffers[PRIMARY])

    def tensors(self, layer: int) -> int:
        return len(self._buffers[PRIMARY][layer])

    def view(self, layer: int, buffer: int, tensor: int):
        """[slots, bytes] uint8 of one tensor of one layer in one buffer."""
        try:
            return self._buffers[buffer][layer][tensor]
        except (KeyError, IndexError):
            raise Error(f"no row buffer {buffer} for layer {layer} tensor {tensor} on this rank", "internal") from None

    def row(self, layer: int, slot: int, buffer: int, tensor: int):
        return self.view(layer, buffer, tensor)[slot]

    def row_bytes(self, layer: int) -> int:
        """Bytes of one expert of `layer` (all tensors)."""
        return sum(view.shape[1] for view in self._buffers[PRIMARY][layer])

    def copy(self, copies) -> None:
        """copies: [((layer, slot, buffer), (layer, slot, buffer))]. On the CPU between different buffers row
        to row, in place (a gathered temporary per layer costs its page faults there, more than the copy);
        otherwise gathered per buffer pair (one index_copy_ per tensor on a device; within one buffer, so
        that a permutation reads every row before it is written)."""
        import torch

        within_a_buffer = any((layer, buffer) == (to_layer, to_buffer)
                              for (layer, _, buffer), (to_layer, _, to_buffer) in copies)
        if self.device.type == "cpu" and not within_a_buffer:
            for (layer, slot, buffer), (to_layer, to_slot, to_buffer) in copies:
                for t in range(self.tensors(layer)):
                    self.view(to_layer, to_buffer, t)[to_slot].copy_(self.view(layer, buffer, t)[slot])
            return
        groups = defaultdict(lambda: ([], []))
        for (layer, slot, buffer), (to_layer, to_slot, to_buffer) in copies:
            sources, targets = groups[(layer, buffer, to_layer, to_buffer)]
            sources.append(slot)
            targets.append(to_slot)
        for (layer, buffer, to_layer, to_buffer), (sources, targets) in groups.items():
            source_index = torch.tensor(sources, device=self.device)
            target_index = torch.tensor(targets, device=self.device)
            for t in range(self.tensors(layer)):
                target = self.view(to_layer, to_buffer, t)
                target.index_copy_(0, target_index, self.view(layer, buffer, t).index_select(0, source_index))

    def digest(self, rows) -> list[int]:
        """rows: [(layer, slot, buffer)] -> digests [row * tensors + tensor]."""
        import torch

        if not rows:
            return []
        layer = rows[0][0]
        tensors = self.tensors(layer)
        out = [0] * (len(rows) * tensors)
        by_buffer = defaultdict(list)
        for i, (row_layer, slot, buffer) in enumerate(rows):
            if row_layer != layer:
                raise Error(f"digest: rows of layers {layer} and {row_layer} in one call", "internal")
            by_buffer[buffer].append((i, slot))
        for buffer, items in by_buffer.items():
            index = torch.tensor([slot for _, slot in items], device=self.device)
            for t in range(tensors):
                values = digest_selected(self.view(layer, buffer, t), [slot for _, slot in items], index)
                for (i, _), value in zip(items, values):
                    out[i * tensors + t] = value
        return out
