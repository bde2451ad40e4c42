"""eplb's load estimators on vLLM's own load window (written against vllm 0.33.0; docs/python.md, Interoperability).

vLLM sums its circular load window (`EplbState.expert_load_window`, [window_size, layers, physical]) before
it all-reduces it and calls the policy, so a policy never sees how the load moved inside the window.

Contract:
- `install_window(estimator="auto", chunks=20)` wraps `EplbState.rearrange`. During one rearrange, the
  all-reduce of the summed windows (`EplbState._allreduce_list`, called once there) is replaced, per model,
  by: the rank's window in time order (oldest step first, from `expert_load_window_step`), mapped to logical
  experts as vLLM maps it (the map in force; slots holding -1 dropped), summed into `chunks` chunks of equal
  length (the oldest `window_size % chunks` steps dropped), all-reduced over the EP group, then
  `eplb.estimate_load(chunks, estimator)`: each chunk is one step of the estimator (ema:H: H chunks).
  The policy, vLLM's skip-rearrange check and `last_expert_load` all receive that estimate, [layers,
  logical experts], scaled like a sum and rounded to vLLM's own dtype and device (int64 on the window's
  device), so later all-reduces of `last_expert_load` (elastic scale-up) match a fresh rank's. Each
  rearrangement makes one host round trip for the estimate (inside vLLM's gpu_sync_allowed).
- Profile runs and `use_last_expert_load` rearranges keep vLLM's path untouched.
- Every rank must install the same estimator and chunks (the plugin does, from the environment every vLLM
  process inherits): the ranks' all-reduces must match. Windows are aligned by each rank's own position
  (vLLM skips recording dummy steps per rank).
- `uninstall_window()` puts vLLM's rearrange back. Both return/raise as documented; bad values raise
  eplb.Error.
"""
from __future__ import annotations

import functools
import importlib
import logging

import numpy as np

from eplb import _arrays
from eplb.errors import Error

_STATE_MODULE = "vllm.distributed.eplb.eplb_state"
_vllm_rearrange = None  # vLLM's own EplbState.rearrange while install_window() is in force
logger = logging.getLogger("eplb.vllm")


def chunked_logical_window(window, physical_to_logical, next_step: int, num_logical: int, chunks: int):
    """A rank's window [W, L, physical] as [chunks, L, num_logical] int64 sums of consecutive steps.

    `next_step` is the slot vLLM writes next (its oldest step); slots of `physical_to_logical` [L, physical]
    holding -1 are dropped; the oldest W % chunks steps are dropped so that every chunk has W // chunks steps.
    Each chunk is summed from at most two slices of the window in place (no copy of the window).
    """
    import torch

    steps, layers, physical = window.shape
    count = min(chunks, steps)
    size = steps // count
    first = steps - count * size  # the oldest steps that fill no whole chunk
    per_chunk = torch.empty(count, layers, physical, dtype=torch.int64, device=window.device)
    for chunk in range(count):
        start = (int(next_step) + first + chunk * size) % steps
        end = start + size
        torch.sum(window[start:min(end, steps)], dim=0, dtype=torch.int64, out=per_chunk[chunk])
        if end > steps:  # the chunk wraps around the circular window
            per_chunk[chunk] += window[:end - steps].sum(dim=0, dtype=torch.int64)
    index = physical_to_logical.masked_fill(physical_to_logical < 0, num_logical).long()
    logical = torch.zeros(count, layers, num_logical + 1, dtype=torch.int64, device=window.device)
    logical.scatter_add_(-1, index.unsqueeze(0).expand_as(per_chunk), per_chunk)
    return logical[..., :-1].contiguous()


def install_window(estimator: str = "auto", chunks: int = 20) -> None:
    """Makes vLLM's EplbState plan from `estimator` over its window cut into `chunks` chunks (module docstring).

    Args:
        estimator: "auto", "ema:H" (half-life H chunks) or "robust:Z" ("sum" is vLLM's own: use
            uninstall_window()).
        chunks: the estimator's steps: the window cut into this many chunks of consecutive steps (>= 4 for
            "auto" to choose; at most the window's steps are used).

    Raises:
        eplb.Error: an unknown estimator, or chunks not a positive integer.
        ModuleNotFoundError: vllm is not installed.
    """
    global _vllm_rearrange
    chunks = check_window_settings(estimator, chunks)
    state_class = importlib.import_module(_STATE_MODULE).EplbState
    if _vllm_rearrange is None:
        _vllm_rearrange = state_class.rearrange
    original = _vllm_rearrange

    @functools.wraps(original)
    def rearrange(self, is_profile: bool = False, rank_mapping=None, use_last_expert_load: bool = False):
        if is_profile or use_last_expert_load:
            return original(self, is_profile, rank_mapping, use_last_expert_load)
        self._allreduce_list = functools.partial(_estimated_windows, self, estimator, chunks)
        try:
            return original(self, is_profile, rank_mapping, use_last_expert_load)
        finally:
            del self._allreduce_list  # the instance attribute shadowed vLLM's method for this call only

    state_class.rearrange = rearrange


def uninstall_window() -> bool:
    """Puts vLLM's own EplbState.rearrange back; False when install_window() was not in force."""
    global _vllm_rearrange
    if _vllm_rearrange is None:
        return False
    importlib.import_module(_STATE_MODULE).EplbState.rearrange = _vllm_rearrange
    _vllm_rearrange = None
    return True


def check_window_settings(estimator, chunks) -> int:
    """install_window's arguments checked (eplb.Error naming the bad one); returns chunks as an int."""
    from eplb.policy import estimate_load

    if not isinstance(estimator, str) or estimator == "sum":
        raise Error(f"estimator must be 'auto', 'ema:H' or 'robust:Z' (vLLM's own window sum needs no "
                    f"install), got {estimator!r}")
    estimate_load(np.zeros((1, 1, 1)), estimator)  # an unknown name raises eplb.Error with the accepted ones
    return _arrays.count("chunks", chunks)


def _estimated_windows(state, estimator: str, chunks: int, summed: list) -> list:
    """In place of EplbState._allreduce_list(summed): each model's chunked window, all-reduced, estimated, in the
    dtype and on the device of vLLM's own sum (int64: every rank's later all-reduces of `last_expert_load`,
    elastic scale-up's included, must match a fresh rank's)."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_ep_group
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed

    from eplb.policy import estimate_load

    models = list(state.model_states.values())
    if len(summed) != len(models):
        raise Error(f"eplb.vllm window: vLLM's rearrange all-reduced {len(summed)} windows for {len(models)} "
                    f"models; this vLLM does not match the one eplb was written against (0.33.0)")
    group = get_ep_group().device_group
    estimates = []
    for model_state, vllm_sum in zip(models, summed):
        window = chunked_logical_window(model_state.expert_load_window, model_state.physical_to_logical_map,
                                        state.expert_load_window_step, model_state.model.num_logical_experts,
                                        chunks)
        dist.all_reduce(window, group=group)
        with gpu_sync_allowed():  # one host round trip per rearrangement, as vLLM's own policy call makes
            load, applied = estimate_load(window.cpu(), estimator)
            estimates.append(load.round().to(device=vllm_sum.device, dtype=vllm_sum.dtype))
        if group.rank() == 0:
            logger.info("eplb: %s planned from %s over %d chunks of its load window (%s)",
                        model_state.model_name, applied, window.shape[0], estimator)
    return estimates
