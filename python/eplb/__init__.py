"""eplb: expert-parallel load balancing for Mixture-of-Experts models, from Python.

eplb's C++ library from Python (docs/python.md):

    import eplb
    phy2log, log2phy, logcnt = eplb.rebalance_experts(weight, num_replicas=288, num_groups=8,
                                                      num_nodes=4, num_gpus=32)

- rebalance_experts: DeepSeek's signature and result; policies deepseek (exact), relabel,
  incremental, balanced (eplb.policies()); windows through estimators (estimate_load: the
  estimator alone); the GIL is released.
- compute_logical_maps: vLLM's semantics. balancedness, rank_loads: balance metrics.
- plan_migration: what a change of placement moves (bytes kept / local / intra / inter node).
- read_load, read_load_trace, read_placement: eplb's files.
- eplb.vllm: vLLM's policy and communicator contracts, its general plugin (EPLB_VLLM_POLICY,
  EPLB_VLLM_COMMUNICATOR, EPLB_VLLM_ESTIMATOR), install() and install_window() (eplb's estimators
  on vLLM's load window); eplb.sglang: SGLang's algorithm entry and recorder dumps;
  eplb.plot: pictures (python3 -m eplb.plot).
- Migrator: moves an engine's own expert tensors between ranks over torch.distributed (or eplb's
  bootstraps: ProcessGroup.from_env), verified, layer by layer; empty / empty_like: tensors in
  transfer-layer memory (the zero-copy path). Migrator.start: the same round overlapped with
  serving (AsyncMigration: commit_ready() once per serving step).
- eplb.Error (a ValueError) for every bad input, with the library's message; LayoutError,
  MigrationError (TimeoutError, PeerLostError) for migrations.

numpy is required; torch is optional (torch in, torch out; numpy or lists in, numpy out).
"""
from eplb._eplb import __version__
from eplb.balance import Balancedness, balancedness, rank_loads
from eplb.errors import Error, LayoutError, MigrationError, PeerLostError, TimeoutError
from eplb.group import ProcessGroup
from eplb.memory import empty, empty_like
from eplb.async_migration import AsyncMigration
from eplb.migrator import Migrator
from eplb.files import read_load, read_load_trace, read_placement
from eplb.maps import compute_logical_maps
from eplb.plan import plan_migration
from eplb.policy import estimate_load, policies, rebalance_experts
from eplb import plot, sglang, vllm  # noqa: E402  (adapters; heavy imports stay lazy inside them)

__all__ = [
    "__version__", "Error", "rebalance_experts", "policies", "estimate_load", "compute_logical_maps", "balancedness",
    "Balancedness", "rank_loads", "plan_migration", "read_load", "read_load_trace", "read_placement",
    "plot", "sglang", "vllm", "Migrator", "ProcessGroup", "empty", "empty_like", "LayoutError", "MigrationError",
    "TimeoutError", "PeerLostError", "AsyncMigration",
]
