"""eplb's policies and communicator in vLLM (vllm/distributed/eplb), and the hooks that select them.

Contract: `EplbPolicy` has the interface of vLLM's `DefaultEplbPolicy`:
`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices=None) -> phy2log` is a classmethod returning an
int64 CPU tensor [layers, num_replicas]. It runs the hierarchical variant
when num_groups % num_nodes == 0, else the global one with (1, 1, num_ranks),
as vLLM does; with old indices given, experts that stay on a rank keep their
old slots (`preserve_intragpu_slots`, vLLM's semantics). The computation is
eplb's C++ `deepseek` policy (DeepSeek's algorithm with a stable tie order and
float32 sums; vLLM's numpy port may decide ties differently: docs/python.md).
Subclasses do the same with eplb's other policies; `make_policy` binds options.
`register(policy)` points vLLM's "default" entry of `EPLB_POLICIES` (the only
name vLLM's `EPLBConfig.policy` accepts) at an eplb policy. Bad input raises
eplb.Error (a ValueError) where vLLM would assert.
`EplbCommunicator` is vLLM's EPLB communicator contract over eplb's transfer agent
(eplb/communicator.py), a subclass of vLLM's abstract class when vllm is importable
(resolved on first access, since importing vLLM takes seconds).
`plugin` (vLLM's `vllm.general_plugins` entry point), `install` and `uninstall`
(vLLM's communicator factory): eplb/vllm_integration.py. `install_window` and
`uninstall_window` (eplb's estimators on vLLM's own per-step load window,
which vLLM otherwise sums before the policy sees it): eplb/vllm_window.py.
torch is needed to call these (vLLM has it); importing this module is not.
"""
import importlib

from eplb import _arrays, _eplb
from eplb.errors import Error
from eplb.policy import policies, rebalance_experts
from eplb.vllm_integration import install, plugin, uninstall
from eplb.vllm_window import install_window, uninstall_window

__all__ = ["EplbPolicy", "RelabelEplbPolicy", "IncrementalEplbPolicy", "BalancedEplbPolicy", "CostAwareEplbPolicy",
           "make_policy", "register", "preserve_intragpu_slots", "POLICY_CLASSES", "EplbCommunicator", "plugin",
           "install", "uninstall", "install_window", "uninstall_window"]

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


#: eplb policy name -> the class with vLLM's contract that runs it.
POLICY_CLASSES = {"deepseek": EplbPolicy, "relabel": RelabelEplbPolicy, "incremental": IncrementalEplbPolicy,
                  "balanced": BalancedEplbPolicy, "cost-aware": CostAwareEplbPolicy}
_OPTIONS = ("threads", "budget", "anti_affinity", "min_gain", "estimator", "move_threshold", "cluster", "interval_s",
            "bytes_per_expert", "stall_mode")


def make_policy(name="deepseek", **options) -> type:
    """A policy class with vLLM's contract for eplb policy `name`, with options bound.

    Options are keyword arguments of eplb.rebalance_experts: threads, budget, anti_affinity, min_gain,
    estimator, move_threshold, cluster, interval_s, bytes_per_expert, stall_mode. Example:
    make_policy("incremental", budget=0.05), make_policy("cost-aware", interval_s=300).
    """
    if name not in POLICY_CLASSES:
        raise Error(f"unknown policy {name!r} (known: {', '.join(policies())})")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise Error(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
    base = POLICY_CLASSES[name]
    return type(base.__name__, (base,), {"options": dict(options), "__module__": __name__})


def register(policy="deepseek") -> list:
    """Points vLLM's "default" policy at eplb's, when vllm is importable.

    vLLM's `EPLBConfig.policy` accepts only the names of its Literal ("default" in vllm 0.33.0) and
    `EplbState.add_model` looks that name up in `vllm.distributed.eplb.policy.EPLB_POLICIES`, so the
    "default" entry is the one a vLLM config can select (and the only one async EPLB runs). vLLM's
    general plugin (`plugin`, from EPLB_VLLM_POLICY) calls this in every vLLM process; call it yourself
    before vLLM builds its EplbState otherwise.

    Args:
        policy: an eplb policy name (deepseek, relabel, incremental, balanced, cost-aware), or a class from make_policy.

    Returns:
        ["default"], or [] when vllm cannot be imported.
    """
    chosen = policy if isinstance(policy, type) else make_policy(policy)
    try:
        registry = importlib.import_module(_REGISTRY_MODULE).EPLB_POLICIES
    except ModuleNotFoundError as missing:
        if missing.name and missing.name.split(".")[0] == "vllm":
            return []
        raise
    registry["default"] = chosen
    return ["default"]


def __getattr__(name):
    if name == "EplbCommunicator":  # resolved on first use: it imports vLLM when vLLM is there
        from eplb.vllm_integration import communicator_class

        return communicator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
