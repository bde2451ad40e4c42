"""eplb.sglang: SGLang's algorithm entry shape and its recorder dumps."""
import enum

import numpy as np
import pytest
import torch

import eplb
import eplb.sglang


class NotAWeight:
    """A pickled object that weights_only loading must refuse (it could run code)."""


class EplbAlgorithm(enum.Enum):  # the shape of SGLang's enum
    deepseek = enum.auto()
    deepseek_hierarchical = enum.auto()


@pytest.fixture(scope="module")
def window():
    return torch.randint(0, 200, (6, 3, 32), generator=torch.Generator().manual_seed(1))


def test_deepseek_hierarchical_equals_eplb(window):
    # 64 physical experts, 8 per GPU (8 GPUs), 4 groups, 2 nodes
    got = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, "deepseek_hierarchical")
    expected = eplb.rebalance_experts(window.sum(dim=0), 64, 4, 2, 8)
    for a, b in zip(got, expected):
        assert isinstance(a, torch.Tensor) and a.dtype == torch.int64 and torch.equal(a, b)
    by_enum = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, EplbAlgorithm.deepseek_hierarchical)
    assert torch.equal(by_enum[0], got[0])


def test_deepseek_is_global(window):
    got = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, EplbAlgorithm.deepseek)
    expected = eplb.rebalance_experts(window.sum(dim=0), 64, 1, 1, 8)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    no_groups = eplb.sglang.rebalance_experts(window, 64, 8, None, 2, "deepseek")
    assert torch.equal(no_groups[0], got[0])


def test_auto_picks_the_variant(window):
    hierarchical = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, "deepseek_hierarchical")
    assert torch.equal(eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, "auto")[0], hierarchical[0])
    flat = eplb.sglang.rebalance_experts(window, 64, 8, 1, 2, "deepseek")
    # 1 group on 2 nodes: 1 % 2 != 0, so auto is the global variant
    assert torch.equal(eplb.sglang.rebalance_experts(window, 64, 8, 1, 2, "auto")[0], flat[0])


def test_log2phy_is_padded_like_sglangs(window):
    phy2log, log2phy, logcnt = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, "deepseek_hierarchical")
    assert log2phy.shape == (3, 32, int(logcnt.max()))
    for layer in range(3):
        for expert in range(32):
            slots = [s for s in log2phy[layer, expert].tolist() if s >= 0]
            assert len(slots) == logcnt[layer, expert]
            assert all(phy2log[layer, s] == expert for s in slots)
            assert log2phy[layer, expert, len(slots):].eq(-1).all()


@pytest.mark.parametrize("algorithm", ["relabel", "incremental", "balanced"])
def test_eplb_algorithms_with_current(window, algorithm):
    current = eplb.sglang.rebalance_experts(window[:3], 64, 8, 4, 2, "deepseek_hierarchical")[0]
    got = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, algorithm, current=current, budget=4)
    expected = eplb.rebalance_experts(window.sum(dim=0), 64, 4, 2, 8, policy=algorithm, current=current, budget=4)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_bad_arguments():
    window = np.ones((2, 1, 16))
    with pytest.raises(eplb.Error, match="unknown algorithm"):
        eplb.sglang.rebalance_experts(window, 16, 4, 4, 2, "deepseek_vec")
    with pytest.raises(eplb.Error, match="multiple of num_local_physical_experts"):
        eplb.sglang.rebalance_experts(window, 16, 3, 4, 2, "deepseek")
    with pytest.raises(eplb.Error, match="num_groups % num_nodes"):
        eplb.sglang.rebalance_experts(window, 16, 4, 3, 2, "deepseek_hierarchical")


def test_load_recorder_dump(tmp_path, window):
    path = tmp_path / "expert_distribution_recorder_1700000000.0.pt"
    torch.save({"rank": 0, "logical_count": window, "average_utilization_rate_over_window": None}, path)
    counts = eplb.sglang.load_recorder_dump(path)
    assert torch.equal(counts, window)
    got = eplb.sglang.rebalance_experts(counts, 64, 8, 4, 2, "auto")
    assert got[0].shape == (3, 64)


@pytest.mark.parametrize("content,message", [
    ({"rank": 0}, "not a recorder dump"),
    ([1, 2, 3], "not a recorder dump"),
    ({"logical_count": torch.ones(3, 4)}, "\\[steps, layers, experts\\]"),
    ({"logical_count": -torch.ones(2, 3, 4)}, "negative"),
    ({"logical_count": torch.full((2, 3, 4), float("nan"))}, "non-finite"),
])
def test_bad_recorder_dumps(tmp_path, content, message):
    path = tmp_path / "dump.pt"
    torch.save(content, path)
    with pytest.raises(eplb.Error, match=message):
        eplb.sglang.load_recorder_dump(path)


def test_unreadable_recorder_dumps(tmp_path):
    with pytest.raises(eplb.Error, match="cannot read"):
        eplb.sglang.load_recorder_dump(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(eplb.Error, match="cannot read"):
        eplb.sglang.load_recorder_dump(garbage)
    pickled_object = tmp_path / "object.pt"
    torch.save({"logical_count": torch.ones(1, 2, 3), "payload": NotAWeight()}, pickled_object)
    with pytest.raises(eplb.Error, match="cannot read"):
        eplb.sglang.load_recorder_dump(pickled_object)
