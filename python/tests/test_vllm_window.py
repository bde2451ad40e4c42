"""eplb.vllm_window's pure part and its argument checks (vLLM's own rearrange with it: test_vllm_communicator.py).

chunked_logical_window is compared with plain loops: time order from vLLM's next write slot, the oldest
W % chunks steps dropped, physical slots summed into their logical expert, slots holding -1 dropped.
"""
import re

import numpy as np
import pytest
import torch

import eplb
from eplb.vllm_window import chunked_logical_window, install_window, uninstall_window


def by_loops(window: np.ndarray, phy2log: np.ndarray, next_step: int, logical: int, chunks: int) -> np.ndarray:
    steps, layers, physical = window.shape
    count = min(chunks, steps)
    size = steps // count
    ordered = [window[(next_step + t) % steps] for t in range(steps)]  # oldest first
    ordered = ordered[steps - count * size:]
    out = np.zeros((count, layers, logical), dtype=np.int64)
    for t, step in enumerate(ordered):
        for layer in range(layers):
            for p in range(physical):
                if phy2log[layer, p] >= 0:
                    out[t // size, layer, phy2log[layer, p]] += int(step[layer, p])
    return out


@pytest.mark.parametrize("steps, chunks, next_step", [(42, 8, 13), (40, 8, 0), (5, 20, 3), (1000, 20, 999),
                                                      (7, 1, 4)])
def test_chunks_follow_time_order_and_logical_experts(steps, chunks, next_step):
    rng = np.random.default_rng(steps * 31 + chunks)
    layers, logical, physical = 3, 6, 9
    window = rng.integers(0, 1000, size=(steps, layers, physical)).astype(np.int32)
    phy2log = np.stack([rng.permutation(np.arange(physical) % logical) for _ in range(layers)])
    phy2log[1, 4] = -1  # a slot vLLM leaves empty (elastic scale-down)
    got = chunked_logical_window(torch.from_numpy(window), torch.from_numpy(phy2log), next_step, logical, chunks)
    assert got.dtype == torch.int64 and got.shape == (min(chunks, steps), layers, logical)
    np.testing.assert_array_equal(got.numpy(), by_loops(window, phy2log, next_step, logical, chunks))


def test_a_numpy_chunk_count_works():
    window = torch.arange(12, dtype=torch.int32).reshape(6, 1, 2)
    got = chunked_logical_window(window, torch.tensor([[1, 0]]), 0, 2, np.int64(3))
    assert got.tolist() == [[[1 + 3, 0 + 2]], [[5 + 7, 4 + 6]], [[9 + 11, 8 + 10]]]


def test_the_newest_chunk_is_last():
    window = torch.zeros(10, 1, 2, dtype=torch.int32)
    window[6, 0, 1] = 5  # vLLM writes slot 7 next: slot 6 is the newest step
    got = chunked_logical_window(window, torch.tensor([[0, 1]]), 7, 2, 5)
    assert got[-1, 0, 1] == 5 and int(got.sum()) == 5


@pytest.mark.parametrize("estimator, chunks, message", [
    ("sum", 20, "vLLM's own window sum needs no install"),
    ("bogus", 20, "unknown estimator 'bogus'"),
    (None, 20, "estimator must be"),
    ("auto", 0, re.escape("chunks must be in [1, 1073741824], got 0")),
    ("auto", 2.5, "chunks must be an integer, got 2.5"),
    ("auto", True, "chunks must be an integer, got True"),
])
def test_install_window_refuses_bad_values_before_touching_vllm(estimator, chunks, message):
    with pytest.raises(eplb.Error, match=message):
        install_window(estimator, chunks)
    assert uninstall_window() is False  # nothing was installed
