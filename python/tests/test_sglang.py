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
    got = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, "deepseek_hierarchical", ties="eplb")
    expected = eplb.rebalance_experts(window.sum(dim=0), 64, 4, 2, 8)
    for a, b in zip(got, expected):
        assert isinstance(a, torch.Tensor) and a.dtype == torch.int64 and torch.equal(a, b)
    by_enum = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, EplbAlgorithm.deepseek_hierarchical, ties="eplb")
    assert torch.equal(by_enum[0], got[0])


def test_deepseek_is_global(window):
    got = eplb.sglang.rebalance_experts(window, 64, 8, 4, 2, EplbAlgorithm.deepseek, ties="eplb")
    expected = eplb.rebalance_experts(window.sum(dim=0), 64, 1, 1, 8)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    no_groups = eplb.sglang.rebalance_experts(window, 64, 8, None, 2, "deepseek", ties="eplb")
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
        eplb.sglang.rebalance_experts(window, 16, 4, 4, 2, "no_such_algorithm")
    with pytest.raises(eplb.Error, match="takes no options"):
        eplb.sglang.rebalance_experts(window, 16, 4, 4, 2, "deepseek_vec", threads=2)
    with pytest.raises(eplb.Error, match="active_ranks"):
        eplb.sglang.rebalance_experts(window, 16, 4, 4, 2, "elasticity_aware", active_ranks=[0, 0, 0, 0])
    with pytest.raises(eplb.Error, match="active_ranks"):
        eplb.sglang.rebalance_experts(window, 16, 4, 4, 2, "elasticity_aware", active_ranks=[1, 1])
    with pytest.raises(eplb.Error, match="negative"):
        eplb.sglang.rebalance_experts(-window, 16, 4, 4, 2, "deepseek_vec")
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
    ({"logical_count": torch.ones(3)}, "2-D or 3-D"),
    ({"logical_count": "counts"}, "2-D or 3-D"),
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


def test_running_sum_dumps_load(tmp_path, window):
    """[L, E] running sums (what init_expert_location takes), as .pt and as .json."""
    total = window.sum(0)
    torch.save({"logical_count": total}, tmp_path / "sum.pt")
    (tmp_path / "sum.json").write_text(__import__("json").dumps({"logical_count": total.tolist()}))
    for name in ("sum.pt", "sum.json"):
        counts = eplb.sglang.load_recorder_dump(tmp_path / name)
        assert counts.shape == (1, 3, 32) and torch.equal(counts[0], total)


def detail_dump(path, rank, passes, phy2log, seed):
    """One rank's detail-mode file, as SGLang 0.5.23's _DetailAccumulator.dump writes it."""
    generator = torch.Generator().manual_seed(seed)
    records = [dict(forward_pass_id=p, rank=rank, gatherer_key="primary",
                    global_physical_count=torch.randint(0, 50, phy2log.shape, generator=generator, dtype=torch.int32))
               for p in passes]
    torch.save(dict(records=records, last_physical_to_logical_map=phy2log), path)
    return records


def test_detail_mode_dumps_load(tmp_path):
    phy2log = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]], dtype=torch.int64)
    kept = [detail_dump(tmp_path / f"expert_distribution_recorder_1.0_{rank}.pt", rank, [5, 3], phy2log, rank)
            for rank in range(2)]
    counts = eplb.sglang.load_recorder_dump(tmp_path)
    assert counts.shape == (2, 2, 4)
    for step, pass_id in enumerate([3, 5]):  # passes sorted by id
        physical = sum(r["global_physical_count"].long() for records in kept for r in records
                       if r["forward_pass_id"] == pass_id)
        for layer in range(2):
            for expert in range(4):
                assert counts[step, layer, expert] == physical[layer][phy2log[layer] == expert].sum()
    files = sorted(tmp_path.glob("*.pt"))
    assert torch.equal(eplb.sglang.load_recorder_dump(files), counts)
    assert eplb.sglang.load_recorder_dump(files[0], num_logical_experts=6).shape == (2, 2, 6)


def test_bad_detail_dumps(tmp_path):
    phy2log = torch.tensor([[0, 1, 1, 0]])
    good = dict(forward_pass_id=0, rank=0, gatherer_key="primary", global_physical_count=torch.ones(1, 4))
    cases = [
        (dict(records=[good, good], last_physical_to_logical_map=phy2log), "recorded twice"),
        (dict(records=[dict(good, global_physical_count=torch.ones(1, 3))], last_physical_to_logical_map=phy2log),
         "global_physical_count is"),
        (dict(records=[dict(good, rank="0")], last_physical_to_logical_map=phy2log), "must be integers"),
        (dict(records=[good], last_physical_to_logical_map=torch.ones(1, 4)), "integer tensor"),
        (dict(records=[good], last_physical_to_logical_map=-phy2log - 1), "negative expert"),
        (dict(records=[dict(good, global_physical_count=-torch.ones(1, 4))], last_physical_to_logical_map=phy2log),
         "negative"),
        (dict(records="x", last_physical_to_logical_map=phy2log), "must be a list"),
        (dict(records=[], last_physical_to_logical_map=phy2log), "without records"),
    ]
    for index, (content, message) in enumerate(cases):
        path = tmp_path / f"bad{index}.pt"
        torch.save(content, path)
        with pytest.raises(ValueError, match=message):
            eplb.sglang.load_recorder_dump(path)
    with pytest.raises(eplb.Error, match="beyond 1 experts"):
        torch.save(dict(records=[good], last_physical_to_logical_map=phy2log), tmp_path / "ok.pt")
        eplb.sglang.load_recorder_dump(tmp_path / "ok.pt", num_logical_experts=1)
    with pytest.raises(eplb.Error, match="without recorder dumps"):
        (tmp_path / "empty").mkdir()
        eplb.sglang.load_recorder_dump(tmp_path / "empty")
