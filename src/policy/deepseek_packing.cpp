// deepseek_packing.cpp - sorting, packing and replication with DeepSeek's tie
// rules: integer keys and tournament trees over reused buffers.
#include "deepseek_packing.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "bucket_pass.h"

namespace eplb::deepseek_detail {

namespace {

// Insertion sort: fewest instructions for a handful of keys.
void insertion_sort(uint64_t* keys, int count) {
  for (int i = 1; i < count; ++i) {
    const uint64_t key = keys[i];
    int j = i;
    for (; j > 0 && keys[j - 1] > key; --j) keys[j] = keys[j - 1];
    keys[j] = key;
  }
}

// Merges two ascending runs of distinct keys; the choice is a conditional
// move, not a branch (the runs interleave unpredictably).
void merge_keys(const uint64_t* a, int a_count, const uint64_t* b, int b_count, uint64_t* out) {
  int i = 0, j = 0, k = 0;
  while (i < a_count && j < b_count) {
    const bool take_a = a[i] < b[j];
    out[k++] = take_a ? a[i] : b[j];
    i += take_a;
    j += !take_a;
  }
  while (i < a_count) out[k++] = a[i++];
  while (j < b_count) out[k++] = b[j++];
}

// Full-key sort without the precondition of sort_keys.
void sort_any_keys(uint64_t* keys, int count) {
  if (count <= 32)
    insertion_sort(keys, count);
  else
    std::sort(keys, keys + count);
}

// Sets one leaf of a tree stored as node[1 .. 2 * leaves) and carries the new
// minimum up in a register: each level reads only the sibling, which does
// not depend on the stores just made.
inline void update_tree(uint64_t* node, int leaves, int leaf, uint64_t key) {
  int i = leaves + leaf;
  node[i] = key;
  uint64_t smallest = key;
  while (i > 1) {
    smallest = std::min(smallest, node[i ^ 1]);
    i >>= 1;
    node[i] = smallest;
  }
}

// The same with the depth known at compile time when kLeaves > 0.
template <int kLeaves>
inline void update_path(uint64_t* node, int leaves, int leaf, uint64_t key) {
  const int depth = std::countr_zero(unsigned(kLeaves > 0 ? kLeaves : leaves));
  size_t i = size_t(leaves) + size_t(uint32_t(leaf));
  node[i] = key;
  uint64_t smallest = key;
  for (int level = 0; level < depth; ++level) {
    smallest = std::min(smallest, node[i ^ 1]);
    i >>= 1;
    node[i] = smallest;
  }
}

inline void build_tree(uint64_t* node, int leaves) {
  for (int i = leaves - 1; i >= 1; --i) node[i] = std::min(node[2 * i], node[2 * i + 1]);
}

int leaves_for(int size) {
  int leaves = 1;
  while (leaves < size) leaves <<= 1;
  return leaves;
}

}  // namespace

void sort_keys(uint64_t* keys, int count, std::vector<uint64_t>& spare) {
  if (count <= 32) {
    insertion_sort(keys, count);
    return;
  }
  // An LSD radix sort over only the bits of the value that differ between
  // keys: loads of one layer share most of their exponent bits, and integer
  // loads leave the low mantissa bits alike.
  uint32_t all_and = ~0u, all_or = 0;
  for (int i = 0; i < count; ++i) {
    all_and &= uint32_t(keys[i] >> 32);
    all_or |= uint32_t(keys[i] >> 32);
  }
  const uint32_t varying = all_and ^ all_or;
  if (varying == 0) return;  // one value: already in index order
  const int lowest = std::countr_zero(varying);
  const int span = 32 - std::countl_zero(varying) - lowest;
  const int passes = (span + 7) / 8;
  const int bits = (span + passes - 1) / passes;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  spare.resize(size_t(count));
  uint64_t* from = keys;
  uint64_t* to = spare.data();
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = 32 + lowest + pass * bits;
    stable_bucket_pass(from, to, count, int(mask) + 1, [=](uint64_t key) { return (key >> shift) & mask; });
    std::swap(from, to);
  }
  if (from != keys) std::memcpy(keys, from, sizeof(uint64_t) * size_t(count));
}

