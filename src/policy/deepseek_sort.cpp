// deepseek_sort.cpp - sorting and merging the keys of deepseek_keys.h.
#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "bucket_pass.h"
#include "deepseek_keys.h"

namespace eplb::deepseek_detail {

namespace {

void insertion_sort(uint64_t* keys, int count) {
  for (int i = 1; i < count; ++i) {
    const uint64_t key = keys[i];
    int j = i;
    for (; j > 0 && keys[j - 1] > key; --j) keys[j] = keys[j - 1];
    keys[j] = key;
  }
}

// Inputs up to this long are insertion-sorted.
constexpr int kShortKeys = 32;
// Inputs this long count with kStreams runs (see bucket_pass.h).
constexpr int kManyKeys = 128;

// The number of passes over `span` bits that costs least, by a model of
// one pass: its counters (set up and summed, per run) plus reading and
// writing every key, about three steps per key.
int cheapest_passes(int count, int span, int streams) {
  int best = (span + 7) / 8;
  int64_t best_cost = -1;
  for (int passes = best; passes <= span; ++passes) {
    const int bits = (span + passes - 1) / passes;
    const int64_t cost = int64_t(passes) * ((int64_t(1) << bits) * (streams > 1 ? 4 : 1) + 3 * int64_t(count));
    if (best_cost < 0 || cost < best_cost) best = passes, best_cost = cost;
  }
  return best;
}

// LSD radix passes over the `span` bits of the keys' high halves above
// bit `lowest`; the result lands back in keys.
template <int S>
void radix_passes(uint64_t* keys, uint64_t* spare, int count, int lowest, int span) {
  const int passes = cheapest_passes(count, span, S);
  const int bits = (span + passes - 1) / passes;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  uint64_t* from = keys;
  uint64_t* to = spare;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = 32 + lowest + pass * bits;
    stable_bucket_pass<S>(from, to, count, int(mask) + 1, [=](uint64_t key) { return (key >> shift) & mask; });
    std::swap(from, to);
  }
  if (from != keys) std::memcpy(keys, from, sizeof(uint64_t) * size_t(count));
}

}  // namespace

void sort_whole_keys(uint64_t* keys, int count) {
  if (count <= kShortKeys) insertion_sort(keys, count);
  else std::sort(keys, keys + count);
}

void sort_keys(uint64_t* keys, int count, std::vector<uint64_t>& spare) {
  if (count <= kShortKeys) {
    insertion_sort(keys, count);
    return;
  }
  // Only the bits of the value that differ between keys need sorting:
  // loads of one layer share most of their exponent bits, and integer
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
  spare.resize(size_t(count));
  if (count >= kManyKeys) radix_passes<kStreams>(keys, spare.data(), count, lowest, span);
  else radix_passes<1>(keys, spare.data(), count, lowest, span);
}

namespace {

// True when every weight is an integer in [0, 2^24] (exact in float32, so
// integers order as the floats do); sets the largest. Branch-free, and the
// maximum is taken over the floats' bit patterns as int32 (ordered like
// the floats for values >= +0; negative ones never win over the initial
// +0), so it vectorizes: a float maximum would not, as NaN makes it
// order-dependent.
bool integer_weights(const float* weight, int count, uint32_t& largest) {
  uint32_t fractional = 0;
  int32_t top = 0;
  for (int i = 0; i < count; ++i) {
    const float clamped = std::min(weight[i], 16777216.0f);  // larger: fails the test below
    fractional |= uint32_t(float(int32_t(clamped)) != weight[i]);
    top = std::max(top, std::bit_cast<int32_t>(clamped));
  }
  if (fractional != 0) return false;
  largest = uint32_t(std::bit_cast<float>(top));
  return true;
}

}  // namespace

bool sort_integer_weights(const float* weight, const int32_t* node_of, int experts, int nodes, uint64_t* sorted,
                          std::vector<uint64_t>& keys, std::vector<uint64_t>& spare) {
  uint32_t largest = 0;
  if (!integer_weights(weight, experts, largest)) return false;
  const int width = std::max(1, int(std::bit_width(largest)));
  if (width + int(std::bit_width(unsigned(nodes - 1))) > 32) return false;
  keys.resize(size_t(experts));
  for (int m = 0; m < experts; ++m) {
    const uint32_t order = (uint32_t(node_of[m]) << width) | (largest - uint32_t(int32_t(weight[m])));
    keys[size_t(m)] = (uint64_t(order) << 32) | uint32_t(m);
  }
  sort_keys(keys.data(), experts, spare);
  const int per_node = experts / nodes;
  for (int node = 0, k = 0; node < nodes; ++node)
    for (int j = 0; j < per_node; ++j, ++k) {
      const int32_t m = index_of(keys[size_t(k)]);
      sorted[k] = descending_key(weight[m], m - node * per_node);
    }
  return true;
}

}  // namespace eplb::deepseek_detail
