// deepseek_keys.h - the 64-bit keys, tournament trees and sorts that the
// kernels of the `deepseek` policy share (internal to src/policy/).
//
// DeepSeek's tie rules, in float32, are total orders on (value, index):
// larger (or smaller) value first, then lower index. Both are one 64-bit key
// whose high half is the float's bits (monotone for values >= 0; -0 counts
// as +0, which it equals) and whose low half is the index, so ordering is
// ordering integers, and "the lightest pack" / "the hottest expert" is the
// minimum of a tournament tree: a complete binary tree stored as
// node[1 .. 2 * leaves), each inner node the minimum of its children,
// unused leaves at kNever.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace eplb::deepseek_detail {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

inline uint32_t ordered_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return bits == 0x80000000u ? 0u : bits;
}
// Smaller key first: larger value, then lower index.
inline uint64_t descending_key(float value, int index) {
  return (uint64_t(~ordered_bits(value)) << 32) | uint32_t(index);
}
inline int32_t index_of(uint64_t key) { return int32_t(uint32_t(key)); }
// The value of a descending key (-0 comes back as +0: the same in a sum).
inline float value_of_descending(uint64_t key) { return std::bit_cast<float>(~uint32_t(key >> 32)); }

inline int leaves_for(int size) {
  int leaves = 1;
  while (leaves < size) leaves <<= 1;
  return leaves;
}

inline void build_tree(uint64_t* node, int leaves) {
  for (int i = leaves - 1; i >= 1; --i) node[i] = std::min(node[2 * i], node[2 * i + 1]);
}

// Sets one leaf and carries the new minimum up in a register: each level
// reads only the sibling, which does not depend on the stores just made.
// kLeaves > 0 fixes the depth at compile time (the loop unrolls).
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

// Calls f(std::integral_constant<int, L>{}) with L = leaves for the tree
// sizes kernels are compiled for (2 to 64), else with L = 0 (any size).
template <class F>
void dispatch_leaves(int leaves, F&& f) {
  switch (leaves) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    default: f(std::integral_constant<int, 0>{}); break;
  }
}

// Sorts keys whose low halves are already ascending by their high halves
// (equal high halves keep their order): the same result as std::sort on the
// whole keys. An LSD radix sort over the bits that differ between keys.
void sort_keys(uint64_t* keys, int count, std::vector<uint64_t>& spare);

// Sorts keys in any order (whole 64-bit keys), for short inputs:
// insertion up to 32 keys, std::sort beyond.
void sort_whole_keys(uint64_t* keys, int count);

// Sorts the experts of one layer, given in mlog order (node-major, E / N
// per node; node_of[m] is m's node), by (node, weight desc, mlog) and writes
// each node's run as descending_key(weight, node-local index), like
// sort_keys on descending_key(weight, mlog) followed by a stable split by
// node. Returns false (nothing written) unless every weight is an integer
// up to 2^24: integers order like their floats but take fewer bits, so the
// radix sort needs fewer passes and the node rides in the same passes.
bool sort_integer_weights(const float* weight, const int32_t* node_of, int experts, int nodes, uint64_t* sorted,
                          std::vector<uint64_t>& keys, std::vector<uint64_t>& spare);

}  // namespace eplb::deepseek_detail
