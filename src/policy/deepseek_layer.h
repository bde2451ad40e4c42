// deepseek_layer.h - DeepSeek's EPLB algorithm for a block of layers over
// scratch allocated once per worker (internal to src/policy/).
//
// Per layer, with G groups, N nodes, P ranks, E experts and R slots:
//  1. group loads (float32, summed in index order) are packed onto nodes,
//     G / N groups per node;
//  2. the experts of each node are renumbered node-major ("mlog": node, then
//     the group's rank inside its node, then the expert inside the group)
//     and replicated inside the node into R / N physical replicas;
//  3. each node's replicas (load float32(load / count)) are packed onto the
//     node's P / N ranks, R / P per rank.
// When G % N != 0 the same runs with one group and one node (global variant).
// One sort of the layer's E experts by (weight, mlog) serves every node: a
// stable split by node gives each node's experts in its own order, from
// which replication and the replicas' packing order follow by merging.
// The packing of all (layer, node) problems of a block runs interleaved.
#pragma once

#include <cstdint>
#include <vector>

#include "deepseek_packing.h"
#include "deepseek_replicate.h"
#include "eplb/placement.h"

namespace eplb::deepseek_detail {

struct DeepSeekShape {
  int experts = 0, slots = 0, groups = 0, nodes = 0, ranks = 0;
  int group_size = 0, groups_per_node = 0, experts_per_node = 0, slots_per_node = 0, ranks_per_node = 0,
      slots_per_rank = 0;
  int block_layers = 1;  // layers whose packings run interleaved

  explicit DeepSeekShape(const Topology& topology);
  bool operator==(const DeepSeekShape&) const = default;
};

// Where block_layers layers' results go: rows of [L][R] and [L][E] arrays.
struct LayerOutput {
  int32_t* phy2log;  // [R] per layer
  int32_t* phyrank;  // [R]: the replica rank of each slot's expert
  int32_t* logcnt;   // [E]
};

class LayerBlock {
 public:
  explicit LayerBlock(const DeepSeekShape& shape);

  // Layers first .. first + count - 1 (count <= block_layers) of `load`
  // ([L][E] doubles); writes their rows of `out`. A load that is negative,
  // infinite or NaN is noted (saw_invalid_load) and its output is garbage.
  void run(const double* load, int first, int count, const LayerOutput& out);
  bool saw_invalid_load() const { return saw_invalid_load_; }
  const DeepSeekShape& shape() const { return shape_; }

  // The calling thread's block for `shape`, kept from one call to the next
  // (its buffers are up to a few hundred KiB for serving shapes; allocated
  // per call they cost page faults). Clears saw_invalid_load.
  static LayerBlock& for_this_thread(const DeepSeekShape& shape);

 private:
  void group_layer(int b);    // step 1: mlog2log of layer slot b
  void sort_experts(int b);   // one sort, split by node
  void split_by_node(const uint64_t* keys, uint64_t* sorted) const;
  void write_layer(int b, int32_t* phy2log, int32_t* phyrank, int32_t* logcnt) const;
  size_t node_offset(int b, int node, int per_node) const {
    return (size_t(b) * size_t(shape_.nodes) + size_t(node)) * size_t(per_node);
  }

  DeepSeekShape shape_;
  bool saw_invalid_load_ = false;
  std::vector<int32_t> node_of_mlog_;
  // Per layer slot b of the block:
  std::vector<float> weight_;       // [b][E] float32 loads
  std::vector<float> node_weight_;  // [b][E] the same in mlog order
  std::vector<int32_t> mlog2log_;   // [b][E]
  // Per (layer slot, node):
  std::vector<uint64_t> node_sorted_;  // [b][N][E / N] descending keys with node-local indices
  std::vector<uint64_t> order_;        // [b][N][R / N] the replicas' packing order
  std::vector<int32_t> phy2mlog_, replica_rank_, position_;  // [b][N][R / N]; position: rank * R / P + place
  std::vector<int32_t> count_;                                           // [b][N][E / N]
  std::vector<BatchReplicator::Job> replica_jobs_;  // [b][N]
  std::vector<BatchPacker::Job> pack_jobs_;         // [b][N]
  // Per layer, reused:
  std::vector<float> group_load_;
  std::vector<int32_t> group_position_;  // group_position: node * G / N + place
  std::vector<uint64_t> group_keys_, keys_, spare_;
  BatchReplicator replicator_;
  BatchPacker packer_;
};

}  // namespace eplb::deepseek_detail
