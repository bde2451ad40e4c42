"""eplb.vllm.EplbCommunicator inside the real vLLM (vllm 0.33.0, torch 2.14.0, CPU, gloo).

- vLLM's own rebalance_execute drives it on 2 and 4 spawned ranks, byte-exact, over the 6 shapes of vLLM's
  tests/distributed/test_eplb_execute.py: rearrange_expert_weights_inplace (which has no batching option in
  0.33.0), transfer_layer + move_from_buffer with enable_migration_batching off and on, no change, the
  profile run, elastic scale-down and scale-up through rank_mapping (4 ranks: 2 ranks cannot hold the
  shapes' experts on one), a corrupted row and a killed rank, each a named eplb error inside vLLM's call.
- It is a subclass of vLLM's abstract EplbCommunicator with vLLM's parameter names, and vLLM's own
  EplbState gets it from vLLM's factory once installed (EPLB_VLLM_COMMUNICATOR, read by eplb's plugin);
  it is still importable without vllm.
- Issue 29 item 4: an add_send of an expert the rank does not hold raises eplb.Error on every rank, naming
  the rank and the expert, and the next execute() works.
"""
import subprocess
import sys

import pytest

import vllm_cases as cases
from spawned import run_ranks


def spawn_with_vllm(path, world, target, *args, timeout):
    """run_ranks in the environment the ranks need: vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu), its IPC
    sockets under `path` (not /tmp), and eplb's vLLM plugin selecting its default policy (deepseek) and its
    communicator for vLLM's torch_gloo backend when vLLM loads plugins."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_TARGET_DEVICE", "cpu")
        patch.setenv("VLLM_RPC_BASE_PATH", str(path))
        patch.delenv("VLLM_PLUGINS", raising=False)
        patch.delenv("EPLB_VLLM_POLICY", raising=False)
        patch.setenv("EPLB_VLLM_COMMUNICATOR", "torch_gloo")
        return run_ranks(path, world, target, *args, timeout=timeout)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return spawn_with_vllm(tmp_path_factory.mktemp("vllm2"), 2, cases.two_ranks, timeout=240)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return spawn_with_vllm(tmp_path_factory.mktemp("vllm4"), 4, cases.four_ranks, timeout=300)


def ok(result: dict):
    assert "error" not in result, result["error"]
    return result["ok"]


def paths_of(outcomes, world):
    return [(rank, shape, ok(result)) for rank, outcome in enumerate(outcomes)
            for shape, result in outcome["paths"].items()]


@pytest.mark.parametrize("world", [2, 4])
def test_vllms_rebalance_execute_moves_every_shape_byte_exact(request, world):
    outcomes = request.getfixturevalue({2: "two", 4: "four"}[world])
    shapes = {shape for _, shape, _ in paths_of(outcomes, world)}
    assert shapes == {str(shape) for shape in cases.SHAPES if shape[0] == world}
    for rank, shape, paths in paths_of(outcomes, world):
        where = f"rank {rank}, shape {shape}"
        for path in ("rearrange_expert_weights_inplace", "transfer_layer batching=False",
                     "transfer_layer batching=True"):
            assert paths[path] == [], f"{where}, {path}: wrong rows {paths[path]}"
        assert paths["no change leaves the weights"], where
        assert paths["is_profile moves nothing"], where


def test_elastic_scale_down_and_up_through_rank_mapping(four):
    for rank, outcome in enumerate(four):
        assert set(outcome["elastic"]) == {str(shape) for shape in cases.SHAPES if shape[0] == 4}
        for shape, result in outcome["elastic"].items():
            moved = ok(result)
            assert moved["scale-down"] == [], f"rank {rank}, shape {shape}: {moved['scale-down']}"
            assert moved["scale-up"] == [], f"rank {rank}, shape {shape}: {moved['scale-up']}"


@pytest.mark.parametrize("world", [2, 4])
def test_a_corrupted_row_raises_a_named_error_inside_vllms_call(request, world):
    outcomes = [ok(outcome["corrupt"]) for outcome in request.getfixturevalue({2: "two", 4: "four"}[world])]
    for outcome in outcomes:
        assert outcome["type"] == "MigrationError" and outcome["is_eplb_error"], outcome
        assert outcome["layer"] == 0 and "expert" in outcome["message"] and "rank" in outcome["message"], outcome
        assert outcome["seconds"] < outcome["bound"], outcome
        assert outcome["untouched"], "vLLM's move_from_buffer must not have run"


def test_a_corruption_the_protocol_retries_shows_its_retries_and_votes_in_the_report(two):
    """The communicator runs the C++ protocol: an injected corruption is caught by its digests and retried
    after its vote, visible in last_report; vLLM's call ends byte-exact on both ranks."""
    outcomes = [ok(outcome["corrupt retried"]) for outcome in two]
    for outcome in outcomes:
        assert outcome["wrong"] == [], outcome
        assert outcome["vote_seconds"] > 0, outcome
    assert sum(outcome["retries"] for outcome in outcomes) > 0, outcomes
    assert len({outcome["retries"] for outcome in outcomes}) == 1, "the ranks retried different layers"


