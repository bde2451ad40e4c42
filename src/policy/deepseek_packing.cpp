// deepseek_packing.cpp - balanced packing and replication with DeepSeek's tie
// rules, using binary heaps over preallocated buffers.
#include "deepseek_packing.h"

#include <algorithm>

namespace eplb::deepseek_detail {

namespace {

// Moves heap[i] down until both children come after it. `before(a, b)` is a
// strict total order (ties are broken by index), so the top is unique and
// equals what a linear scan with the same rules would pick.
template <typename Entry, typename Before>
void sift_down(Entry* heap, int size, int i, Before before) {
  Entry item = heap[i];
  for (;;) {
    int child = 2 * i + 1;
    if (child >= size) break;
    if (child + 1 < size && before(heap[child + 1], heap[child])) ++child;
    if (!before(heap[child], item)) break;
    heap[i] = heap[child];
    i = child;
  }
  heap[i] = item;
}

// Lightest pack first; equal loads: lower pack index first.
inline bool lighter(const PackEntry& a, const PackEntry& b) {
  return a.load < b.load || (a.load == b.load && a.pack < b.pack);
}

// Largest load per replica first; equal: lower expert index first.
inline bool hotter(const ReplicaEntry& a, const ReplicaEntry& b) {
  return a.per_replica > b.per_replica || (a.per_replica == b.per_replica && a.expert < b.expert);
}

}  // namespace

void PackingScratch::reserve(int max_items, int max_packs, int max_experts) {
  order.reserve(size_t(max_items));
  pack_items.reserve(size_t(max_packs));
  pack_heap.reserve(size_t(max_packs));
  replica_heap.reserve(size_t(max_experts));
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

  // Descending weight, stable: a total order on (weight desc, index asc).
  auto& order = scratch.order;
  order.resize(size_t(num_items));
  for (int i = 0; i < num_items; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [weight](int32_t a, int32_t b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
  });

  // All packs start empty at load 0: in index order that is already a heap.
  auto& heap = scratch.pack_heap;
  heap.resize(size_t(num_packs));
  scratch.pack_items.assign(size_t(num_packs), 0);
  for (int p = 0; p < num_packs; ++p) heap[p] = PackEntry{0.0f, p};
  int heap_size = num_packs;

  for (int32_t item : order) {
    PackEntry& top = heap[0];
    const int32_t pack = top.pack;
    pack_of[item] = pack;
    rank_in_pack[item] = scratch.pack_items[pack]++;
    if (scratch.pack_items[pack] == per_pack) {
      heap[0] = heap[--heap_size];  // full: leaves the candidates
    } else {
      top.load = top.load + weight[item];  // float32, in assignment order
    }
    if (heap_size > 0) sift_down(heap.data(), heap_size, 0, lighter);
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

  auto& heap = scratch.replica_heap;
  heap.resize(size_t(num_experts));
  for (int e = 0; e < num_experts; ++e) heap[e] = ReplicaEntry{weight[e], e};  // weight / 1 is exact
  for (int i = num_experts / 2 - 1; i >= 0; --i) sift_down(heap.data(), num_experts, i, hotter);

  for (int p = num_experts; p < num_physical; ++p) {
    ReplicaEntry& top = heap[0];
    const int32_t expert = top.expert;
    phy2expert[p] = expert;
    replica_rank[p] = count[expert]++;
    top.per_replica = weight[expert] / static_cast<float>(count[expert]);
    sift_down(heap.data(), num_experts, 0, hotter);
  }
}

}  // namespace eplb::deepseek_detail
