// deepseek_packing.h - the two greedy kernels of DeepSeek's EPLB algorithm,
// written over caller-owned buffers (internal to src/policy/).
//
// Both reproduce the published tie rules exactly, in float32:
// - balanced_packing: items in descending weight (equal: lower index first)
//   each go to the lightest pack that is not full (equal: lower pack index);
//   a pack's load is accumulated in float32 in assignment order. When every
//   pack takes exactly one item, item i goes to pack i.
// - replicate_experts: each redundant replica goes to the expert with the
//   largest float32(weight / count) (equal: lower expert index).
// Both orders are total orders on (float32 value, index). They are encoded
// as one 64-bit key (the float's bits are monotone for values >= 0), so a
// sort is a sort of integers and "the lightest non-full pack" / "the hottest
// expert" is the minimum of a tournament tree: the same item a linear scan
// with those tie rules finds, in O(log n) branch-free steps instead of O(n).
#pragma once

#include <cstdint>
#include <vector>

namespace eplb::deepseek_detail {

// A complete binary tree whose every inner node holds the minimum of its
// children; leaves beyond `size` hold the largest key (never chosen).
class MinTree {
 public:
  void reset(int size);  // every leaf at the largest key
  void set(int leaf, uint64_t key) { node_[leaves_ + leaf] = key; }
  void build();  // recompute every inner node after set()s
  void update(int leaf, uint64_t key);  // set one leaf and its path to the root
  uint64_t min() const { return node_[1]; }

 private:
  int leaves_ = 1;
  std::vector<uint64_t> node_;
};

// Reusable buffers for one worker; sized once for the largest call.
struct PackingScratch {
  std::vector<uint64_t> sort_keys;  // (descending weight, ascending index)
  std::vector<uint64_t> sort_spare;
  std::vector<int32_t> pack_items;  // items already in each pack
  std::vector<float> pack_load;     // float32 load of each pack
  MinTree tree;

  void reserve(int max_items, int max_packs, int max_experts);
};

// Packs `num_items` weights into `num_packs` packs of num_items / num_packs
// items each. Writes pack_of[i] and rank_in_pack[i] (the order in which the
// pack received its items). num_items must be a multiple of num_packs.
void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* pack_of, int32_t* rank_in_pack,
                      PackingScratch& scratch);

// Replicates `num_experts` experts into `num_physical` physical replicas.
// Physical replica p < num_experts is expert p (replica rank 0); replica
// p >= num_experts is the p-th redundant one, in the order they were given.
// Writes phy2expert[num_physical], replica_rank[num_physical] (0 for the
// first copy of an expert, k for its k-th extra copy) and count[num_experts].
void replicate_experts(const float* weight, int num_experts, int num_physical, int32_t* phy2expert,
                       int32_t* replica_rank, int32_t* count, PackingScratch& scratch);

}  // namespace eplb::deepseek_detail
