"""eplb.Migrator.start (the async round) over torch.distributed gloo, 2 and 3 spawned ranks.

Every layer commits at the same serving step on every rank; every slot is checked byte for byte
after every step against the mapping in force; abort leaves committed layers new and the rest old;
an injected failure surfaces from commit_ready() as the sync path's eplb.MigrationError.
"""
import pytest

import async_cases as cases
from spawned import run_ranks


@pytest.fixture(scope="module", params=[2, 3], ids=["two_ranks", "three_ranks"])
def ranks(request, tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp(f"async{request.param}"), request.param, cases.suite)


@pytest.mark.parametrize("allocate", ["plain", "empty", "plain swap", "empty swap"])
def test_every_layer_commits_at_the_same_step_on_every_rank(ranks, allocate):
    outcomes = [result[allocate] for result in ranks]
    for outcome in outcomes:
        assert outcome["error"] is None, outcome
        assert outcome["wrong"] == [] and outcome["final_wrong"] == [] and outcome["back_wrong"] == []
        assert sorted(outcome["commits"]) == [str(layer) for layer in range(cases.LAYERS)]
        assert outcome["layers_committed"] == cases.LAYERS and outcome["moved"] > 0
        assert not outcome["aborted"]
    assert len({tuple(sorted(outcome["commits"].items())) for outcome in outcomes}) == 1, \
        [outcome["commits"] for outcome in outcomes]
    steps = sorted(outcomes[0]["commits"].values())
    assert len(set(steps)) == cases.LAYERS  # one layer per step at most


def test_abort_keeps_committed_layers_new_and_the_rest_old(ranks):
    outcomes = [result["aborted"] for result in ranks]
    for outcome in outcomes:
        assert outcome["error"] is None and outcome["aborted"], outcome
        assert outcome["wrong"] == []
        assert 1 <= len(outcome["committed"]) < cases.LAYERS
        assert outcome["report_committed"] == len(outcome["committed"])
    assert len({tuple(outcome["committed"]) for outcome in outcomes}) == 1
    assert len({tuple(sorted(outcome["commits"].items())) for outcome in outcomes}) == 1


def test_an_abort_by_one_rank_is_a_named_error_on_the_others(ranks):
    outcomes = [result["aborted_by_zero"] for result in ranks]
    assert outcomes[0]["error"] is None and outcomes[0]["aborted"]
    for outcome in outcomes[1:]:
        assert outcome["error"]["type"] == "MigrationError" and outcome["error"]["code"] == "aborted"
        assert "rank 0 asked to abort" in outcome["error"]["message"]
    for outcome in outcomes:
        assert outcome["wrong"] == []
    assert len({tuple(outcome["committed"]) for outcome in outcomes}) == 1


def test_a_failed_round_raises_the_sync_paths_error_and_keeps_every_layer_old(ranks):
    outcomes = [result["failed"] for result in ranks]
    for outcome in outcomes:
        error = outcome["error"]
        assert error is not None and error["type"] == "MigrationError" and error["code"] == "aborted", outcome
        assert error["message"].startswith("layer 0 aborted after 2 attempt(s)")
        assert error["committed"] == [] and outcome["committed"] == []
        assert outcome["wrong"] == [] and outcome["poll"] == "MigrationError"
    assert len({outcome["error"]["message"] for outcome in outcomes}) == 1


def test_misuse_is_refused_with_eplb_error(ranks):
    for result in ranks:
        outcome = result["misuse"]
        refused = outcome["refused"]
        assert "lead_steps must be an int in [1, 1000]" in refused["lead_steps"]
        assert "max_layers must be an int >= 1" in refused["max_layers"]
        assert "still running" in refused["second round"] and "still running" in refused["early report"]
        assert outcome["error"] is None and outcome["wrong"] == []
