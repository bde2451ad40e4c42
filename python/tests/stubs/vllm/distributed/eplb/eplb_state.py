"""Test stub of vLLM's EplbState: how vLLM uses a policy from the registry."""
from vllm.distributed.eplb.policy import EPLB_POLICIES


class EplbState:
    def __init__(self, policy_name, physical_to_logical_map):
        self.policy = EPLB_POLICIES[policy_name]  # looked up once, when the state is built
        self.physical_to_logical_map = physical_to_logical_map

    def rearrange(self, load_window, num_groups, num_nodes, num_ranks):
        num_replicas = self.physical_to_logical_map.shape[1]
        if num_ranks % num_nodes != 0:
            num_nodes = 1
        new = self.policy.rebalance_experts(load_window, num_replicas, num_groups, num_nodes, num_ranks,
                                            self.physical_to_logical_map)
        self.physical_to_logical_map = new
        return new