void MinTree::reset(int size) {
  leaves_ = leaves_for(size);
  node_.assign(size_t(2 * leaves_), kNever);
}

void MinTree::build() { build_tree(node_.data(), leaves_); }

void MinTree::update(int leaf, uint64_t key) { update_tree(node_.data(), leaves_, leaf, key); }

namespace {

// One greedy step of every job per round: the jobs' dependency chains
// (find the lightest pack, add to it, update its tree) overlap. kLeaves > 0
// fixes the tree size at compile time so the path update is unrolled.
template <int kLeaves>
void pack_interleaved(const BatchPacker::State* states, int num_jobs, int first_step, int num_items, int per_pack,
                      int run_leaves) {
  const int leaves = kLeaves > 0 ? kLeaves : run_leaves;
  for (int step = first_step; step < num_items; ++step)
    for (int b = 0; b < num_jobs; ++b) {  // independent chains, interleaved
      const BatchPacker::State st = states[b];
      const uint64_t key = st.items[step];
      const uint32_t pack = uint32_t(st.tree[1]);  // lightest non-full pack, lowest index
      const int32_t rank = st.filled[pack]++;
      st.position[uint32_t(key)] = int32_t(pack) * per_pack + rank;
      uint64_t next = kNever;  // full: never chosen again
      if (rank + 1 < per_pack) {
        const float sum = st.load[pack] + value_of_descending(key);  // float32, in assignment order
        st.load[pack] = sum;
        next = (uint64_t(std::bit_cast<uint32_t>(sum)) << 32) | pack;  // a sum from +0 is never -0
      }
      update_path<kLeaves>(st.tree, leaves, int(pack), next);
    }
}

}  // namespace

// Sets up every job's state. When the first num_packs - 1 items of every
// job weigh more than 0, item k < num_packs goes to pack k (all packs are
// empty and the lowest index wins; each item then makes its pack heavier
// than the empty ones): those steps are taken here, and the returned first
// step of the greedy loop skips them.
int BatchPacker::start_jobs(const Job* jobs, int num_jobs, int num_packs, int per_pack, int leaves) {
  bool positive = num_packs >= 2;
  for (int b = 0; b < num_jobs && positive; ++b) positive = value_of_descending(jobs[b].items[num_packs - 2]) > 0.0f;
  tree_.assign(size_t(2 * leaves) * size_t(num_jobs), kNever);
  load_.assign(size_t(leaves) * size_t(num_jobs), 0.0f);
  filled_.assign(size_t(leaves) * size_t(num_jobs), 0);
  states_.resize(size_t(num_jobs));
  for (int b = 0; b < num_jobs; ++b) {
    State& st = states_[size_t(b)];
    st = {jobs[b].items, jobs[b].position, tree_.data() + size_t(2 * leaves) * size_t(b),
          load_.data() + size_t(leaves) * size_t(b), filled_.data() + size_t(leaves) * size_t(b)};
    for (int p = 0; p < num_packs; ++p) {
      if (positive) {
        st.position[index_of(st.items[p])] = p * per_pack;
        st.load[p] = value_of_descending(st.items[p]);
        st.filled[p] = 1;
      }
      st.tree[leaves + p] = ascending_key(st.load[p], p);
    }
    build_tree(st.tree, leaves);
  }
  return positive ? num_packs : 0;
}

