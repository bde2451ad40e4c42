"""eplb's policies behind vLLM's EPLB policy contract (vllm/distributed/eplb/policy).

Contract: `EplbPolicy` has the interface of vLLM's `DefaultEplbPolicy`:
`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices=None) -> phy2log` is a classmethod returning an
int64 CPU tensor [layers, num_replicas]. It runs the hierarchical variant
when num_groups % num_nodes == 0, else the global one with (1, 1, num_ranks),
as vLLM does; with old indices given, experts that stay on a rank keep their
old slots (`preserve_intragpu_slots`, vLLM's semantics). The computation is
eplb's C++ `deepseek` policy (DeepSeek's algorithm with a stable tie order;
vLLM's numpy port may order equal loads differently). Subclasses do the
same with eplb's other policies; `make_policy` binds options. `register()`
adds them to vLLM's `EPLB_POLICIES` when vllm is importable. Bad input
raises eplb.Error (a ValueError) where vLLM would assert.
`EplbCommunicator` is vLLM's EPLB communicator contract over eplb's transfer agent
(eplb/communicator.py).
torch is needed to call these (vLLM has it); importing this module is not.
"""
import importlib

from eplb import _arrays, _eplb
from eplb.errors import Error
from eplb.policy import policies, rebalance_experts
from eplb.communicator import EplbCommunicator

__all__ = ["EplbPolicy", "RelabelEplbPolicy", "IncrementalEplbPolicy", "BalancedEplbPolicy", "CostAwareEplbPolicy",
           "make_policy",
           "register", "preserve_intragpu_slots", "REGISTRY_NAMES", "EplbCommunicator"]

_REGISTRY_MODULE = "vllm.distributed.eplb.policy"


def preserve_intragpu_slots(phy2log, num_ranks, old_phy2log):
    """phy2log reordered inside each rank so that experts that stay keep their old slots.

    vLLM's semantics: on every rank and layer, each old slot whose expert is still on the rank in
    phy2log keeps it (the first unused occurrence in the new order); the remaining new experts fill
    the remaining slots in order. The multiset of experts of every rank is unchanged. Both arrays are
    [layers, slots] of one shape (torch, numpy or lists; -1 entries allowed); the result has phy2log's
    kind and dtype.
    """
    preserved = _eplb.preserve_slots(_arrays.indices("phy2log", phy2log), _arrays.count("num_ranks", num_ranks),
                                     _arrays.indices("old_phy2log", old_phy2log))
    return _arrays.output(preserved, phy2log, _arrays.dtype_of(phy2log))


class EplbPolicy:
    """vLLM's DefaultEplbPolicy contract over eplb's `deepseek` policy (DeepSeek's algorithm, in C++)."""

    #: eplb policy name (eplb.policies()).
    policy = "deepseek"
    #: extra keyword arguments for eplb.rebalance_experts (threads, budget, anti_affinity, min_gain, ...).
    options: dict = {}

    @classmethod
    def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                          old_global_expert_indices=None):
        """phy2log [layers, num_replicas] (int64 CPU tensor) for the load `weight` [layers, experts].

        `old_global_expert_indices` is the placement in force (phy2log of the same shape). When given,
        relabel and incremental start from it, and experts that stay on a rank keep their old slots.
        """
        torch = importlib.import_module("torch")
        global_nodes = num_nodes if cls.policy == "cost-aware" else 1  # cost-aware's hosts price its moves
        groups, nodes = (num_groups, num_nodes) if _divides(num_nodes, num_groups) else (1, global_nodes)
        current = None
        if old_global_expert_indices is not None and cls.policy in ("relabel", "incremental", "cost-aware"):
            current = old_global_expert_indices
        phy2log, _, _ = rebalance_experts(_arrays.loads("weight", weight), num_replicas, groups, nodes, num_ranks,
                                          policy=cls.policy, current=current, **cls.options)
        if old_global_expert_indices is not None:
            phy2log = preserve_intragpu_slots(phy2log, num_ranks, old_global_expert_indices)
        return torch.from_numpy(phy2log)

    @classmethod
    def preserve_intragpu_slots(cls, phy2log, num_ranks, old_phy2log):
        """See eplb.vllm.preserve_intragpu_slots."""
        return preserve_intragpu_slots(phy2log, num_ranks, old_phy2log)


def _divides(num_nodes, num_groups) -> bool:
    nodes = _arrays.count("num_nodes", num_nodes)
    return _arrays.count("num_groups", num_groups) % nodes == 0


class RelabelEplbPolicy(EplbPolicy):
    """deepseek's balance, relabelled so that the fewest slots change from the old placement."""

    policy = "relabel"


class IncrementalEplbPolicy(EplbPolicy):
    """Improves the old placement by slot moves within a budget (options: budget, move_threshold)."""

    policy = "incremental"


class BalancedEplbPolicy(EplbPolicy):
    """Searches replica counts and packings; never less balanced than deepseek on the planning load."""

    policy = "balanced"


class CostAwareEplbPolicy(EplbPolicy):
    """The moves from the old placement that serve the most tokens until the next rebalance, net of the
    migration's stall (options: cluster, interval_s, bytes_per_expert, stall_mode; docs/scale.md)."""

    policy = "cost-aware"


_CLASSES = {"deepseek": EplbPolicy, "relabel": RelabelEplbPolicy, "incremental": IncrementalEplbPolicy,
            "balanced": BalancedEplbPolicy, "cost-aware": CostAwareEplbPolicy}
_OPTIONS = ("threads", "budget", "anti_affinity", "min_gain", "estimator", "move_threshold", "cluster", "interval_s",
            "bytes_per_expert", "stall_mode")

#: names register() adds to vLLM's EPLB_POLICIES, and the eplb policy behind each.
REGISTRY_NAMES = {"eplb": "deepseek", "eplb_relabel": "relabel", "eplb_incremental": "incremental",
                  "eplb_balanced": "balanced", "eplb_cost_aware": "cost-aware"}


def make_policy(name="deepseek", **options) -> type:
    """A policy class with vLLM's contract for eplb policy `name`, with options bound.

    Options are keyword arguments of eplb.rebalance_experts: threads, budget, anti_affinity, min_gain,
    estimator, move_threshold, cluster, interval_s, bytes_per_expert, stall_mode. Example:
    make_policy("incremental", budget=0.05), make_policy("cost-aware", interval_s=300).
    """
    if name not in _CLASSES:
        raise Error(f"unknown policy {name!r} (known: {', '.join(policies())})")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise Error(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
    base = _CLASSES[name]
    return type(base.__name__, (base,), {"options": dict(options), "__module__": __name__})


def register(default=None) -> list:
    """Adds eplb's policies to vLLM's policy registry, when vllm is importable.

    Adds "eplb", "eplb_relabel", "eplb_incremental", "eplb_balanced" and "eplb_cost_aware" to
    vllm.distributed.eplb.policy.EPLB_POLICIES. With `default` (an eplb policy name, or a class from
    make_policy), also points vLLM's "default" entry at it, so a stock EPLB config uses eplb.

    Returns:
        the registry names added or replaced; [] when vllm cannot be imported.
    """
    try:
        registry = importlib.import_module(_REGISTRY_MODULE).EPLB_POLICIES
    except ImportError:
        return []
    names = []
    for registry_name, policy_name in REGISTRY_NAMES.items():
        registry[registry_name] = _CLASSES[policy_name]
        names.append(registry_name)
    if default is not None:
        registry["default"] = default if isinstance(default, type) else make_policy(default)
        names.append("default")
    return names
