"""Issue 29 items 1, 2, 3, 16 and 17 on 2 spawned gloo ranks: after every case, every layer is wholly
old or wholly new on every rank, and the ranks agree on which; every failure is a typed eplb error
that names what happened.
"""
import pytest

import consistency_cases as cases
from spawned import run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("consistency"), 2, cases.suite, timeout=240)


@pytest.fixture(scope="module")
def stalled(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("stall"), 2, cases.stalled_serving_loop, timeout=120)


@pytest.mark.parametrize("mode", ["stale sync", "stale async swap"])
def test_ranks_that_disagree_about_the_old_placement_stop_before_anything_moves(ranks, mode):
    for rank, result in enumerate(ranks):
        outcome = result[mode]
        error = outcome["error"]
        assert error is not None, f"rank {rank} migrated with a stale placement: {outcome}"
        assert error["type"] == "MigrationError" and error["code"] == "mismatch", error
        assert "the ranks disagree about the old placement" in error["message"], error
        assert "layer 0 slot 0" in error["message"] and "rank 1 has expert" in error["message"], error
        assert error["committed"] == []
        assert outcome["wrong"] == [], f"rank {rank}: bytes moved: {outcome['wrong']}"
        assert outcome["seconds"] < 10


def test_a_serving_loop_stalled_past_the_deadline_still_commits_what_the_vote_agreed(stalled):
    outcomes = stalled
    for outcome in outcomes:
        assert outcome["wrong"] == [], outcome
        assert outcome["error"] is not None and outcome["error"]["type"] == "TimeoutError", outcome
        assert len(outcome["committed"]) >= 1
    assert outcomes[0]["committed"] == outcomes[1]["committed"], outcomes
    assert "serving thread" in outcomes[1]["error"]["message"], outcomes[1]["error"]


def test_an_on_layer_callback_that_raises_stops_every_rank_at_the_next_vote(ranks):
    outcomes = [result["callback middle"] for result in ranks]
    for rank, outcome in enumerate(outcomes):
        error = outcome["error"]
        assert error is not None and error["type"] == "MigrationError", outcome
        assert "rank 1's on_layer callback raised RuntimeError: engine bookkeeping failed at layer 0" \
            in error["message"], error
        assert error["committed"] == [0], error
        assert outcome["wrong"] == []
        assert outcome["seconds"] < 10, "the peer must be told, not left to time out"
    assert outcomes[1]["error"]["cause"] == "RuntimeError: engine bookkeeping failed at layer 0"


def test_an_on_layer_callback_that_raises_after_the_last_layer_is_told_through_the_agreement(ranks):
    outcomes = [result["callback last"] for result in ranks]
    failing, peer = outcomes[1]["error"], outcomes[0]["error"]
    assert failing is not None and failing["committed"] == list(range(cases.LAYERS)), failing
    assert failing["cause"] == f"RuntimeError: engine bookkeeping failed at layer {cases.LAYERS - 1}"
    assert peer is not None and peer["code"] == "mismatch", outcomes[0]
    assert "rank 1" in peer["message"] and "on_layer callback raised" in peer["message"], peer
    for outcome in outcomes:
        assert outcome["wrong"] == [] and outcome["seconds"] < 10, outcome


def test_weights_rewritten_is_refused_during_an_async_round_and_works_after(ranks):
    for result in ranks:
        outcome = result["rewritten"]
        refused = outcome["refused"]
        assert refused is not None and refused["type"] == "Error" and refused["code"] == "not allowed", refused
        assert "async round is running" in refused["message"]
        assert outcome["wrong"] == []


def test_an_async_round_is_counted_when_it_ends_without_report(ranks):
    for result in ranks:
        assert result["metrics"]["rebalances"] == 1.0, result["metrics"]


def test_spare_buffers_beyond_the_machine_are_refused_on_every_rank(ranks):
    for result in ranks:
        outcome = result["spares"]
        assert outcome.get("type") == "LayoutError", outcome
        assert "memory admission" in outcome["message"] and "spare buffers" in outcome["message"], outcome