void BatchPacker::run(const Job* jobs, int num_jobs, int num_items, int num_packs) {
  const int per_pack = num_items / num_packs;
  if (per_pack == 1) {  // the published special case: item i to pack i
    for (int b = 0; b < num_jobs; ++b)
      for (int i = 0; i < num_items; ++i) jobs[b].position[i] = i;
    return;
  }
  const int leaves = leaves_for(num_packs);
  const int first_step = start_jobs(jobs, num_jobs, num_packs, per_pack, leaves);
  auto* kernel = &pack_interleaved<0>;
  switch (leaves) {
    case 2: kernel = &pack_interleaved<2>; break;
    case 4: kernel = &pack_interleaved<4>; break;
    case 8: kernel = &pack_interleaved<8>; break;
    case 16: kernel = &pack_interleaved<16>; break;
    case 32: kernel = &pack_interleaved<32>; break;
    case 64: kernel = &pack_interleaved<64>; break;
  }
  kernel(states_.data(), num_jobs, first_step, num_items, per_pack, leaves);
}

void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* position,
                      std::vector<uint64_t>& keys, std::vector<uint64_t>& spare, BatchPacker& packer) {
  keys.resize(size_t(num_items));
  for (int i = 0; i < num_items; ++i) keys[size_t(i)] = descending_key(weight[i], i);
  sort_keys(keys.data(), num_items, spare);
  const BatchPacker::Job job{keys.data(), position};
  packer.run(&job, 1, num_items, num_packs);
}

// Greedy replication. The experts that receive redundant replicas are always
// a prefix of `sorted`: an expert is first chosen when its weight is the
// largest (value, index) key, so every expert ahead of it in `sorted` was
// chosen before. The hottest expert is therefore the better of the head of
// the unreplicated suffix and the minimum of a tree over the prefix.
// Returns the length of that prefix.
int Replicator::add_replicas(const uint64_t* sorted, const float* weight, int num_experts, int num_physical,
                             int32_t* phy2expert, int32_t* replica_rank, int32_t* count) {
  for (int j = 0; j < num_experts; ++j) {
    phy2expert[j] = j;
    replica_rank[j] = 0;
    count[j] = 1;
  }
  const int extras = num_physical - num_experts;
  if (extras == 0) return 0;
  hottest.reset(std::min(num_experts, extras));
  leaf_of.resize(size_t(num_experts));
  int prefix = 0;
  for (int p = num_experts; p < num_physical; ++p) {
    const uint64_t head = prefix < num_experts ? sorted[prefix] : kNever;
    int32_t expert;
    if (head < hottest.min()) {
      expert = index_of(head);
      leaf_of[size_t(expert)] = prefix++;
    } else {
      expert = index_of(hottest.min());
    }
    phy2expert[p] = expert;
    replica_rank[p] = count[expert]++;
    hottest.update(leaf_of[size_t(expert)], descending_key(weight[expert] / static_cast<float>(count[expert]), expert));
  }
  return prefix;
}

void Replicator::run(const uint64_t* sorted, const float* weight, int num_experts, int num_physical,
                     int32_t* phy2expert, int32_t* replica_rank, int32_t* count, uint64_t* packing_order) {
  const int prefix = add_replicas(sorted, weight, num_experts, num_physical, phy2expert, replica_rank, count);
  // Every replica of a replicated expert carries float32(weight / count);
  // the unreplicated suffix keeps its keys (weight / 1 is exact, replica
  // index == expert index). Sort the first, then merge the two.
  replicated.clear();
  for (int k = 0; k < prefix; ++k) {
    const int32_t expert = index_of(sorted[k]);
    replicated.push_back(descending_key(weight[expert] / static_cast<float>(count[expert]), expert));
  }
  for (int p = num_experts; p < num_physical; ++p) {
    const int32_t expert = phy2expert[p];
    replicated.push_back(descending_key(weight[expert] / static_cast<float>(count[expert]), p));
  }
  sort_any_keys(replicated.data(), int(replicated.size()));
  merge_keys(replicated.data(), int(replicated.size()), sorted + prefix, num_experts - prefix, packing_order);
}

}  // namespace eplb::deepseek_detail
