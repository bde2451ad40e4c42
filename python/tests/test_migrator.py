"""eplb.Migrator over torch.distributed (gloo on 127.0.0.1), 2, 3 and 4 spawned ranks.

The six shapes of the issue over plain and eplb.empty tensors (byte-exact afterwards), no change,
a layout mismatch refused on every rank, injected faults (retried or aborted consistently: every
layer wholly old or wholly new), and a rank killed mid-migration (PeerLostError naming it within
the deadline). One spawned group runs many cases: spawning torch processes is the slow part.
"""
import pytest

import migration_cases as cases
from spawned import run_ranks


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    names = [name for name, *_ in cases.FAULTS]
    return run_ranks(tmp_path_factory.mktemp("two"), 2, cases.suite, names)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("four"), 4, cases.suite, ["err aborted"])


def check_shapes(ranks, world):
    expected = [shape for shape in cases.SHAPES if shape[0] == world]
    for rank, result in enumerate(ranks):
        done = result["shapes"]
        assert [(tuple(item["shape"]), item["allocate"]) for item in done] == \
            [(shape, allocate) for shape in expected for allocate in ("plain", "empty")]
        for item in done:
            assert item["wrong"] == [], f"rank {rank} {item}"
            assert item["verified"] is True
            assert item["moved"] > 0 and item["committed"] == item["shape"][1]
            path = "agent memory (zero-copy)" if item["allocate"] == "empty" else "heap memory (registered in place)"
            assert item["paths"] == [path]


def test_two_ranks_every_shape_is_byte_exact(two_ranks):
    check_shapes(two_ranks, 2)


def test_four_ranks_every_shape_is_byte_exact(four_ranks):
    check_shapes(four_ranks, 4)


def test_transfer_schedule_moves_every_row_and_the_torch_plane_or_mixed_schedules_are_refused(four_ranks):
    for rank, result in enumerate(four_ranks):
        case = result["scheduled"]
        for name in ("off", "ranks", "hosts", "hosts-fenced"):
            assert case[name]["wrong"] == [], f"rank {rank} {name}: {case[name]}"
            assert case[name]["schedule"] == name  # as the native Migrator reports its options
            assert case[name]["inter_node"] > 0  # reads crossed the emulated hosts
        assert "transfer schedule" in case["torch"] and "one-sided" in case["torch"], case["torch"]
        assert "rank 1 orders its READs with transfer schedule 'hosts-fenced', rank 0 with 'hosts'" in case["mixed"]


def test_allgather_carries_every_length_exactly(two_ranks, four_ranks):
    # Lengths below, at and above the 4 KiB inline record, mixed across ranks in each call.
    for ranks in (two_ranks, four_ranks):
        assert [result["allgather"] for result in ranks] == [[]] * len(ranks)


@pytest.mark.parametrize("ranks", ["two_ranks", "four_ranks"])
def test_swap_commit_moves_the_engines_own_tensor_objects_to_the_new_rows(request, ranks):
    results = request.getfixturevalue(ranks)
    for rank, result in enumerate(results):
        swap = result["swap"]
        for allocate in ("plain", "empty", "parameter"):
            case = swap[allocate]
            for number, item in enumerate(case["rounds"]):
                assert item["wrong"] == [], f"rank {rank} {allocate} round {number}: {item['wrong'][:3]}"
                assert item["commit"] == "swap" and item["verified"] is True and item["moved"] > 0
            assert case["same_objects"], f"rank {rank} {allocate}: the engine's tensor objects were replaced"
            assert max(item["moved_pointers"] for item in case["rounds"]) > 0  # some tensor now on its spare
            assert case["spare_bytes"] == case["bytes"]
            assert case["parameters"] == (allocate == "parameter")
        fault = swap["fault"]
        assert fault["error"] is not None and fault["error"].startswith("layer 0 aborted"), fault
        assert fault["committed"] == [] and fault["wrong"] == []  # every layer still wholly old
        assert "view of part of a larger tensor" in swap["view"] and "commit='copy'" in swap["view"]
        callback = swap["callback"]
        assert "engine callback failed at layer 0" in callback["error"] and callback["wrong"] == [], callback
        assert callback["committed"] == [0] and callback["cause"].startswith("KeyError("), callback


def test_no_change_moves_nothing(two_ranks):
    for result in two_ranks:
        assert result["no_change"] == {"moved": 0, "changed": [False, False], "wrong": []}


