// deepseek_layer.cpp - one block of layers of the `deepseek` policy.
#include "deepseek_layer.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>

#include "bucket_pass.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace eplb::deepseek_detail {

namespace {

// float32(row[e]) into weight[e]; false when a value is negative, infinite
// or NaN (LoadMatrix::validate's check, fused into the conversion). Two
// values at a time with SSE2: GCC leaves the loop with the check scalar.
bool convert_loads(const double* row, float* weight, size_t count) {
  constexpr double kMax = std::numeric_limits<double>::max();
  size_t e = 0;
  bool valid = true;
#if defined(__SSE2__)
  __m128d all_valid = _mm_castsi128_pd(_mm_set1_epi32(-1));
  for (; e + 2 <= count; e += 2) {
    const __m128d value = _mm_loadu_pd(row + e);  // both comparisons are false for NaN
    all_valid = _mm_and_pd(all_valid, _mm_and_pd(_mm_cmpge_pd(value, _mm_setzero_pd()),
                                                 _mm_cmple_pd(value, _mm_set1_pd(kMax))));
    _mm_storel_pi(reinterpret_cast<__m64*>(weight + e), _mm_cvtpd_ps(value));  // round to nearest, as a cast
  }
  valid = _mm_movemask_pd(all_valid) == 3;
#endif
  for (; e < count; ++e) {
    valid &= (row[e] >= 0.0) & (row[e] <= kMax);
    weight[e] = static_cast<float>(row[e]);
  }
  return valid;
}

// (layer, node) packing problems interleaved per block: enough independent
// dependency chains to keep the core busy (measured: bench/deepseek.sh).
constexpr int kInterleavedProblems = 8;
}  // namespace

DeepSeekShape::DeepSeekShape(const Topology& topology) {
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
  block_layers = std::max(1, (kInterleavedProblems + nodes - 1) / nodes);
}

LayerBlock::LayerBlock(const DeepSeekShape& shape)
    : shape_(shape),
      node_of_mlog_(size_t(shape.experts)),
      weight_(size_t(shape.block_layers) * size_t(shape.experts)),
      node_weight_(weight_.size()),
      mlog2log_(weight_.size()),
      node_sorted_(weight_.size() + 1),  // + 1: BatchReplicator reads one key past a node's
      order_(size_t(shape.block_layers) * size_t(shape.slots)),
      phy2mlog_(order_.size()),
      replica_rank_(order_.size()),
      position_(order_.size()),
      count_(weight_.size()),
      group_load_(size_t(shape.groups)),
      group_position_(size_t(shape.groups)),
      group_keys_(size_t(shape.groups)),
      keys_(size_t(shape.experts)),
      spare_(size_t(shape.experts)) {
  for (int m = 0; m < shape.experts; ++m) node_of_mlog_[size_t(m)] = m / shape.experts_per_node;
  for (int b = 0; b < shape.block_layers; ++b)
    for (int node = 0; node < shape.nodes; ++node) {
      const size_t experts_at = node_offset(b, node, shape.experts_per_node);
      const size_t replicas_at = node_offset(b, node, shape.slots_per_node);
      replica_jobs_.push_back({node_sorted_.data() + experts_at, node_weight_.data() + experts_at,
                               phy2mlog_.data() + replicas_at, replica_rank_.data() + replicas_at,
                               count_.data() + experts_at, order_.data() + replicas_at});
      pack_jobs_.push_back({order_.data() + replicas_at, position_.data() + replicas_at});
    }
}

LayerBlock& LayerBlock::for_this_thread(const DeepSeekShape& shape) {
  thread_local std::unique_ptr<LayerBlock> kept;
  if (!kept || !(kept->shape() == shape)) kept = std::make_unique<LayerBlock>(shape);
  kept->saw_invalid_load_ = false;
  return *kept;
}

void LayerBlock::run(const double* load, int first, int count, const LayerOutput& out) {
  const size_t experts = size_t(shape_.experts), slots = size_t(shape_.slots);
  for (int b = 0; b < count; ++b) {
    saw_invalid_load_ |= !convert_loads(load + size_t(first + b) * experts, weight_.data() + size_t(b) * experts,
                                        experts);
    group_layer(b);
    sort_experts(b);
  }
  const int problems = count * shape_.nodes;
  replicator_.run(replica_jobs_.data(), problems, shape_.experts_per_node, shape_.slots_per_node);
  packer_.run(pack_jobs_.data(), problems, shape_.slots_per_node, shape_.ranks_per_node);
  for (int b = 0; b < count; ++b) {
    const size_t layer = size_t(first + b);
    write_layer(b, out.phy2log + layer * slots, out.phyrank + layer * slots, out.logcnt + layer * experts);
  }
}

