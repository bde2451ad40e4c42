"""eplb.vllm.EplbCommunicator driven like vLLM's rebalance_execute, and eplb.nixl in vLLM's order (2 ranks)."""
import pytest

import transfer_cases as cases
from spawned import run_ranks


@pytest.fixture(scope="module")
def communicator(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("communicator"), 2, cases.communicator_harness)


def test_communicator_moves_every_layer_byte_exact(communicator):
    for outcome in communicator:
        assert outcome["wrong"] == []
        assert outcome["reserve"] is False


def test_communicator_failure_is_named_on_every_rank_and_leaves_weights(communicator):
    for outcome in communicator:
        fault = outcome["fault"]
        assert fault["type"] == "MigrationError" and fault["layer"] == 0
        assert fault["message"].startswith("layer 0 aborted after 2 attempt(s): rank ")
        assert "checksum mismatch: expert" in fault["message"]
        assert outcome["weights_untouched"]


def test_nixl_surface_in_vllms_order(tmp_path):
    for outcome in run_ranks(tmp_path, 2, cases.nixl_script):
        assert outcome["state"] == "DONE" and outcome["exact"]
        assert outcome["explain_done"].startswith("READ of 4 descriptor(s) (1024 B) from agent nixl-test-")
        assert "not found" in outcome["outside"] or "registered" in outcome["outside"]
        assert outcome["stall_state"] == "ERR"
        assert outcome["stall_explain"].startswith("timeout: READ of 1 descriptor(s) (256 B) from agent nixl-stall-")
        assert "deadline of 0.3 s" in outcome["stall_explain"]
