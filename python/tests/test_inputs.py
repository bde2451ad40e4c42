"""Every input kind and dtype gives the same result; every bad input raises eplb.Error with a message."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import eplb

COUNTS = (24, 4, 2, 8)  # replicas, groups, nodes, ranks for 16 experts


@pytest.fixture(scope="module")
def integer_load():
    return np.random.default_rng(11).integers(0, 120, size=(3, 16))


@pytest.fixture(scope="module")
def expected(integer_load):
    return eplb.rebalance_experts(integer_load.astype(np.float64), *COUNTS)


NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16,
                np.uint32, np.uint64]
TORCH_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint8]


def assert_same(result, expected):
    for got, want in zip(result, expected):
        assert (np.asarray(got) == want).all()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_dtypes(integer_load, expected, dtype):
    result = eplb.rebalance_experts(integer_load.astype(dtype), *COUNTS)
    assert all(isinstance(r, np.ndarray) and r.dtype == np.int64 for r in result)
    assert_same(result, expected)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtypes(integer_load, expected, dtype):
    # values below 120 are exact in every dtype, bfloat16 and int8 included
    result = eplb.rebalance_experts(torch.tensor(integer_load).to(dtype), *COUNTS)
    assert all(isinstance(r, torch.Tensor) and r.dtype == torch.int64 and r.device.type == "cpu" for r in result)
    assert_same(result, expected)


def test_lists_and_non_contiguous_and_grad(integer_load, expected):
    assert_same(eplb.rebalance_experts(integer_load.tolist(), *COUNTS), expected)
    assert_same(eplb.rebalance_experts(np.asfortranarray(integer_load), *COUNTS), expected)
    transposed = torch.tensor(integer_load.T.copy(), dtype=torch.float32, requires_grad=True).T
    assert not transposed.is_contiguous()
    assert_same(eplb.rebalance_experts(transposed, *COUNTS), expected)


def test_numpy_integer_counts(integer_load, expected):
    assert_same(eplb.rebalance_experts(integer_load, *(np.int64(c) for c in COUNTS)), expected)


def test_float_dtypes_round_like_deepseek():
    """float64 loads are rounded to float32 (DeepSeek converts with weight.float())."""
    load = np.random.default_rng(5).random((2, 16)) * 1000
    as_float64 = eplb.rebalance_experts(load, *COUNTS)
    as_float32 = eplb.rebalance_experts(torch.tensor(load, dtype=torch.float32), *COUNTS)
    assert_same(as_float64, [np.asarray(r) for r in as_float32])


def test_float32_goes_to_the_binding_as_it_is(integer_load, expected):
    """float32 (numpy or torch) is widened once in C++: same results, same checks, windows too."""
    window = np.stack([integer_load, integer_load]).astype(np.float32)
    assert_same(eplb.rebalance_experts(window, *COUNTS, estimator="sum"),
                eplb.rebalance_experts(window.astype(np.float64), *COUNTS, estimator="sum"))
    for bad, shown in ((np.inf, "inf"), (-2.0, "-2"), (np.nan, "nan")):
        load = integer_load.astype(np.float32)
        load[2, 5] = bad
        for value in (load, torch.from_numpy(load)):
            with pytest.raises(eplb.Error, match=f"weight\\[2\\]\\[5\\] = {shown}"):
                eplb.rebalance_experts(value, *COUNTS)


def test_float64_is_read_in_place_with_the_same_results_and_checks(integer_load, expected):
    """C-order float64 [L][E] is read where numpy keeps it (deepseek, no copy): the same result as the
    copying paths (Fortran order, a window), the input untouched, and a bad value anywhere named the same way."""
    load = integer_load.astype(np.float64)
    before = load.copy()
    assert_same(eplb.rebalance_experts(load, *COUNTS), expected)
    assert_same(eplb.rebalance_experts(np.asfortranarray(load), *COUNTS), expected)
    assert_same(eplb.rebalance_experts(load[None], *COUNTS, estimator="sum"), expected)
    assert (load == before).all()
    for bad, shown, at in ((np.nan, "nan", (2, 15)), (-2.0, "-2", (0, 0)), (np.inf, "inf", (1, 7))):
        broken = load.copy()
        broken[at] = bad
        with pytest.raises(eplb.Error, match=f"weight\\[{at[0]}\\]\\[{at[1]}\\] = {shown}"):
            eplb.rebalance_experts(broken, *COUNTS)


def test_every_policy_accepts_every_kind(integer_load):
    for policy in eplb.policies():
        by_numpy = eplb.rebalance_experts(integer_load, *COUNTS, policy=policy)
        by_torch = eplb.rebalance_experts(torch.tensor(integer_load), *COUNTS, policy=policy)
        by_list = eplb.rebalance_experts(integer_load.tolist(), *COUNTS, policy=policy)
        assert_same(by_torch, by_numpy)
        assert_same(by_list, by_numpy)


def test_torch_is_optional():
    """`import eplb` and numpy calls work when torch cannot be imported, and do not import it."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import eplb, numpy as np\n"
            "p, l, c = eplb.rebalance_experts(np.ones((2, 8)), 8, 1, 1, 2)\n"
            "assert p.shape == (2, 8)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_import_does_not_import_torch():
    code = "import sys, eplb; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


