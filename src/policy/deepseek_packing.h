// deepseek_packing.h - the greedy kernels of DeepSeek's EPLB algorithm over
// caller-owned buffers (internal to src/policy/).
//
// The published tie rules, in float32, are total orders on (value, index):
// - packing: items in descending weight (equal: lower index first) each go
//   to the lightest pack that is not full (equal: lower pack index); a
//   pack's load is accumulated in float32 in assignment order. When every
//   pack takes exactly one item, item i goes to pack i.
// - replication: each redundant replica goes to the expert with the largest
//   float32(weight / count) (equal: lower expert index).
// Both are encoded as one 64-bit key (a float's bits are monotone for values
// >= 0), so sorting is sorting integers and "the lightest non-full pack" /
// "the hottest expert" is the minimum of a tournament tree: the same item a
// linear scan with those tie rules finds, in O(log n) steps.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace eplb::deepseek_detail {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// The bits of a float32 >= 0 order like the value (-0 counts as +0, which
// it equals). Loads are never negative or NaN.
inline uint32_t ordered_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return bits == 0x80000000u ? 0u : bits;
}
// Smaller key first: smaller value, then lower index.
inline uint64_t ascending_key(float value, int index) {
  return (uint64_t(ordered_bits(value)) << 32) | uint32_t(index);
}
// Smaller key first: larger value, then lower index.
inline uint64_t descending_key(float value, int index) {
  return (uint64_t(~ordered_bits(value)) << 32) | uint32_t(index);
}
inline int32_t index_of(uint64_t key) { return int32_t(uint32_t(key)); }
// The value of a descending key (-0 comes back as +0: the same in a sum).
inline float value_of_descending(uint64_t key) { return std::bit_cast<float>(~uint32_t(key >> 32)); }

// Sorts keys whose low 32 bits are already ascending by their high 32 bits
// (equal high bits keep their order): the same result as std::sort on the
// whole keys. Insertion sort for a few keys, else an LSD radix sort.
void sort_keys(uint64_t* keys, int count, std::vector<uint64_t>& spare);

// A complete binary tree whose every inner node holds the minimum of its
// children; leaves beyond `size` hold kNever (never chosen).
class MinTree {
 public:
  void reset(int size);  // every leaf at kNever
  void set(int leaf, uint64_t key) { node_[size_t(leaves_ + leaf)] = key; }
  void build();                         // every inner node after set()s
  void update(int leaf, uint64_t key);  // one leaf and its path to the root
  uint64_t min() const { return node_[1]; }

 private:
  int leaves_ = 1;
  std::vector<uint64_t> node_;
};

// Packs a batch of independent problems of one shape (num_items items into
// num_packs packs of num_items / num_packs), advancing all of them one item
// per step so that their dependency chains overlap.
class BatchPacker {
 public:
  struct Job {
    const uint64_t* items;  // descending keys (value, item index), already in packing order
    int32_t* position;      // [num_items], by item index: pack * (num_items / num_packs) + the
                            // order in which the pack received the item
  };
  void run(const Job* jobs, int num_jobs, int num_items, int num_packs);

  // One job's state as the interleaved loop reads it.
  struct State {
    const uint64_t* items;
    int32_t* position;
    uint64_t* tree;
    float* load;
    int32_t* filled;
  };

 private:
  int start_jobs(const Job* jobs, int num_jobs, int num_packs, int per_pack, int leaves);

  std::vector<uint64_t> tree_;   // per job: a tournament tree over its packs
  std::vector<float> load_;      // per job and pack
  std::vector<int32_t> filled_;  // per job and pack
  std::vector<State> states_;
};

// Packs weight[0..n) (any order) with the rules above, for small inputs
// (the groups of a layer); writes position[n] as a Job does. Uses keys as scratch.
void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* position,
                      std::vector<uint64_t>& keys, std::vector<uint64_t>& spare, BatchPacker& packer);

// Replicates num_experts experts into num_physical physical replicas.
// `sorted` holds descending_key(weight[j], j) of every expert in ascending
// key order. Replica p < num_experts is expert p (replica rank 0); replica
// p >= num_experts is the p-th redundant one. Writes phy2expert, replica_rank
// ([num_physical]), count ([num_experts]) and packing_order: the descending
// keys (float32(weight / count), replica index) of all replicas, sorted,
// ready for BatchPacker.
struct Replicator {
  MinTree hottest;                // over the experts replicated so far
  std::vector<int32_t> leaf_of;   // expert -> its leaf of `hottest`
  std::vector<uint64_t> replicated;  // keys of the replicated experts' replicas

  void run(const uint64_t* sorted, const float* weight, int num_experts, int num_physical, int32_t* phy2expert,
           int32_t* replica_rank, int32_t* count, uint64_t* packing_order);

 private:
  int add_replicas(const uint64_t* sorted, const float* weight, int num_experts, int num_physical,
                   int32_t* phy2expert, int32_t* replica_rank, int32_t* count);
};

}  // namespace eplb::deepseek_detail