def test_a_killed_rank_is_named_inside_vllms_call_within_the_timeout(tmp_path):
    results = spawn_with_vllm(tmp_path, 2, cases.killed_rank, (2, 4, 8, 16), 1, timeout=180)
    assert results[1] != 0 and not isinstance(results[1], dict)  # the victim died
    outcome = results[0]
    assert outcome["type"] in ("PeerLostError", "TimeoutError"), outcome
    assert outcome["peer"] == 1 and "rank 1" in outcome["message"] and outcome["layer"] == 1, outcome
    assert outcome["seconds"] < outcome["timeout"], outcome
    assert outcome["layer0_new"] and outcome["later_layers_old"], outcome


def test_vllms_eplb_state_gets_eplbs_policy_and_communicator(two):
    for rank, outcome in enumerate(two):
        state = ok(outcome["state"])
        assert state["registry_default"] == "eplb.vllm.EplbPolicy", state
        assert state["state_policy_is_eplb"] and state["state_policy_name"] == "deepseek", state
        assert state["communicator_type"] == "eplb.vllm.EplbCommunicator", state
        assert state["communicator_is_eplb"] and state["communicator_is_vllm_class"], state
        assert state["changed_slots"] > 0 and state["wrong"] == [], f"rank {rank}: {state}"
        assert state["committed"] and state["equals_vllm_default"], state


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_vllms_own_rearrange_plans_from_eplbs_estimate_over_its_window(two, mode):
    """eplb.vllm.install_window inside vLLM's sync EplbState.rearrange: the policy receives eplb.estimate_load of
    the all-reduced window cut into chunks in time order (a drifting expert: auto picks an ema), and the weights
    move byte-exact; after uninstall_window, vLLM's own window sum reaches the policy again; an estimator that
    raises reaches rearrange's caller and leaves nothing shadowed. Async (vLLM's
    default): the estimate reaches the async worker's policy call; sync: the policy call inside rearrange."""
    outcomes = [ok(outcome[f"window {mode}"]) for outcome in two]
    for rank, outcome in enumerate(outcomes):
        assert outcome["calls"] == 2, (rank, outcome)
        assert outcome["applied"] == "ema:1" and outcome["estimate_is_not_the_sum"], (rank, outcome)
        assert outcome["estimate_received"] and outcome["vllm_sum_received"], (rank, outcome)
        # vLLM's own dtype (int64), so elastic scale-up's all-reduce of last_expert_load matches a fresh rank's
        assert outcome["last_expert_load_is_the_estimate"] and outcome["dtypes"] == ["torch.int64"] * 3, outcome
        assert outcome["failure_raised"] == "injected estimator failure" and not outcome["shadow_left"], outcome
        assert outcome["changed_slots"] > 0, (rank, outcome)
        assert outcome["wrong_after_estimate"] == [] and outcome["wrong_after_sum"] == [], (rank, outcome)
    assert len({outcome["applied"] for outcome in outcomes}) == 1


