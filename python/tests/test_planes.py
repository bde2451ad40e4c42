"""Issue 30 on a CPU: the one C++ protocol over every data plane that runs here (ucx, torch on a gloo
data group, staged through its device-copy hook, nixl on DRAM), vLLM's 6 shapes on 2 and 4 ranks,
experts of mixed dtypes (FP8 included), sync and async; the torch plane's faults leave every layer
wholly old or wholly new on every rank.
"""
import pytest

import planes_cases as cases
from spawned import run_ranks

PLANES = ["ucx", "torch", "staged", "nixl"]


@pytest.fixture(scope="module", params=PLANES)
def two_ranks(request, tmp_path_factory):
    if request.param == "nixl":
        pytest.importorskip("nixl._api", reason="the nixl package is pinned in requirements.lock")
    return request.param, run_ranks(tmp_path_factory.mktemp(f"two-{request.param}"), 2, cases.shapes_on_plane,
                                    request.param, timeout=240)


@pytest.fixture(scope="module", params=["torch", "staged"])
def four_ranks(request, tmp_path_factory):
    return request.param, run_ranks(tmp_path_factory.mktemp(f"four-{request.param}"), 4, cases.shapes_on_plane,
                                    request.param, timeout=240)


def check_shapes(plane, ranks, world):
    for rank, result in enumerate(ranks):
        sync = result["sync"]
        assert len(sync) == 2 * sum(1 for shape in cases.SHAPES if shape[0] == world)
        for item in sync:
            assert item["wrong"] == [], (plane, rank, item)
            assert item["verified"] is True, (plane, rank, item)
            assert item["planes"] == [plane], (plane, rank, item)
        assert any(item["moved"] > 0 for item in sync), "no shape moved anything: the test would show nothing"
        assert result["async"]["wrong"] == [] and result["async"]["final"] == [], (plane, rank, result["async"])
        assert result["async"]["plane"] == plane and result["async"]["committed"] == 6
        if plane == "staged":
            assert result["staged_copies"] > 0, "the staged plane's device copies never ran through the hook"


def test_two_ranks_every_plane_moves_mixed_dtype_experts_byte_exact(two_ranks):
    plane, ranks = two_ranks
    check_shapes(plane, ranks, 2)


def test_four_ranks_on_the_torch_planes(four_ranks):
    plane, ranks = four_ranks
    check_shapes(plane, ranks, 4)


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("torch-faults"), 2, cases.torch_plane_faults, timeout=180)


def test_a_corrupted_row_is_caught_by_the_digest_and_retried(faults):
    for rank, result in enumerate(faults):
        outcome = result["corrupt retried"]
        assert outcome["error"] is None, (rank, outcome)
        assert outcome["wrong"] == []
    assert sum(result["corrupt retried"]["retries"] for result in faults) > 0, "no corruption was injected"


def test_corruption_on_every_attempt_aborts_the_same_way_on_every_rank(faults):
    outcomes = [result["corrupt aborted"] for result in faults]
    for outcome in outcomes:
        assert outcome["type"] == "MigrationError", outcome
        assert "digest" in outcome["error"] or "checksum" in outcome["error"], outcome
        assert outcome["wrong"] == [], outcome
    assert outcomes[0]["committed"] == outcomes[1]["committed"]


def test_a_stalled_peer_times_out_on_every_rank_and_the_migrator_refuses_the_broken_group(faults):
    outcomes = [result["stall"] for result in faults]
    for rank, outcome in enumerate(outcomes):
        assert outcome["type"] == "TimeoutError", (rank, outcome)
        assert outcome["wrong"] == [], outcome
        assert outcome["seconds"] < 4 * outcome["timeout"] + 10, outcome
        assert outcome["refused"] and "set_data_group" in outcome["refused"], outcome
    assert outcomes[0]["committed"] == outcomes[1]["committed"]
    assert any("layer" in outcome["error"] and "gloo" in outcome["error"] for outcome in outcomes), outcomes


def test_after_a_timeout_a_new_data_group_recovers_the_migrator(faults):
    # set_data_group(new gloo group) on every rank, then the round the timeout aborted runs again.
    for rank, result in enumerate(faults):
        outcome = result["recovered"]
        assert outcome["set_up_error"] is None, (rank, outcome)
        assert outcome["error"] is None, (rank, outcome)
        assert outcome["wrong"] == [] and outcome["wrong_after"] == [], (rank, outcome)
        assert outcome["plane"] == "torch" and outcome["moved"] > 0, outcome


def test_a_killed_rank_on_the_torch_plane_is_named_by_the_survivors(tmp_path):
    results = run_ranks(tmp_path, 3, cases.killed_on_torch_plane, 1, timeout=120)
    assert isinstance(results[1], int), "the victim returned: it was not killed"
    for rank in (0, 2):
        outcome = results[rank]
        assert outcome["type"] == "PeerLostError", outcome
        assert outcome["peer"] == 1 or "rank 1" in outcome["error"], outcome
        assert outcome["wrong"] == [], outcome
        assert outcome["seconds"] < 4 * outcome["timeout"] + 10, outcome
    assert results[0]["committed"] == results[2]["committed"]
