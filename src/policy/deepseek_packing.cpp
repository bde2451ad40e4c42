// deepseek_packing.cpp - balanced packing and replication with DeepSeek's tie
// rules: integer sort keys and a tournament tree over preallocated buffers.
#include "deepseek_packing.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace eplb::deepseek_detail {

namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// The bits of a float32 >= 0 order like the value itself (-0 counts as +0,
// as it compares equal to it). Loads are never negative or NaN.
inline uint32_t ordered_bits(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
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

// Sorts keys whose low 32 bits (the index) are already ascending by their
// high 32 bits: a stable LSD radix sort, one byte per pass, skipping bytes
// that every key shares. Same result as std::sort on the whole key.
void sort_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& spare) {
  const size_t n = keys.size();
  if (n < 64) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  uint32_t histogram[4][256] = {};
  for (uint64_t key : keys)
    for (int pass = 0; pass < 4; ++pass) ++histogram[pass][(key >> (32 + 8 * pass)) & 0xff];
  spare.resize(n);
  for (int pass = 0; pass < 4; ++pass) {
    uint32_t* counts = histogram[pass];
    const int shift = 32 + 8 * pass;
    if (counts[(keys[0] >> shift) & 0xff] == n) continue;  // one bucket: order unchanged
    uint32_t offset = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t count = counts[b];
      counts[b] = offset;
      offset += count;
    }
    for (uint64_t key : keys) spare[counts[(key >> shift) & 0xff]++] = key;
    keys.swap(spare);
  }
}

}  // namespace

void MinTree::reset(int size) {
  leaves_ = 1;
  while (leaves_ < size) leaves_ <<= 1;
  node_.assign(size_t(2 * leaves_), kNever);
}

void MinTree::build() {
  for (int i = leaves_ - 1; i >= 1; --i) node_[i] = std::min(node_[2 * i], node_[2 * i + 1]);
}

void MinTree::update(int leaf, uint64_t key) {
  // Carry the new minimum up in a register: each level reads only the
  // sibling, which does not depend on the stores just made.
  int i = leaves_ + leaf;
  node_[i] = key;
  uint64_t smallest = key;
  while (i > 1) {
    smallest = std::min(smallest, node_[i ^ 1]);
    i >>= 1;
    node_[i] = smallest;
  }
}

void PackingScratch::reserve(int max_items, int max_packs, int max_experts) {
  sort_keys.reserve(size_t(max_items));
  sort_spare.reserve(size_t(max_items));
  pack_items.reserve(size_t(max_packs));
  pack_load.reserve(size_t(max_packs));
  int leaves = 1;
  while (leaves < std::max(max_packs, max_experts)) leaves <<= 1;
  tree.reset(leaves);
}

void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* pack_of, int32_t* rank_in_pack,
                      PackingScratch& scratch) {
  const int per_pack = num_items / num_packs;
  if (per_pack == 1) {
    for (int i = 0; i < num_items; ++i) {
      pack_of[i] = i;
      rank_in_pack[i] = 0;
    }
    return;
  }

  // Descending weight, equal weights in index order (a stable sort).
  auto& keys = scratch.sort_keys;
  keys.resize(size_t(num_items));
  for (int i = 0; i < num_items; ++i) keys[i] = descending_key(weight[i], i);
  sort_keys(keys, scratch.sort_spare);

  auto& items = scratch.pack_items;
  auto& load = scratch.pack_load;
  items.assign(size_t(num_packs), 0);
  load.assign(size_t(num_packs), 0.0f);
  MinTree& tree = scratch.tree;
  tree.reset(num_packs);
  for (int p = 0; p < num_packs; ++p) tree.set(p, ascending_key(0.0f, p));
  tree.build();

  for (uint64_t key : keys) {
    const int32_t item = index_of(key);
    const int32_t pack = index_of(tree.min());  // lightest non-full pack, lowest index
    pack_of[item] = pack;
    rank_in_pack[item] = items[pack]++;
    if (items[pack] == per_pack) {
      tree.update(pack, kNever);  // full: never chosen again
    } else {
      load[pack] = load[pack] + weight[item];  // float32, in assignment order
      tree.update(pack, ascending_key(load[pack], pack));
    }
  }
}

void replicate_experts(const float* weight, int num_experts, int num_physical, int32_t* phy2expert,
                       int32_t* replica_rank, int32_t* count, PackingScratch& scratch) {
  for (int e = 0; e < num_experts; ++e) {
    phy2expert[e] = e;
    replica_rank[e] = 0;
    count[e] = 1;
  }
  if (num_physical == num_experts) return;

  MinTree& tree = scratch.tree;
  tree.reset(num_experts);
  for (int e = 0; e < num_experts; ++e) tree.set(e, descending_key(weight[e], e));  // weight / 1 is exact
  tree.build();
  for (int p = num_experts; p < num_physical; ++p) {
    const int32_t expert = index_of(tree.min());  // largest weight / count, lowest index
    phy2expert[p] = expert;
    replica_rank[p] = count[expert]++;
    tree.update(expert, descending_key(weight[expert] / static_cast<float>(count[expert]), expert));
  }
}

}  // namespace eplb::deepseek_detail