def test_add_send_of_an_expert_not_held_raises_on_every_rank_and_the_next_execute_works(two):
    for rank, outcome in enumerate(two):
        result = ok(outcome["bad add_send"])
        error = result["error"]
        assert error is not None and error["is_eplb_error"], f"rank {rank}: {error}"
        stranger = 2 * 2 - 1  # held by rank 1 only
        assert "add_send" in error["message"] and f"expert {stranger}" in error["message"], error
        assert "on rank 0" in error["message"] and "does not hold" in error["message"], error
        assert result["next_execute_exact"], f"rank {rank}"


VLLM_METHODS = ["add_send", "add_recv", "execute", "set_transfer_context", "set_stream"]


def test_the_communicator_is_vllms_subclass_with_vllms_parameter_names():
    code = """
import inspect, json
import eplb.vllm
from vllm.distributed.eplb.eplb_communicator import EplbCommunicator as Vllm
cls = eplb.vllm.EplbCommunicator
print(json.dumps({
    "subclass": issubclass(cls, Vllm), "abstract": sorted(getattr(cls, "__abstractmethods__", [])),
    "name": f"{cls.__module__}.{cls.__qualname__}", "same_on_second_access": cls is eplb.vllm.EplbCommunicator,
    "reserve_is_property": isinstance(inspect.getattr_static(cls, "needs_profile_buffer_reservation"), property),
    "signatures": {m: [list(inspect.signature(getattr(c, m)).parameters) for c in (cls, Vllm)]
                   for m in %r}}))
""" % VLLM_METHODS
    found = run_python(code)
    assert found["subclass"] and found["abstract"] == [] and found["same_on_second_access"], found
    assert found["name"] == "eplb.vllm.EplbCommunicator" and found["reserve_is_property"], found
    for method, (ours, vllms) in found["signatures"].items():
        assert ours == vllms, f"{method}: eplb {ours}, vLLM {vllms}"


def test_install_patches_the_factory_everywhere_vllm_looks_it_up():
    code = """
import json
import eplb, eplb.vllm
from vllm.distributed.eplb import eplb_communicator, eplb_state
original = eplb_communicator.create_eplb_communicator
out = {"before": eplb_state.create_eplb_communicator is original}
out["installed"] = eplb.vllm.install(["torch_gloo", "nixl"])
out["patched"] = [m.create_eplb_communicator is not original for m in (eplb_communicator, eplb_state)]
first = eplb_state.create_eplb_communicator
out["all"] = eplb.vllm.install("all")
out["replaced"] = [m.create_eplb_communicator not in (original, first) for m in (eplb_communicator, eplb_state)]
try:
    eplb.vllm.install(["eplb"])
except eplb.Error as failure:
    out["bad"] = str(failure)
out["uninstalled"] = eplb.vllm.uninstall()
out["restored"] = [m.create_eplb_communicator is original for m in (eplb_communicator, eplb_state)]
out["again"] = eplb.vllm.uninstall()
print(json.dumps(out))
"""
    found = run_python(code)
    assert found["before"] and found["installed"] == ["nixl", "torch_gloo"] and found["patched"] == [True, True]
    assert found["all"] == ["nixl", "pynccl", "torch_gloo", "torch_nccl", "torch_xccl"], found
    assert found["replaced"] == [True, True], found  # a second install() replaces the first
    assert found["bad"].startswith("install(): 'eplb' is not an EPLB communicator backend of vLLM"), found
    assert found["uninstalled"] and found["restored"] == [True, True] and found["again"] is False, found


def test_importable_without_vllm():
    code = """
import sys, json
sys.modules["vllm"] = None  # vllm made unimportable
import eplb, eplb.vllm
from eplb.communicator import EplbCommunicator
out = {"class": eplb.vllm.EplbCommunicator is EplbCommunicator, "register": eplb.vllm.register()}
try:
    eplb.vllm.install()
except eplb.Error as failure:
    out["install"] = str(failure)
print(json.dumps(out))
"""
    found = run_python(code)
    assert found["class"] and found["register"] == [], found
    assert "vllm is not importable" in found["install"], found


def run_python(code: str) -> dict:
    """Runs `code` in a fresh interpreter (vLLM's imports and patches stay out of the test process)."""
    import json

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

