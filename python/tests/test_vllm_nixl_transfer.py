"""eplb.nixl in the order vLLM's NIXL communicator calls NIXL (2 ranks)."""
import transfer_cases as cases
from spawned import run_ranks


def test_nixl_surface_in_vllms_order(tmp_path):
    for outcome in run_ranks(tmp_path, 2, cases.nixl_script):
        assert outcome["state"] == "DONE" and outcome["exact"]
        assert outcome["explain_done"].startswith("READ of 4 descriptor(s) (1024 B) from agent nixl-test-")
        assert "not found" in outcome["outside"] or "registered" in outcome["outside"]
        assert outcome["stall_state"] == "ERR"
        assert outcome["stall_explain"].startswith("timeout: READ of 1 descriptor(s) (256 B) from agent nixl-stall-")
        assert "deadline of 0.3 s" in outcome["stall_explain"]
