"""Test stub of vllm.distributed.eplb.policy: the registry of policy classes by name."""


class DefaultEplbPolicy:
    """Stand-in for vLLM's default policy: marks its output so a test can tell who ran."""

    @classmethod
    def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                          old_global_expert_indices=None):
        import torch

        return torch.full((weight.shape[0], num_replicas), -7, dtype=torch.int64)


EPLB_POLICIES = {"default": DefaultEplbPolicy}
