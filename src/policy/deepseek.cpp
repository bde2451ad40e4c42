// deepseek.cpp - the `deepseek` policy: DeepSeek's published EPLB algorithm
// (rebalance_experts), reproduced exactly.
//
// Per layer, with G groups, N nodes, P ranks, E experts and R slots:
//  1. group loads (float32, summed in index order) are packed onto nodes,
//     G / N groups per node (balanced_packing);
//  2. the experts of each node are renumbered node-major ("mlog": node, then
//     the group's rank inside its node, then the expert inside the group)
//     and replicated inside the node into R / N physical replicas;
//  3. each node's replicas (load float32(load / count)) are packed onto the
//     node's P / N ranks, R / P per rank.
// When G % N != 0 the same runs with one group and one node (global variant).
// log2phy[e][k] is the slot of the replica of expert e created k-th, and its
// width is the largest replica count over all layers, as the reference does.
#include <algorithm>
#include <string>
#include <vector>

#include "deepseek_packing.h"
#include "layer_tools.h"
#include "eplb/common.h"
#include "eplb/policy.h"
#include "policies.h"

namespace eplb {

namespace {

using deepseek_detail::balanced_packing;
using deepseek_detail::PackingScratch;
using deepseek_detail::replicate_experts;

struct Shape {
  int experts = 0, slots = 0, groups = 0, nodes = 0, ranks = 0;
  int group_size = 0, groups_per_node = 0, experts_per_node = 0, slots_per_node = 0, ranks_per_node = 0,
      slots_per_rank = 0;

  explicit Shape(const Topology& topology) {
    const bool hierarchical = topology.hierarchical();
    experts = topology.num_experts;
    slots = topology.num_slots;
    groups = hierarchical ? topology.num_groups : 1;
    nodes = hierarchical ? topology.num_nodes : 1;
    ranks = topology.num_ranks;
    group_size = experts / groups;
    groups_per_node = groups / nodes;
    experts_per_node = experts / nodes;
    slots_per_node = slots / nodes;
    ranks_per_node = ranks / nodes;
    slots_per_rank = slots / ranks;
  }
};

// Everything one worker needs, allocated once and reused for its layers.
struct LayerScratch {
  std::vector<float> weight, group_load, node_weight, replica_load;
  std::vector<int32_t> group_node, group_rank, mlog2log;
  std::vector<int32_t> phy2mlog, replica_rank, mlog_count, rank_of_replica, position_in_rank;
  PackingScratch packing;

  explicit LayerScratch(const Shape& s)
      : weight(size_t(s.experts)),
        group_load(size_t(s.groups)),
        node_weight(size_t(s.experts_per_node)),
        replica_load(size_t(s.slots_per_node)),
        group_node(size_t(s.groups)),
        group_rank(size_t(s.groups)),
        mlog2log(size_t(s.experts)),
        phy2mlog(size_t(s.slots_per_node)),
        replica_rank(size_t(s.slots_per_node)),
        mlog_count(size_t(s.experts_per_node)),
        rank_of_replica(size_t(s.slots_per_node)),
        position_in_rank(size_t(s.slots_per_node)) {
    packing.reserve(std::max(s.groups, s.slots_per_node), std::max(s.nodes, s.ranks_per_node), s.experts_per_node);
  }
};

// One layer. Writes phy2log[R], the replica rank of each slot's expert
// phyrank[R], and logcnt[E].
void rebalance_layer(const double* load, const Shape& s, LayerScratch& w, int32_t* phy2log, int32_t* phyrank,
                     int32_t* logcnt) {
  for (int e = 0; e < s.experts; ++e) w.weight[e] = static_cast<float>(load[e]);

  // 1. Groups onto nodes.
  for (int g = 0; g < s.groups; ++g) {
    float sum = 0.0f;
    const float* member = w.weight.data() + size_t(g) * s.group_size;
    for (int j = 0; j < s.group_size; ++j) sum = sum + member[j];
    w.group_load[g] = sum;
  }
  balanced_packing(w.group_load.data(), s.groups, s.nodes, w.group_node.data(), w.group_rank.data(), w.packing);
  for (int g = 0; g < s.groups; ++g) {
    const int first_mlog = (w.group_node[g] * s.groups_per_node + w.group_rank[g]) * s.group_size;
    for (int j = 0; j < s.group_size; ++j) w.mlog2log[first_mlog + j] = g * s.group_size + j;
  }

  for (int node = 0; node < s.nodes; ++node) {
    const int32_t* node_experts = w.mlog2log.data() + size_t(node) * s.experts_per_node;
    for (int j = 0; j < s.experts_per_node; ++j) w.node_weight[j] = w.weight[node_experts[j]];

    // 2. Replicate inside the node.
    replicate_experts(w.node_weight.data(), s.experts_per_node, s.slots_per_node, w.phy2mlog.data(),
                      w.replica_rank.data(), w.mlog_count.data(), w.packing);

    // 3. The node's replicas onto its ranks.
    for (int p = 0; p < s.slots_per_node; ++p) {
      const int32_t j = w.phy2mlog[p];
      w.replica_load[p] = w.node_weight[j] / static_cast<float>(w.mlog_count[j]);
    }
    balanced_packing(w.replica_load.data(), s.slots_per_node, s.ranks_per_node, w.rank_of_replica.data(),
                     w.position_in_rank.data(), w.packing);

    const int first_slot = node * s.slots_per_node;
    for (int p = 0; p < s.slots_per_node; ++p) {
      const int slot = first_slot + w.rank_of_replica[p] * s.slots_per_rank + w.position_in_rank[p];
      phy2log[slot] = node_experts[w.phy2mlog[p]];
      phyrank[slot] = w.replica_rank[p];
    }
    for (int j = 0; j < s.experts_per_node; ++j) logcnt[node_experts[j]] = w.mlog_count[j];
  }
}

class DeepSeekPolicy final : public Policy {
 public:
  std::string name() const override { return "deepseek"; }

  Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                          const PolicyOptions& options) const override {
    EPLB_ASSIGN_OR_RETURN(Placement placement, deepseek_placement(load, topology, options.threads));
    // Anti-affinity is post-processing (swaps that separate duplicate
    // replicas, then the same hysteresis; layer_tools.h): asked for, the
    // output is no longer DeepSeek's exactly; by default it is untouched.
    if (options.anti_affinity)
      return policies::apply_common_options(std::move(placement), load, topology, current, options);
    if (options.min_gain <= 0) return placement;
    // Hysteresis: keep the current mapping of layers that would gain too little.
    EPLB_TRY(current.validate_against(topology).with_context("policy 'deepseek' with min_gain: current placement"));
    BalanceSummary before = balancedness(current, load, topology);
    BalanceSummary after = balancedness(placement, load, topology);
    for (int l = 0; l < topology.num_layers; ++l)
      if (after.per_layer[l] - before.per_layer[l] < options.min_gain)
        EPLB_TRY(placement.set_layer(l, current, l));
    return placement;
  }
};

}  // namespace

