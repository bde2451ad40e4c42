"""DeepSeek's published worked example, exactly, through every input kind; windows, estimators, estimate_load."""
import re

import numpy as np
import pytest
import torch

import eplb


def example_counts(example):
    return example["num_replicas"], example["num_groups"], example["num_nodes"], example["num_ranks"]


@pytest.mark.parametrize("kind", ["list", "numpy", "torch"])
def test_published_example_exactly(deepseek_example, kind):
    load = deepseek_example["load"]
    weight = {"list": load, "numpy": np.array(load), "torch": torch.tensor(load)}[kind]
    phy2log, log2phy, logcnt = eplb.rebalance_experts(weight, *example_counts(deepseek_example))
    for name, got in (("phy2log", phy2log), ("log2phy", log2phy), ("logcnt", logcnt)):
        expected = np.array(deepseek_example[name])
        assert tuple(got.shape) == expected.shape, name
        assert (np.asarray(got) == expected).all(), name
        if kind == "torch":
            assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.device.type == "cpu"
        else:
            assert isinstance(got, np.ndarray) and got.dtype == np.int64


def test_published_example_as_a_one_step_window(deepseek_example):
    window = np.array(deepseek_example["load"])[np.newaxis]
    phy2log, _, _ = eplb.rebalance_experts(window, *example_counts(deepseek_example))
    assert (phy2log == np.array(deepseek_example["phy2log"])).all()


def test_window_is_summed_by_default(deepseek_example):
    load = np.array(deepseek_example["load"], dtype=np.float64)
    window = np.stack([load * 0.25, load * 0.75])
    assert (eplb.rebalance_experts(window, *example_counts(deepseek_example))[0]
            == np.array(deepseek_example["phy2log"])).all()


def test_estimators_change_what_is_planned_for():
    rng = np.random.default_rng(3)
    window = rng.integers(0, 100, size=(12, 2, 16)).astype(np.float64)
    window[:3, :, 0] += 5000   # expert 0 was hot long ago,
    window[-3:, :, 8] += 5000  # expert 8 is hot now: the same sum, but ema weighs it more
    counts = (24, 1, 1, 8)
    by_sum = eplb.rebalance_experts(window, *counts, estimator="sum")[2]
    by_ema = eplb.rebalance_experts(window, *counts, estimator="ema:1")[2]
    assert abs(int(by_sum[0, 0]) - int(by_sum[0, 8])) <= 1
    assert by_ema[0, 8] > by_ema[0, 0] + 1
    summed = eplb.rebalance_experts(window.sum(axis=0), *counts)
    for got, expected in zip(eplb.rebalance_experts(window, *counts), summed):
        assert (got == expected).all()
    robust = eplb.rebalance_experts(window, *counts, estimator="robust:1.5")[0]
    assert robust.shape == (2, 24)


def test_auto_estimator_follows_drift_and_keeps_the_sum_without_it():
    rng = np.random.default_rng(4)
    steady = np.repeat(rng.poisson(100, size=(1, 2, 16)).astype(np.float64), 16, axis=0)
    steady[:, :, 3] += 400  # the same load at every step, one expert hot throughout: no drift
    counts = (24, 1, 1, 8)
    for got, expected in zip(eplb.rebalance_experts(steady, *counts, estimator="auto"),
                             eplb.rebalance_experts(steady, *counts, estimator="sum")):
        assert (got == expected).all()
    rising = steady.copy()
    rising[:, :, 8] += np.linspace(0, 3000, 16)[:, None]  # expert 8 heats up step by step
    by_auto = eplb.rebalance_experts(rising, *counts, estimator="auto")
    by_sum = eplb.rebalance_experts(rising, *counts, estimator="sum")
    assert by_auto[2][0, 8] > by_sum[2][0, 8]  # planned for what expert 8 carries now
    for got, expected in zip(by_auto, eplb.rebalance_experts(rising, *counts, estimator="ema:1")):
        assert (got == expected).all()


def test_estimate_load_is_the_load_the_policy_plans_from():
    """eplb.estimate_load: the estimator alone, with the estimator it applied (auto resolved)."""
    rng = np.random.default_rng(5)
    rising = rng.poisson(100, size=(16, 2, 16)).astype(np.float64)
    rising[:, :, 8] += np.linspace(0, 3000, 16)[:, None]
    load, applied = eplb.estimate_load(rising)  # auto by default
    assert applied == "ema:1" and load.dtype == np.float64 and load.shape == (2, 16)
    ema1 = np.array([2.0 ** (step - 15) for step in range(16)])  # newest step weight 1, halving per step
    np.testing.assert_allclose(load, np.einsum("s,sle->le", ema1, rising) * 16 / ema1.sum(), rtol=1e-12)
    counts = (24, 1, 1, 8)
    for got, expected in zip(eplb.rebalance_experts(load, *counts), eplb.rebalance_experts(rising, *counts,
                                                                                              estimator="auto")):
        assert (got == expected).all()
    summed, applied = eplb.estimate_load(torch.tensor(rising, dtype=torch.int64), "sum")
    assert applied == "sum" and isinstance(summed, torch.Tensor) and summed.dtype == torch.float64
    assert torch.equal(summed, torch.tensor(rising.sum(axis=0)))
    steady = np.repeat(rising[:1], 16, axis=0)
    assert eplb.estimate_load(steady)[1] == "sum"  # no drift: auto keeps the sum
    assert eplb.estimate_load(rising[0])[1] == "sum"  # one step [layers, experts]


@pytest.mark.parametrize("window, estimator, message", [
    (np.ones((4, 2, 3)), "bogus", "unknown estimator 'bogus'"),
    (np.ones((4, 2, 3)), None, "estimator must be"),
    (-np.ones((4, 2, 3)), "auto", "window[0][0][0] = -1"),
    (np.ones((2, 2, 2, 2)), "sum", "window"),
])
def test_estimate_load_refuses_bad_input_by_name(window, estimator, message):
    with pytest.raises(eplb.Error, match=re.escape(message)):
        eplb.estimate_load(window, estimator)
