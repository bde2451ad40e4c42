// deepseek_sglang_common.h - what SGLang's two DeepSeek variants
// (deepseek_vec and deepseek_torch, eplb/deepseek_vec.h) share (internal to
// src/policy/): one input check, the per-expert sums over steps, and the
// greedy packing of weights onto packs.
//
// Contract: check_input is the one refusal of both entry points (their
// messages differ only in the name they start with): InvalidArgument when
// tokens is not [S >= 1][L >= 1][E >= 1], the sizes pass the library's caps
// (kMaxExpertsPerLayer, kMaxSlotsPerLayer, kMaxTableEntries for L x R),
// R < E, R % local_slots != 0, hierarchical with E % groups, groups % nodes
// or ranks % nodes != 0, no values, or a value negative, not finite, or (Int)
// not an integer below 2^53. summed_over_steps and pack_heaviest_first
// compute exactly what each variant computed before they shared them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "deepseek_vec_chunk.h"
#include "eplb/deepseek_vec.h"
#include "eplb/status.h"

namespace eplb::deepseek_vec_detail {

// `who` starts every message ("deepseek_vec", "deepseek (torch order)").
Status check_input(std::string_view who, const double* tokens, const VecShape& shape, VecPrecision precision);

// Expert `at` (layer * E + e) summed over the window's steps, as T: exact
// (in double) for Int, torch's order in float32 for Float32 and in float64
// for Float64.
template <typename T>
T summed_over_steps(const double* tokens, const VecShape& s, size_t at, VecPrecision precision) {
  const size_t plane = size_t(s.layers) * size_t(s.experts);
  if (precision == VecPrecision::Float32)
    return T(cascade_sum<float>(s.steps, [&](int64_t t) { return float(tokens[size_t(t) * plane + at]); }));
  if (precision == VecPrecision::Float64)
    return T(cascade_sum<double>(s.steps, [&](int64_t t) { return tokens[size_t(t) * plane + at]; }));
  double sum = 0;  // integers below 2^53: exact, as torch's int64 sum
  for (int t = 0; t < s.steps; ++t) sum += tokens[size_t(t) * plane + at];
  return T(sum);
}

// Items heaviest first (torch's tie order), each into the lightest pack
// with room (pack loads summed in Sum, lowest index on ties); items / packs
// per pack. Returns pack * per_pack + the item's place in its pack, per item.
template <typename Sum>
std::vector<int32_t> pack_heaviest_first(const std::vector<float>& weight, int packs) {
  const int per_pack = int(weight.size()) / packs;
  std::vector<int32_t> position(weight.size());
  std::vector<Sum> load(size_t(packs), Sum(0));
  std::vector<int> filled(size_t(packs), 0);
  for (int item : torch_descending_order(weight)) {
    int best = -1;
    for (int p = 0; p < packs; ++p)
      if (filled[size_t(p)] < per_pack && (best < 0 || load[size_t(p)] < load[size_t(best)])) best = p;
    position[size_t(item)] = best * per_pack + filled[size_t(best)]++;
    load[size_t(best)] += Sum(weight[size_t(item)]);
  }
  return position;
}

// The groups' weights (float32 sums of their experts in index order).
std::vector<float> group_weights(const std::vector<float>& expert_weight, int groups);

// mlog2log [E] from each group's position (its place among the groups after
// packing): group g's experts go, in order, to its position's block.
void place_groups(const std::vector<int32_t>& group_position, int group_size, int32_t* mlog2log);

}  // namespace eplb::deepseek_vec_detail