GOOD = np.ones((2, 16))

BAD_CALLS = {
    "1-D weight": (lambda: eplb.rebalance_experts(np.ones(16), *COUNTS), "must be \\[layers\\]\\[experts\\]"),
    "4-D weight": (lambda: eplb.rebalance_experts(np.ones((1, 1, 2, 16)), *COUNTS), "got shape \\(1, 1, 2, 16\\)"),
    "empty weight": (lambda: eplb.rebalance_experts(np.ones((2, 0)), *COUNTS), "every dimension"),
    "negative load": (lambda: eplb.rebalance_experts(np.array([[1.0] * 15 + [-1.0]] * 2), *COUNTS),
                      "weight\\[0\\]\\[15\\] = -1: loads must be finite and >= 0"),
    "NaN load": (lambda: eplb.rebalance_experts(np.array([[1.0] * 16, [1.0] * 7 + [np.nan] + [1.0] * 8]), *COUNTS),
                 "weight\\[1\\]\\[7\\] = nan"),
    "inf load in a window": (lambda: eplb.rebalance_experts(np.array([[[1.0] * 16] * 2, [[np.inf] * 16] * 2]),
                                                            *COUNTS), "weight\\[1\\]\\[0\\]\\[0\\] = inf"),
    "negative load in a window": (lambda: eplb.rebalance_experts(np.stack([GOOD * 5, -GOOD]), *COUNTS),
                                  "weight\\[1\\]\\[0\\]\\[0\\] = -1"),
    "bool weight": (lambda: eplb.rebalance_experts(np.ones((2, 16), dtype=bool), *COUNTS), "integers or floats"),
    "complex weight": (lambda: eplb.rebalance_experts(torch.ones(2, 16, dtype=torch.complex64), *COUNTS),
                       "integers or floats"),
    "ragged list": (lambda: eplb.rebalance_experts([[1, 2, 3], [1, 2]], 4, 1, 1, 2), "rectangular"),
    "string weight": (lambda: eplb.rebalance_experts("load", *COUNTS), "not str"),
    "None weight": (lambda: eplb.rebalance_experts(None, *COUNTS), "not NoneType"),
    "replicas not a multiple of ranks": (lambda: eplb.rebalance_experts(GOOD, 20, 4, 2, 8),
                                         "R=20 must be a multiple of ranks P=8"),
    "fewer replicas than experts": (lambda: eplb.rebalance_experts(GOOD, 8, 4, 2, 8), "must be >= experts E=16"),
    "experts not a multiple of groups": (lambda: eplb.rebalance_experts(GOOD, 24, 6, 2, 8),
                                         "E=16 must be a multiple of groups G=6"),
    "ranks not a multiple of nodes": (lambda: eplb.rebalance_experts(GOOD, 24, 4, 4, 6),
                                      "P=6 must be a multiple of nodes N=4"),
    "zero ranks": (lambda: eplb.rebalance_experts(GOOD, 24, 4, 2, 0), "num_gpus must be in \\[1,"),
    "float count": (lambda: eplb.rebalance_experts(GOOD, 24.0, 4, 2, 8), "num_replicas must be an integer"),
    "bool count": (lambda: eplb.rebalance_experts(GOOD, 24, True, 2, 8), "num_groups must be an integer"),
    "unknown policy": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, policy="greedy"), "unknown policy 'greedy'"),
    "bad estimator": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, estimator="ema:-1"), "half-life"),
    "unknown estimator": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, estimator="mean"), "estimator"),
    "negative budget": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, budget=-1), "budget must be finite"),
    "NaN min_gain": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, min_gain=float("nan")), "min_gain"),
    "zero threads": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, threads=0), "threads must be in"),
    "current of another shape": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, policy="relabel",
                                                                current=np.zeros((2, 16), dtype=np.int64)),
                                 "current must be \\[layers\\]\\[num_replicas\\] = \\[2\\]\\[24\\]"),
    "current with an unknown expert": (lambda: eplb.rebalance_experts(
        GOOD, *COUNTS, policy="incremental", current=np.full((2, 24), 16)), "current\\[0\\]\\[0\\] = 16 is out of range"),
    "current missing an expert": (lambda: eplb.rebalance_experts(
        GOOD, *COUNTS, policy="incremental", current=np.zeros((2, 24), dtype=np.int64)), "expert 1 has no replica"),
    "float current": (lambda: eplb.rebalance_experts(GOOD, *COUNTS, current=np.zeros((2, 24))), "must hold integers"),
    "anti-affinity impossible": (lambda: eplb.rebalance_experts(np.ones((1, 2)), 8, 1, 1, 2, policy="balanced",
                                                                anti_affinity=True), "anti-affinity is impossible"),
    "maps: out of range": (lambda: eplb.compute_logical_maps(np.array([[0, 4]]), 4),
                           "phy2log\\[0\\]\\[1\\] = 4 is out of range \\[-1, 4\\)"),
    "maps: below -1": (lambda: eplb.compute_logical_maps(np.array([[0, -2]]), 4), "= -2 is out of range"),
    "maps: float": (lambda: eplb.compute_logical_maps(np.array([[0.0, 1.0]]), 4), "must hold integers"),
    "maps: zero experts": (lambda: eplb.compute_logical_maps(np.array([[0, 1]]), 0), "num_logical_experts"),
    "maps: 3-D": (lambda: eplb.compute_logical_maps(np.zeros((1, 2, 2), dtype=int), 4), "must be \\[layers\\]"),
    "maps: empty": (lambda: eplb.compute_logical_maps([], 4), "empty"),
    "balancedness: layers differ": (lambda: eplb.balancedness(GOOD, np.zeros((3, 16), dtype=int), 8), "2 layers"),
    "balancedness: expert missing": (lambda: eplb.balancedness(GOOD, np.zeros((2, 16), dtype=int), 8),
                                     "expert 1 has no replica"),
    "balancedness: ranks do not divide": (lambda: eplb.balancedness(GOOD, np.tile(np.arange(16), (2, 1)), 3),
                                          "multiple of ranks"),
    "plan: shapes differ": (lambda: eplb.plan_migration(np.zeros((1, 4), dtype=int), np.zeros((1, 8), dtype=int),
                                                        2, 1, 10), "one shape"),
    "plan: zero bytes": (lambda: eplb.plan_migration([[0, 1]], [[1, 0]], 2, 1, 0), "bytes_per_expert"),
    "plan: nodes do not divide ranks": (lambda: eplb.plan_migration([[0, 1, 2]], [[2, 1, 0]], 3, 2, 8),
                                        "multiple of nodes"),
    "preserve: shapes differ": (lambda: eplb.vllm.preserve_intragpu_slots(np.zeros((1, 4), dtype=int), 2,
                                                                          np.zeros((1, 6), dtype=int)), "old_phy2log is"),
    "preserve: ranks do not divide": (lambda: eplb.vllm.preserve_intragpu_slots(np.zeros((1, 4), dtype=int), 3,
                                                                                np.zeros((1, 4), dtype=int)), "divide"),
    "read a missing file": (lambda: eplb.read_load("build-python/no-such-load.npy"), "no-such-load.npy"),
    "read a non-path": (lambda: eplb.read_placement(42), "path"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_eplb_error(case):
    call, message = BAD_CALLS[case]
    with pytest.raises(eplb.Error, match=message) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    assert str(raised.value) and raised.value.code


def test_file_errors_carry_their_code(repo):
    with pytest.raises(eplb.Error) as raised:
        eplb.read_load(repo / "build-python" / "no-such-load.npy")
    assert raised.value.code == "I/O error"
