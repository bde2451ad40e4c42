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
// A binary heap keyed by (value, index) finds the same item a linear scan
// with those tie rules finds, in O(log n) instead of O(n).
#pragma once

#include <cstdint>
#include <vector>

namespace eplb::deepseek_detail {

struct PackEntry {
  float load;
  int32_t pack;
};

struct ReplicaEntry {
  float per_replica;  // float32(weight / count)
  int32_t expert;
};

// Reusable buffers for one worker; sized once for the largest call.
struct PackingScratch {
  std::vector<int32_t> order;        // items sorted by descending weight
  std::vector<int32_t> pack_items;   // items already in each pack
  std::vector<PackEntry> pack_heap;  // non-full packs, lightest first
  std::vector<ReplicaEntry> replica_heap;

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