def test_reused_checksums_skip_rehashing_and_a_rewrite_must_be_announced(two_ranks):
    for rank, result in enumerate(two_ranks):
        case = result["reused_checksums"]
        assert case["first"] == [] and case["second"] == [], f"rank {rank} {case}"
        # The stale checksums were used (a fresh hash would have passed), and the failure says why.
        assert "checksum mismatch" in case["stale"] and "weights_rewritten()" in case["stale"], case["stale"]
        assert 0 not in case["stale_committed"]
        assert case["after_stale"] == []  # layer 0 wholly old (its rewritten bytes), layer 1 old or new
        assert case["announced"] == []
        assert "layer 2 is outside [0, 2)" in case["bad_layer"]
        assert case["default"] == []


def test_collectives_check_in_under_a_store_the_caller_gives(two_ranks):
    for rank, result in enumerate(two_ranks):
        case = result["explicit_store"]
        assert case["wrong"] == [] and case["verified"] is True, f"rank {rank} {case}"
        assert case["keys"] > 2, f"rank {rank}: eplb's check-in keys are not in the given store: {case}"
        assert "store must be a torch.distributed.Store, got str" in case["refused"]


def test_layout_mismatch_is_refused_on_every_rank(two_ranks):
    for result in two_ranks:
        layout = result["layout"]
        assert layout["untouched"]
        assert layout["raised"].startswith("nbytes_per_expert mismatch: rank 1 has layer 1 tensor 'tensor 1' of 42 B")
        assert "rank 0 has 48 B" in layout["raised"] and "bfloat16 [3, 7]" in layout["raised"]
        assert "rank 0 failed to set up" in layout["strided"] and "not contiguous" in layout["strided"]


@pytest.mark.parametrize("name", ["err retried", "corrupt retried", "stall retried"])
def test_faults_are_retried_to_a_verified_round(two_ranks, name):
    outcomes = [result["faults"][name] for result in two_ranks]
    for outcome in outcomes:
        assert outcome["error"] is None, outcome
        assert outcome["wrong"] == []
    assert max(outcome["retries"] for outcome in outcomes) > 0  # the faults did fire


@pytest.mark.parametrize("ranks", ["two_ranks", "four_ranks"])
def test_unrecoverable_faults_abort_consistently(request, ranks):
    outcomes = [result["faults"]["err aborted"] for result in request.getfixturevalue(ranks)]
    for outcome in outcomes:
        assert outcome["type"] == "MigrationError" and outcome["error"].startswith("layer 0 aborted after 2 attempt")
        assert outcome["committed"] == [] and outcome["layer"] == 0
        assert outcome["wrong"] == []  # every layer still wholly old
    assert len({outcome["error"] for outcome in outcomes}) == 1  # the same explanation everywhere


def check_victim_named(results, victim):
    assert results[victim] != 0 and not isinstance(results[victim], dict)  # it died (no result)
    for rank in sorted({0, 1, 2} - {victim}):
        outcome = results[rank]
        assert outcome["type"] == "PeerLostError", outcome
        assert outcome["peer"] == victim and f"rank {victim} lost" in outcome["error"], outcome["error"]
        assert outcome["seconds"] < outcome["timeout"]
        assert outcome["committed"] == [0] and outcome["layer"] == 1


def test_killed_rank_is_named_by_the_others_within_the_deadline(tmp_path):
    check_victim_named(run_ranks(tmp_path, 3, cases.killed_rank, 1), 1)


def test_a_rank_lost_in_a_collective_is_named_by_all_and_not_only_by_rank_zero(tmp_path):
    """Rank 0's gather meets the lost rank; the others wait for its broadcast and learn it from the store."""
    results = run_ranks(tmp_path, 4, cases.lost_in_a_collective, 2)
    assert results[2] != 0 and not isinstance(results[2], dict)  # it died (no result)
    for rank in (0, 1, 3):
        outcome = results[rank]
        assert outcome["code"] == "remote disconnect" and "rank 2 lost" in outcome["error"], outcome
        assert outcome["seconds"] < 10.0, outcome  # the deadline is 20 s
        assert outcome["error"].startswith(f"allgather #1 of the torch.distributed group (rank {rank} of 4)")
        if rank != 0:
            assert outcome["error"].endswith("(found by rank 0)"), outcome


def test_killed_rank_zero_is_named_when_the_store_lives_outside_the_ranks(tmp_path):
    """The default group's store dies with rank 0; a store the caller serves elsewhere does not."""
    from datetime import timedelta

    import torch.distributed as dist
    from spawned import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    check_victim_named(run_ranks(tmp_path, 3, cases.killed_rank, 0, port), 0)
    del store
