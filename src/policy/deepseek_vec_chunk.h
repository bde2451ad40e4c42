// deepseek_vec_chunk.h - one chunk of SGLang's deepseek_vec (internal to
// src/policy/): a layer's n experts (all of them, or one node's) replicated
// onto the chunk's slots, then dealt to its ranks.
//
// Per extra replica i (slot n + i), in precision T (float, or double for
// float64 loads), for each step s and expert j:
//   score[s][j] = (tokens[s][j] + T(float(global index) * 1e-4f)) / count[j]
//   the step's hottest expert j*_s (first of equal maxima) and, were it
//   replicated, the step's new maximum: max(second, tokens[s][j*] / (count + 1));
//   total[j] = sum over steps of (j == j*_s ? that new maximum : the maximum)
// and the expert with the smallest total (lowest index on ties) is replicated.
// With more than one slot per rank, replicas are sorted by step-summed load
// per replica (descending, torch's tie order) and dealt to ranks in a snake.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>
#include <vector>

#include "eplb/deepseek_vec.h"

namespace eplb::deepseek_vec_detail {

// A sum over rows in torch's CPU order for a reduction over an outer
// dimension (multi_row_sum): rows summed in blocks of 2^p (p = max(4,
// ceil(log2 n) / 4)) into level 0, each full block cascaded into levels
// 1 .. 3, and the levels added at the end.
template <typename T, typename Get>
T cascade_sum(int64_t n, Get get) {
  constexpr int kLevels = 4;
  const int ceil_log2 = n <= 2 ? 1 : int(std::bit_width(uint64_t(n - 1)));
  const int power = ceil_log2 / kLevels > 4 ? ceil_log2 / kLevels : 4;
  const int64_t step = int64_t(1) << power, mask = step - 1;
  T acc[kLevels] = {T(0), T(0), T(0), T(0)};
  int64_t i = 0;
  while (i + step <= n) {
    for (int64_t j = 0; j < step; ++j, ++i) acc[0] += get(i);
    for (int level = 1; level < kLevels; ++level) {
      acc[level] += acc[level - 1];
      acc[level - 1] = T(0);
      if ((i & (mask << (level * power))) != 0) break;
    }
  }
  for (; i < n; ++i) acc[0] += get(i);
  for (int level = 1; level < kLevels; ++level) acc[0] += acc[level];
  return acc[0];
}

// The indices of `values` in descending order with torch's CPU tie order:
// torch.sort(descending=True) without stable=True is std::sort on (value,
// index) pairs comparing values only (libstdc++'s introsort, as torch's
// wheels are built with), so equal values come out in that algorithm's order.
template <typename T>
std::vector<int32_t> torch_descending_order(const std::vector<T>& values) {
  std::vector<std::pair<T, int64_t>> pairs(values.size());
  for (size_t i = 0; i < values.size(); ++i) pairs[i] = {values[i], int64_t(i)};
  std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int32_t> order(values.size());
  for (size_t i = 0; i < values.size(); ++i) order[i] = int32_t(pairs[i].second);
  return order;
}

template <typename T>
struct ChunkJob {
  int steps = 0, n = 0, slots = 0, width = 0;
  std::vector<T> tokens;     // [S][n] as T
  std::vector<T> offset;     // [n]
  std::vector<T> step_sum;   // [n] the load summed over steps (for the ranks' snake)
  // Results (chunk-local): phy2local [slots] (expert j of the chunk),
  // count [n], replica_slot [n][width] (the slot of replica k, -1 beyond count).
  std::vector<int32_t> phy2local, count, replica_slot;
  // Scratch.
  std::vector<T> score, best, after;
  std::vector<int32_t> top;
  std::vector<char> is_top;

  // Reads the chunk's experts `experts[0 .. n)` (logical indices into the
  // layer's rows; `first_index` + j is expert j's index for its offset).
  void load(const double* all, const VecShape& shape, int layer, const int32_t* experts, int first_index, int n_,
            int slots_, VecPrecision precision);
};

template <typename T>
void run_chunk(ChunkJob<T>& job, int local_slots);

}  // namespace eplb::deepseek_vec_detail
