"""What each spawned rank runs in the tests of eplb's communicator inside the real vLLM (test_vllm_communicator.py).

vLLM's own functions drive eplb.vllm.EplbCommunicator: `rearrange_expert_weights_inplace`, `transfer_layer`
(migration batching off and on) + `move_from_buffer`, elastic scale-down and scale-up through `rank_mapping`,
and vLLM's EplbState picking eplb's policy and communicator (plugin, install). The shapes and weight values are
those of vLLM's tests/distributed/test_eplb_execute.py (the published inputs): float32 rows of
logical * 1000 + layer * 100 + tensor * 10 + arange(hidden), hidden sizes 32 and 64. Each rank returns a
JSON-able dict of what it saw; the tests assert on it.
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import torch

HIDDEN = (32, 64)
# (world, layers, local experts, logical experts): vLLM's test_eplb_execute.py shapes.
SHAPES = [(2, 1, 2, 3), (2, 2, 3, 4), (2, 4, 8, 16), (4, 1, 2, 6), (4, 2, 2, 5), (4, 8, 8, 16)]


def expert_row(logical: int, layer: int, tensor: int) -> torch.Tensor:
    base = logical * 1000 + layer * 100 + tensor * 10
    return torch.arange(base, base + HIDDEN[tensor], dtype=torch.float32)


def make_weights(indices: torch.Tensor, local: int, rank: int) -> list[list[torch.Tensor]]:
    """[layers][tensors] of [local, hidden] holding the experts `indices` [layers, physical] puts on `rank`;
    slots holding -1 (no expert: a rank that joins in a scale-up) are filled with -1.0."""
    weights = []
    for layer in range(indices.shape[0]):
        tensors = [torch.full((local, hidden), -1.0) for hidden in HIDDEN]
        for row in range(local):
            expert = int(indices[layer, rank * local + row])
            if expert >= 0:
                for t, tensor in enumerate(tensors):
                    tensor[row] = expert_row(expert, layer, t)
        weights.append(tensors)
    return weights


def wrong_rows(weights, indices: torch.Tensor, local: int, rank: int, first_layer: int = 0) -> list:
    """(layer, row, tensor) of every row that is not byte-exact the expert `indices` puts there (-1: any);
    weights[i] and indices[i] are layer first_layer + i."""
    wrong = []
    for layer, tensors in enumerate(weights, start=first_layer):
        for row in range(local):
            expert = int(indices[layer - first_layer, rank * local + row])
            for t, tensor in enumerate(tensors):
                if expert >= 0 and not torch.equal(tensor[row].view(torch.int32),
                                                   expert_row(expert, layer, t).view(torch.int32)):
                    wrong.append((layer, row, t))
    return wrong


def random_indices(generator: torch.Generator, layers: int, physical: int, logical: int) -> torch.Tensor:
    """[layers, physical]: every logical expert at least once, the rest random, shuffled per layer."""
    rows = []
    for _ in range(layers):
        extra = torch.randint(0, logical, (physical - logical,), generator=generator)
        row = torch.cat([torch.arange(logical), extra])
        rows.append(row[torch.randperm(physical, generator=generator)])
    return torch.stack(rows).long()


def new_buffer(weights) -> list[torch.Tensor]:
    return [torch.empty_like(tensor) for tensor in weights[0]]


def snapshot(weights) -> list:
    return [[tensor.clone() for tensor in tensors] for tensors in weights]


def same(weights, before) -> bool:
    return all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for tensors, olds in zip(weights, before) for a, b in zip(tensors, olds))


def injected_setup(shape, world: int, rank: int, seed: int, inject: str, **options):
    """(old, new, weights, buffer, communicator) of a random change of `shape`, the communicator's data plane
    injecting the faults `inject` (eplb's spec, read by its constructor)."""
    import torch.distributed as dist

    _, layers, local, logical = shape
    generator = torch.Generator().manual_seed(seed)
    old, new = (random_indices(generator, layers, world * local, logical) for _ in range(2))
    weights = make_weights(old, local, rank)
    buffer = new_buffer(weights)
    os.environ["EPLB_COMMUNICATOR_INJECT"] = inject
    try:
        return old, new, weights, buffer, communicator(dist.group.WORLD, weights, buffer, **options)
    finally:
        del os.environ["EPLB_COMMUNICATOR_INJECT"]


def communicator(cpu_group, weights, buffer, **options):
    import eplb.vllm

    return eplb.vllm.EplbCommunicator(cpu_group, weights, buffer, **{"timeout": 10.0, **options})


# ------------------------------------------------------------------------------------------- vLLM's paths

def rearrange_paths(rank: int, world: int, shape) -> dict:
    """One shape through vLLM's three entry points, each from the previous placement to a new one."""
    import torch.distributed as dist
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    _, layers, local, logical = shape
    generator = torch.Generator().manual_seed(1000 * world + 10 * layers + local)
    placements = [random_indices(generator, layers, world * local, logical) for _ in range(4)]
    weights = make_weights(placements[0], local, rank)
    buffer = new_buffer(weights)
    group = dist.group.WORLD
    comm = communicator(group, weights, buffer)
    outcome = {}
    rearrange_expert_weights_inplace(placements[0], placements[1], weights, buffer, group, comm)
    outcome["rearrange_expert_weights_inplace"] = wrong_rows(weights, placements[1], local, rank)
    before = snapshot(weights)
    rearrange_expert_weights_inplace(placements[1], placements[1], weights, buffer, group, comm)
    outcome["no change leaves the weights"] = same(weights, before)
    for batching, (old, new) in ((False, placements[1:3]), (True, placements[2:4])):
        transfer_layers(old, new, weights, buffer, group, comm, rank, batching)
        outcome[f"transfer_layer batching={batching}"] = wrong_rows(weights, new, local, rank)
    outcome["is_profile moves nothing"] = profile_run(placements[3], weights, buffer, group, comm)
    return outcome


def transfer_layers(old, new, weights, buffer, group, comm, rank: int, batching: bool) -> None:
    """vLLM's async path, one layer at a time: transfer_layer into the buffer, then move_from_buffer."""
    from vllm.distributed.eplb.rebalance_execute import move_from_buffer, transfer_layer

    for layer in range(old.shape[0]):
        metadata = transfer_layer(old[layer], new[layer], weights[layer], buffer, group, comm, layer_idx=layer,
                                  enable_migration_batching=batching)
        move_from_buffer(weights[layer], buffer, metadata, new[layer].numpy(), rank)


def profile_run(indices, weights, buffer, group, comm) -> bool:
    """is_profile=True: eplb needs no buffer reservation, so vLLM moves and collects nothing."""
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    before = snapshot(weights)
    shuffled = indices.flip(1)
    rearrange_expert_weights_inplace(indices, shuffled, weights, buffer, group, comm, is_profile=True)
    return same(weights, before) and comm.needs_profile_buffer_reservation is False


def elastic(rank: int, world: int, shape) -> dict:
    """Scale-down (rank 1 leaves, later ranks renumbered) and scale-up (a rank joins as new rank 1) through
    rearrange_expert_weights_inplace's rank_mapping, on a group of `world` ranks."""
    import torch.distributed as dist
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    _, layers, local, logical = shape
    generator = torch.Generator().manual_seed(7 * layers + local)
    group = dist.group.WORLD
    down = {old: (-1 if old == 1 else old - (old > 1)) for old in range(world)}
    full = random_indices(generator, layers, world * local, logical)
    smaller = random_indices(generator, layers, (world - 1) * local, logical)
    weights = make_weights(full, local, rank)
    buffer = new_buffer(weights)
    comm = communicator(group, weights, buffer)
    rearrange_expert_weights_inplace(full, smaller, weights, buffer, group, comm, rank_mapping=down)
    outcome = {"scale-down": wrong_rows(weights, smaller, local, down[rank]) if down[rank] >= 0 else []}
    # Scale-up: `world - 1` old ranks become new ranks 0, 2, 3, ...; new rank 1 joins without experts.
    up = {old: old + (old >= 1) for old in range(world - 1)}
    grown = random_indices(generator, layers, world * local, logical)
    joined = make_weights(torch.full((layers, world * local), -1), local, rank) if rank == 1 else None
    old_rank = next((old for old, new in up.items() if new == rank), None)
    start = make_weights(smaller, local, old_rank) if old_rank is not None else joined
    buffer = new_buffer(start)
    comm = communicator(group, start, buffer)
    rearrange_expert_weights_inplace(smaller, grown, start, buffer, group, comm, rank_mapping=up)
    outcome["scale-up"] = wrong_rows(start, grown, local, rank)
    return outcome


def corrupted_row(rank: int, world: int, shape) -> dict:
    """Every READ lands corrupted (eplb's fault injection): vLLM's call raises eplb.MigrationError on every
    rank, naming the layer, within the bound; the weights are untouched (move_from_buffer never ran)."""
    import torch.distributed as dist
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    import eplb

    old, new, weights, buffer, comm = injected_setup(shape, world, rank, 99, "corrupt=1.0,seed=1", timeout=5.0,
                                                     retries=1)
    before = snapshot(weights)
    started = time.monotonic()
    try:
        rearrange_expert_weights_inplace(old, new, weights, buffer, dist.group.WORLD, comm)
        outcome = {"type": None}
    except eplb.Error as failure:
        outcome = {"type": type(failure).__name__, "message": str(failure), "layer": getattr(failure, "layer", None),
                   "is_eplb_error": isinstance(failure, eplb.MigrationError)}
    outcome.update(seconds=time.monotonic() - started, bound=5.0, untouched=same(weights, before))
    return outcome


def corrupted_then_retried(rank: int, world: int, shape) -> dict:
    """Rows land corrupted now and then (eplb's fault injection through the data plane, 30% of the READs):
    the C++ protocol's digests catch them, its vote retries the layer, and vLLM's call ends byte-exact.
    The communicator's last_report is the protocol's own (retries, vote time, commit)."""
    import torch.distributed as dist
    from vllm.distributed.eplb.rebalance_execute import move_from_buffer, transfer_layer

    _, layers, local, _ = shape
    old, new, weights, buffer, comm = injected_setup(shape, world, rank, 7, "corrupt=0.3,seed=5", retries=8)
    retries, votes, seen = 0, 0.0, None
    for layer in range(layers):  # vLLM's async path, one layer per call: every execute()'s report is seen
        metadata = transfer_layer(old[layer], new[layer], weights[layer], buffer, dist.group.WORLD, comm,
                                  layer_idx=layer)
        move_from_buffer(weights[layer], buffer, metadata, new[layer].numpy(), rank)
        report = comm.last_report
        if report is not None and report is not seen:  # a layer with nothing to move runs no protocol
            seen = report
            retries += report.retries
            votes += sum(entry.seconds_vote for entry in report.layers)
    return {"retries": retries, "vote_seconds": votes, "wrong": wrong_rows(weights, new, local, rank),
            "plane": comm.plane}


def bad_add_send(rank: int, world: int) -> dict:
    """Issue 29 item 4: rank 0 queues an add_send of an expert it does not hold (per old_indices). Every
    rank must raise eplb.Error naming rank 0 and the expert, and the next execute() must work. (First an
    execute() with nothing queued anywhere, which must simply return.)"""
    import torch.distributed as dist

    import eplb

    local, logical = 2, 2 * world
    old = torch.arange(world * local) % logical  # rank r holds experts 2r and 2r + 1
    weights = make_weights(old[None], local, rank)
    buffer = new_buffer(weights)
    comm = communicator(dist.group.WORLD, weights, buffer, timeout=3.0)
    stranger = logical - 1  # held by the last rank only
    comm.set_transfer_context(old.numpy(), 0)
    comm.execute()  # nothing queued on any rank: returns, and the collectives stay paired
    comm.set_transfer_context(old.numpy(), 0)
    if rank == 0:
        comm.add_send([w[0] for w in weights[0]], 1, stranger)
    outcome = {}
    try:
        comm.execute()
        outcome["error"] = None
    except eplb.Error as failure:
        outcome["error"] = {"type": type(failure).__name__, "message": str(failure), "is_eplb_error": True}
    except Exception as failure:  # the failure before the fix: another exception, on another rank
        outcome["error"] = {"type": type(failure).__name__, "message": str(failure), "is_eplb_error": False}
    # The next execute() works: rank 1 reads expert 0 from rank 0, byte-exact.
    comm.set_transfer_context(old.numpy(), 0)
    if rank == 0:
        comm.add_send([w[0] for w in weights[0]], 1, 0)
    if rank == 1:
        comm.add_recv([b[0] for b in buffer], 0, 0)
    comm.execute()
    outcome["next_execute_exact"] = rank != 1 or all(
        torch.equal(buffer[t][0], expert_row(0, 0, t)) for t in range(len(HIDDEN)))
    return outcome


def killed_rank(rank: int, world: int, shape, victim: int) -> dict:
    """The victim dies (SIGKILL) when vLLM calls execute() for layer 1: the others' vLLM call raises
    eplb.PeerLostError (or TimeoutError) naming it, within the communicator's timeout."""
    import signal

    import torch.distributed as dist
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    import eplb
    import eplb.vllm
    from spawned import wait_for_survivors

    class DyingCommunicator(eplb.vllm.EplbCommunicator):
        """eplb's communicator whose victim rank dies at its second execute() (layer 1)."""

        executes = 0

        def execute(self):
            self.executes += 1
            if rank == victim and self.executes == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            super().execute()

    _, layers, local, logical = shape
    generator = torch.Generator().manual_seed(5)
    old, new = (random_indices(generator, layers, world * local, logical) for _ in range(2))
    weights = make_weights(old, local, rank)
    buffer = new_buffer(weights)
    timeout = 8.0
    comm = DyingCommunicator(dist.group.WORLD, weights, buffer, timeout=timeout)
    started = time.monotonic()
    try:
        rearrange_expert_weights_inplace(old, new, weights, buffer, dist.group.WORLD, comm)
        outcome = {"type": None}
    except eplb.Error as failure:
        outcome = {"type": type(failure).__name__, "message": str(failure), "peer": getattr(failure, "peer", None),
                   "layer": getattr(failure, "layer", None)}
    outcome.update(seconds=time.monotonic() - started, timeout=timeout,
                   layer0_new=wrong_rows(weights[:1], new[:1], local, rank) == [],
                   later_layers_old=wrong_rows(weights[1:], old[1:], local, rank, first_layer=1) == [])
    wait_for_survivors(rank, [r for r in range(world) if r != victim])
    return outcome


# ------------------------------------------------------------------------------ vLLM's EplbState on CPU

class TinyMoE:
    """A model with the attributes vLLM's MixtureOfExperts protocol names (no layers to run), holding the
    weights of vLLM's initial placement on this rank."""

    def __init__(self, layers: int, logical: int, redundant: int, local: int, groups: int, rank: int):
        from vllm.distributed.eplb.eplb_state import EplbState

        self.num_moe_layers, self.num_expert_groups, self.num_shared_experts = layers, groups, 0
        self.num_logical_experts = self.num_routed_experts = logical
        self.num_redundant_experts, self.num_physical_experts = redundant, logical + redundant
        self.num_local_physical_experts = local
        self.moe_layers = []
        initial = EplbState.build_initial_global_physical_to_logical_map(logical, redundant)
        self.initial = torch.tensor([list(initial)] * layers)
        self.expert_weights = make_weights(self.initial, local, rank)

    def set_eplb_state(self, expert_load_view, logical_to_physical_map, logical_replica_count):
        self.eplb_views = (expert_load_view, logical_to_physical_map, logical_replica_count)


class TinyModelConfig:
    """What EplbState.add_model asks of vLLM's ModelConfig: a hash keying the model's state."""

    model = "tiny-moe"

    def compute_hash(self) -> str:
        return "tiny-moe"


def tie_free_loads(rng: np.random.Generator, layers: int, experts: int, groups: int) -> np.ndarray:
    """Integer loads on which DeepSeek's algorithm has no tie when R <= 2E: distinct primes in [4000, 8000)
    (a hot expert gets at most 2 replicas, so every per-replica load is an integer or a half, exact in
    float32 and float64, and no two experts' per-replica loads are equal), with distinct group sums."""
    primes = [p for p in range(4001, 8000, 2) if all(p % d for d in range(3, int(p ** 0.5) + 1, 2))]
    rows = []
    while len(rows) < layers:
        row = rng.choice(primes, size=experts, replace=False)
        if len(set(row.reshape(groups, -1).sum(axis=1).tolist())) == groups:
            rows.append(row)
    return np.array(rows, dtype=np.int64)


@contextlib.contextmanager
def cpu_eplb_state(rank: int, world: int, **eplb_options):
    """vLLM's EplbState on CPU, gloo, with TinyMoE added (4 layers, 16 logical + 4 redundant experts, 4 groups):
    the plugin (loaded by vLLM's load_general_plugins from the environment the test set) selects eplb's policy
    and communicator. Yields (state, model_state, model); the model-parallel groups are destroyed after."""
    from vllm.config import EPLBConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.eplb import eplb_state
    from vllm.distributed.parallel_state import (destroy_model_parallel, init_distributed_environment,
                                                 initialize_model_parallel)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    parallel = ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=True,
                              eplb_config=EPLBConfig(communicator="torch_gloo", **eplb_options))
    config = VllmConfig(parallel_config=parallel)
    # vLLM refuses EPLB on a CPU platform ("only supported on CUDA devices or ROCm devices or XPU devices") when
    # it validates the config; set after validation, the flag makes initialize_model_parallel form the EPLB group.
    config.parallel_config.enable_eplb = True
    layers, logical, redundant, groups = 4, 16, 4, 4
    with set_current_vllm_config(config):
        init_distributed_environment(world, rank, "env://", rank, "gloo")  # over the test's gloo group
        initialize_model_parallel(tensor_model_parallel_size=world)
        try:
            state = eplb_state.EplbState(config.parallel_config, torch.device("cpu"))
            model = TinyMoE(layers, logical, redundant, (logical + redundant) // world, groups, rank)
            state.add_model(model, TinyModelConfig(), model_name="tiny-moe")
            yield state, state.model_states["tiny-moe"], model
        finally:
            destroy_model_parallel()


def vllm_state(rank: int, world: int) -> dict:
    """vLLM's run_rebalance_experts calls eplb's policy, rearrange_expert_weights_inplace moves the weights
    through eplb's communicator, _commit_eplb_maps (cpu_eplb_state)."""
    from vllm.distributed.eplb import eplb_state
    from vllm.distributed.eplb.async_worker import run_rebalance_experts
    from vllm.distributed.eplb.eplb_communicator import EplbCommunicator as VllmCommunicator
    from vllm.distributed.eplb.policy import EPLB_POLICIES, DefaultEplbPolicy
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace
    from vllm.distributed.parallel_state import get_ep_group

    import eplb.vllm

    with cpu_eplb_state(rank, world) as (state, model_state, model):
        layers, logical = model.num_moe_layers, model.num_logical_experts
        physical, groups, local = model.num_physical_experts, model.num_expert_groups, model.num_local_physical_experts
        load = torch.from_numpy(tie_free_loads(np.random.default_rng(11), layers, logical, groups))
        model_state.eplb_stats = eplb_state.EplbStats(load, physical, groups, 1, world)
        old = model_state.physical_to_logical_map.cpu().clone()
        new = run_rebalance_experts(model_state, state, old, None)
        rearrange_expert_weights_inplace(model_state.physical_to_logical_map, new, model.expert_weights,
                                         model_state.expert_buffer, get_ep_group().device_group,
                                         model_state.communicator)
        eplb_state._commit_eplb_maps(model_state, new)
        vllm_answer = DefaultEplbPolicy.rebalance_experts(load, physical, groups, 1, world, old)
        return {
            "registry_default": f"{EPLB_POLICIES['default'].__module__}.{EPLB_POLICIES['default'].__qualname__}",
            "state_policy_is_eplb": issubclass(state.policy, eplb.vllm.EplbPolicy),
            "state_policy_name": getattr(state.policy, "policy", None),
            "communicator_type": f"{type(model_state.communicator).__module__}."
                                 f"{type(model_state.communicator).__qualname__}",
            "communicator_is_eplb": type(model_state.communicator) is eplb.vllm.EplbCommunicator,
            "communicator_is_vllm_class": isinstance(model_state.communicator, VllmCommunicator),
            "changed_slots": int((new != old).sum()),
            "wrong": wrong_rows(model.expert_weights, new, local, rank),
            "committed": torch.equal(model_state.physical_to_logical_map, new),
            "equals_vllm_default": torch.equal(new, vllm_answer),
        }


class CpuEvent:
    """Stands in for torch.Event, which needs a CUDA driver, in vLLM's rearrange: the timing log of the sync path,
    the event that hands the async path to its worker (ordering the device's stream: nothing to order on CPU)."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other) -> float:
        return 0.0

    def wait(self, *args):
        pass


# vLLM's window (42 steps: eplb's 8 chunks of 5 drop the 2 oldest), eplb's chunks, the slot vLLM writes next.
WINDOW_STEPS, WINDOW_CHUNKS, WINDOW_NEXT = 42, 8, 13


def window_load(rank: int, time: int, layer: int, logical: int) -> int:
    """What rank `rank` records for one replica of `logical` at step `time` (0 = oldest) of the window: a steady
    load, except expert 5 + layer, whose load rises step by step (drift)."""
    rising = 60 * time if logical == 5 + layer else 0
    return 100 + 7 * ((3 * logical + layer) % 11) + 3 * rank + rising


def vllm_window(rank: int, world: int, use_async: bool) -> dict:
    """vLLM's own EplbState.rearrange with eplb.vllm.install_window: the policy receives eplb's estimate over the
    chunked, time-ordered, all-reduced window; then vLLM's window sum again after uninstall_window. Async (vLLM's
    default): rearrange hands the load to the async worker's run_rebalance_experts, called here as the worker
    would, which moves the weights layer by layer like rearrange_expert_weights_inplace; sync: inside rearrange."""
    import eplb
    import eplb.vllm

    with cpu_eplb_state(rank, world, window_size=WINDOW_STEPS, use_async=use_async) as (state, model_state, model):
        seen = []

        class Recording(state.policy):
            @classmethod
            def rebalance_experts(cls, weight, *args, **kwargs):
                seen.append(weight.clone())
                return super().rebalance_experts(weight, *args, **kwargs)

        state.policy = Recording
        old = model_state.physical_to_logical_map.clone()
        fill_window(model_state.expert_load_window, old, rank)
        state.expert_load_window_step = WINDOW_NEXT
        real_event = torch.Event
        torch.Event = CpuEvent
        try:
            eplb.vllm.install_window("auto", WINDOW_CHUNKS)
            try:
                wrong_after_estimate = window_rearrange(state, model_state, model, rank)
            finally:
                eplb.vllm.uninstall_window()
            new = model_state.physical_to_logical_map.clone()
            last_load = model_state.last_expert_load.clone()
            wrong_after_sum = window_rearrange(state, model_state, model, rank)  # vLLM's path, the map now in force
            failure = failing_estimate(state)
        finally:
            torch.Event = real_event
        chunked = expected_window(world, old, old, model.num_logical_experts, WINDOW_CHUNKS)
        estimate, applied = eplb.estimate_load(torch.from_numpy(chunked), "auto")
        vllm_sum = torch.from_numpy(expected_window(world, old, new, model.num_logical_experts, 1)[0])
        return {"applied": applied, "calls": len(seen),
                "estimate_received": torch.equal(seen[0], estimate.round().long()),
                "last_expert_load_is_the_estimate": torch.equal(last_load, estimate.round().long()),
                "vllm_sum_received": torch.equal(seen[1], vllm_sum),
                "dtypes": [str(seen[0].dtype), str(last_load.dtype), str(seen[1].dtype)],
                "estimate_is_not_the_sum": not torch.allclose(estimate, torch.from_numpy(chunked.sum(axis=0)).double()),
                "changed_slots": int((new != old).sum()),
                "wrong_after_estimate": wrong_after_estimate, "wrong_after_sum": wrong_after_sum, **failure}


def failing_estimate(state) -> dict:
    """install_window's rearrange with an estimator that raises: the error reaches rearrange's caller, and vLLM's
    _allreduce_list is no longer shadowed on the state."""
    import eplb
    import eplb.policy
    import eplb.vllm

    real_estimate = eplb.policy.estimate_load

    def broken(window, estimator):
        raise eplb.Error("injected estimator failure")

    eplb.vllm.install_window("auto", WINDOW_CHUNKS)
    eplb.policy.estimate_load = broken
    try:
        state.rearrange()
        raised = None
    except eplb.Error as error:
        raised = str(error)
    finally:
        eplb.vllm.uninstall_window()
        eplb.policy.estimate_load = real_estimate
    return {"failure_raised": raised, "shadow_left": "_allreduce_list" in vars(state)}


def fill_window(window: torch.Tensor, phy2log: torch.Tensor, rank: int) -> None:
    """This rank's window_load in vLLM's circular order: step `time` (0 = oldest) in slot WINDOW_NEXT + time."""
    layers, physical = phy2log.shape
    for time in range(WINDOW_STEPS):
        slot = (WINDOW_NEXT + time) % WINDOW_STEPS
        for layer in range(layers):
            for p in range(physical):
                window[slot, layer, p] = window_load(rank, time, layer, int(phy2log[layer, p]))


def window_rearrange(state, model_state, model, rank: int) -> list:
    """One EplbState.rearrange() (for async, then what vLLM's async worker does: consume the event, run the
    policy, move the weights, commit the maps); the rows that are wrong afterwards."""
    from vllm.distributed.eplb import eplb_state
    from vllm.distributed.eplb.async_worker import run_rebalance_experts
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace
    from vllm.distributed.parallel_state import get_ep_group

    state.rearrange()
    if state.is_async:
        state.rearrange_event.wait()
        old = model_state.physical_to_logical_map.cpu().clone()
        new = run_rebalance_experts(model_state, state, old, None)
        rearrange_expert_weights_inplace(old, new, model.expert_weights, model_state.expert_buffer,
                                         get_ep_group().device_group, model_state.communicator)
        eplb_state._commit_eplb_maps(model_state, new)
    return wrong_rows(model.expert_weights, model_state.physical_to_logical_map, model.num_local_physical_experts,
                      rank)


def expected_window(world: int, recorded: torch.Tensor, mapped: torch.Tensor, logical: int,
                    chunks: int) -> np.ndarray:
    """The all-reduced logical window in `chunks` chunks, by plain loops over window_load: slot p recorded the
    load of expert recorded[layer, p] and is counted for expert mapped[layer, p] (vLLM's map at rearrange)."""
    layers, physical = recorded.shape
    size = WINDOW_STEPS // chunks
    first = WINDOW_STEPS - chunks * size  # the oldest steps that fill no whole chunk are dropped
    out = np.zeros((chunks, layers, logical), dtype=np.int64)
    for time in range(first, WINDOW_STEPS):
        for layer in range(layers):
            for p in range(physical):
                load = sum(window_load(r, time, layer, int(recorded[layer, p])) for r in range(world))
                out[(time - first) // size, layer, int(mapped[layer, p])] += load
    return out


def step(function, *args):
    """{"ok": function(*args)} or {"error": the traceback}: one failing step does not hide the others'."""
    import traceback

    try:
        return {"ok": function(*args)}
    except Exception:  # reported to the test, which fails with it
        return {"error": traceback.format_exc()}


def two_ranks(rank: int, world: int) -> dict:
    """vLLM's EplbState, the 2-rank shapes through vLLM's paths, a corrupted row, then issue 29 item 4."""
    shapes = [shape for shape in SHAPES if shape[0] == world]
    return {"state": step(vllm_state, rank, world), "window async": step(vllm_window, rank, world, True),
            "window sync": step(vllm_window, rank, world, False),
            "paths": {str(shape): step(rearrange_paths, rank, world, shape) for shape in shapes},
            "corrupt": step(corrupted_row, rank, world, shapes[-1]),
            "corrupt retried": step(corrupted_then_retried, rank, world, shapes[-1]),
            "bad add_send": step(bad_add_send, rank, world)}


def four_ranks(rank: int, world: int) -> dict:
    """The 4-rank shapes through vLLM's paths, elastic scale-down and scale-up, a corrupted row."""
    shapes = [shape for shape in SHAPES if shape[0] == world]
    return {"paths": {str(shape): step(rearrange_paths, rank, world, shape) for shape in shapes},
            "elastic": {str(shape): step(elastic, rank, world, shape) for shape in shapes},
            "corrupt": step(corrupted_row, rank, world, shapes[-1])}