// Step 1: group loads (float32, index order) packed onto nodes; mlog2log.
void LayerBlock::group_layer(int b) {
  const DeepSeekShape& s = shape_;
  int32_t* mlog2log = mlog2log_.data() + size_t(b) * size_t(s.experts);
  // One group per node (one group on one node included): the packing's
  // published special case puts group g on node g whatever the loads, so
  // mlog is the expert index and the group sums are not needed.
  if (s.groups == s.nodes) {
    std::iota(mlog2log, mlog2log + s.experts, 0);
    return;
  }
  // Each group's sum in index order (float32), all groups side by side so
  // their addition chains overlap.
  const float* weight = weight_.data() + size_t(b) * size_t(s.experts);
  float* group_load = group_load_.data();
  std::fill(group_load, group_load + s.groups, 0.0f);
  for (int j = 0; j < s.group_size; ++j)
    for (int g = 0; g < s.groups; ++g) group_load[g] = group_load[g] + weight[g * s.group_size + j];
  balanced_packing(group_load_.data(), s.groups, s.nodes, group_position_.data(), group_keys_, spare_, packer_);
  for (int g = 0; g < s.groups; ++g) {
    const int first_mlog = group_position_[size_t(g)] * s.group_size;
    for (int j = 0; j < s.group_size; ++j) mlog2log[first_mlog + j] = g * s.group_size + j;
  }
}

// Sorts the layer's experts by (weight desc, mlog asc) once, then splits the
// order by node (stable), turning mlog into the node-local index; integer
// loads take a shorter way to the same result.
void LayerBlock::sort_experts(int b) {
  const DeepSeekShape& s = shape_;
  const size_t first = size_t(b) * size_t(s.experts);
  const int32_t* mlog2log = mlog2log_.data() + first;
  const float* weight = weight_.data() + first;
  float* node_weight = node_weight_.data() + first;
  uint64_t* sorted = node_sorted_.data() + first;
  for (int m = 0; m < s.experts; ++m) node_weight[m] = weight[mlog2log[m]];
  if (sort_integer_weights(node_weight, node_of_mlog_.data(), s.experts, s.nodes, sorted, keys_, spare_)) return;
  uint64_t* keys = s.nodes == 1 ? sorted : keys_.data();
  for (int m = 0; m < s.experts; ++m) keys[m] = descending_key(node_weight[m], m);
  sort_keys(keys, s.experts, spare_);
  if (s.nodes == 1) return;
  split_by_node(keys, sorted);
}

// Stable split of the sorted keys by node (node-major, as mlog is), each
// key's index turned from mlog into the node-local index.
void LayerBlock::split_by_node(const uint64_t* keys, uint64_t* sorted) const {
  const DeepSeekShape& s = shape_;
  const int32_t* node_of_mlog = node_of_mlog_.data();
  if (s.nodes <= kMaxBuckets) {
    stable_bucket_pass(keys, sorted, s.experts, s.nodes,
                       [node_of_mlog](uint64_t key) { return node_of_mlog[index_of(key)]; });
  } else {
    std::vector<int> fill(size_t(s.nodes), 0);
    for (int k = 0; k < s.experts; ++k) {
      const int node = node_of_mlog[index_of(keys[k])];
      sorted[node * s.experts_per_node + fill[size_t(node)]++] = keys[k];
    }
  }
  for (int node = 1; node < s.nodes; ++node) {
    const int base = node * s.experts_per_node;
    for (int j = 0; j < s.experts_per_node; ++j) sorted[base + j] -= uint64_t(base);
  }
}

void LayerBlock::write_layer(int b, int32_t* phy2log, int32_t* phyrank, int32_t* logcnt) const {
  const DeepSeekShape& s = shape_;
  for (int node = 0; node < s.nodes; ++node) {
    const int32_t* node_experts = mlog2log_.data() + node_offset(b, node, s.experts_per_node);
    const size_t replicas_at = node_offset(b, node, s.slots_per_node);
    const int32_t* phy2mlog = phy2mlog_.data() + replicas_at;
    const int32_t* position = position_.data() + replicas_at;
    const int first_slot = node * s.slots_per_node;
    for (int p = 0; p < s.slots_per_node; ++p) {
      const int slot = first_slot + position[p];
      phy2log[slot] = node_experts[phy2mlog[p]];
      phyrank[slot] = replica_rank_[replicas_at + size_t(p)];
    }
    const int32_t* count = count_.data() + node_offset(b, node, s.experts_per_node);
    for (int j = 0; j < s.experts_per_node; ++j) logcnt[node_experts[j]] = count[j];
  }
}

}  // namespace eplb::deepseek_detail
