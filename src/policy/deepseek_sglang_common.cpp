// deepseek_sglang_common.cpp - the input check and group helpers SGLang's two
// DeepSeek variants share (deepseek_sglang_common.h).
#include "deepseek_sglang_common.h"

#include <fmt/format.h>

#include <cmath>

#include "eplb/placement.h"

namespace eplb::deepseek_vec_detail {

namespace {

// Sizes: non-empty, within the library's caps, and SGLang's asserts.
std::string shape_problem(const VecShape& s) {
  if (s.steps < 1 || s.layers < 1 || s.experts < 1)
    return fmt::format("tokens must be [steps >= 1][layers >= 1][experts >= 1], got [{}][{}][{}]", s.steps, s.layers,
                       s.experts);
  if (s.experts > kMaxExpertsPerLayer)
    return fmt::format("experts={} above the cap, at most {}", s.experts, kMaxExpertsPerLayer);
  if (s.slots > kMaxSlotsPerLayer)
    return fmt::format("num_physical_experts={} above the cap, at most {}", s.slots, kMaxSlotsPerLayer);
  if (int64_t(s.layers) * s.slots > kMaxTableEntries)
    return fmt::format("layers x num_physical_experts = {} above the cap, at most {}", int64_t(s.layers) * s.slots,
                       kMaxTableEntries);
  if (s.slots < s.experts) return fmt::format("num_physical_experts={} < experts={}", s.slots, s.experts);
  if (s.local_slots < 1 || s.slots % s.local_slots != 0)
    return fmt::format("num_physical_experts={} is not a multiple of num_local_physical_experts={}", s.slots,
                       s.local_slots);
  if (!s.hierarchical) return "";
  const int ranks = s.slots / s.local_slots;
  if (s.groups < 1 || s.nodes < 1 || s.experts % s.groups != 0 || s.groups % s.nodes != 0 || ranks % s.nodes != 0)
    return fmt::format("hierarchical needs experts % groups, groups % nodes and ranks % nodes all 0, got {} experts, "
                       "{} groups, {} nodes, {} ranks",
                       s.experts, s.groups, s.nodes, ranks);
  return "";
}

std::string value_problem(const double* tokens, size_t count, VecPrecision precision) {
  if (tokens == nullptr) return "tokens has no values";
  for (size_t i = 0; i < count; ++i) {
    const double v = tokens[i];
    if (!(v >= 0.0) || !std::isfinite(v)) return fmt::format("token count {} is negative, infinite or NaN ({})", i, v);
    if (precision == VecPrecision::Int && (v != std::floor(v) || v > 9007199254740992.0))
      return fmt::format("token count {} is not an integer below 2^53 ({})", i, v);
  }
  return "";
}

}  // namespace

Status check_input(std::string_view who, const double* tokens, const VecShape& shape, VecPrecision precision) {
  std::string problem = shape_problem(shape);
  if (problem.empty())
    problem = value_problem(tokens, size_t(shape.steps) * size_t(shape.layers) * size_t(shape.experts), precision);
  if (problem.empty()) return Status::ok();
  return error(Code::InvalidArgument, fmt::format("{}: {}", who, problem));
}

std::vector<float> group_weights(const std::vector<float>& expert_weight, int groups) {
  const int group_size = int(expert_weight.size()) / groups;
  std::vector<float> group(size_t(groups), 0.0f);
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < group_size; ++j) group[size_t(g)] += expert_weight[size_t(g * group_size + j)];
  return group;
}

void place_groups(const std::vector<int32_t>& group_position, int group_size, int32_t* mlog2log) {
  for (size_t g = 0; g < group_position.size(); ++g)
    for (int j = 0; j < group_size; ++j)
      mlog2log[size_t(group_position[g]) * size_t(group_size) + size_t(j)] = int32_t(g) * group_size + j;
}

}  // namespace eplb::deepseek_vec_detail