Result<Placement> deepseek_placement(const LoadMatrix& load, const Topology& topology, int threads) {
  EPLB_TRY(topology.validate().with_context("deepseek"));
  if (load.num_layers != topology.num_layers || load.num_experts != topology.num_experts)
    return error(Code::InvalidArgument, "deepseek: load is " + std::to_string(load.num_layers) + " layers x " +
                                            std::to_string(load.num_experts) + " experts but the topology is " +
                                            topology.to_string());
  EPLB_TRY(load.validate().with_context("deepseek"));

  const Shape shape(topology);
  const int layers = topology.num_layers;
  std::vector<int32_t> phy2log(size_t(layers) * shape.slots);
  std::vector<int32_t> phyrank(size_t(layers) * shape.slots);
  std::vector<int32_t> logcnt(size_t(layers) * shape.experts);

  // Contiguous blocks of layers, one scratch per block: the result does not
  // depend on how layers are split, only the speed does.
  const int blocks = std::clamp(threads, 1, layers);
  parallel_for(size_t(blocks), blocks, [&](size_t block) {
    const int first = int(int64_t(block) * layers / blocks);
    const int last = int(int64_t(block + 1) * layers / blocks);
    LayerScratch scratch(shape);
    for (int l = first; l < last; ++l)
      rebalance_layer(load.values.data() + size_t(l) * shape.experts, shape, scratch,
                      phy2log.data() + size_t(l) * shape.slots, phyrank.data() + size_t(l) * shape.slots,
                      logcnt.data() + size_t(l) * shape.experts);
  });

  const int max_replicas = *std::max_element(logcnt.begin(), logcnt.end());
  std::vector<int32_t> log2phy(size_t(layers) * shape.experts * max_replicas, -1);
  for (int l = 0; l < layers; ++l)
    for (int slot = 0; slot < shape.slots; ++slot) {
      const size_t at = size_t(l) * shape.slots + slot;
      log2phy[(size_t(l) * shape.experts + phy2log[at]) * max_replicas + phyrank[at]] = slot;
    }
  auto placement = Placement::from_arrays(layers, shape.experts, shape.slots, max_replicas, std::move(phy2log),
                                          std::move(log2phy), std::move(logcnt));
  if (!placement.is_ok())
    return error(Code::Internal, "deepseek produced an invalid placement (a bug): " + placement.status().message());
  return placement;
}

namespace policies {
std::unique_ptr<Policy> make_deepseek() { return std::make_unique<DeepSeekPolicy>(); }
}  // namespace policies

}  // namespace eplb
