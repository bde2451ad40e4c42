// deepseek_torch.cpp - DeepSeek's algorithm with torch's tie order, as SGLang
// runs it (eplb/deepseek_vec.h, deepseek_torch).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deepseek_vec_chunk.h"
#include "eplb/deepseek_vec.h"

namespace eplb {

namespace {

using deepseek_vec_detail::cascade_sum;
using deepseek_vec_detail::torch_descending_order;

Status invalid(const std::string& what) { return error(Code::InvalidArgument, "deepseek (torch order): " + what); }

Status check(const double* tokens, const VecShape& s, int groups, int nodes, VecPrecision precision) {
  if (s.steps < 1 || s.layers < 1 || s.experts < 1) return invalid("tokens must be [steps][layers][experts], non-empty");
  if (s.slots < s.experts || s.local_slots < 1 || s.slots % s.local_slots != 0)
    return invalid("num_physical_experts=" + std::to_string(s.slots) + " must be >= experts=" +
                   std::to_string(s.experts) + " and a multiple of " + std::to_string(s.local_slots) + " per rank");
  const int ranks = s.slots / s.local_slots;
  if (groups < 1 || nodes < 1 || s.experts % groups != 0 || groups % nodes != 0 || ranks % nodes != 0)
    return invalid("needs experts % groups, groups % nodes and ranks % nodes all 0, got " + std::to_string(s.experts) +
                   " experts, " + std::to_string(groups) + " groups, " + std::to_string(nodes) + " nodes, " +
                   std::to_string(ranks) + " ranks");
  const size_t count = size_t(s.steps) * size_t(s.layers) * size_t(s.experts);
  for (size_t i = 0; i < count; ++i)
    if (!(tokens[i] >= 0.0) || !std::isfinite(tokens[i]) ||
        (precision == VecPrecision::Int && tokens[i] != std::floor(tokens[i])))
      return invalid("token count " + std::to_string(i) + " is negative, non-finite or not an integer (" +
                     std::to_string(tokens[i]) + ")");
  return Status::ok();
}

// weight = tokens.sum(0).float(): exact for Int, torch's order in the dtype otherwise.
float summed_weight(const double* tokens, const VecShape& s, size_t at, VecPrecision precision) {
  const size_t plane = size_t(s.layers) * size_t(s.experts);
  if (precision == VecPrecision::Float32)
    return cascade_sum<float>(s.steps, [&](int64_t t) { return float(tokens[size_t(t) * plane + at]); });
  if (precision == VecPrecision::Float64)
    return float(cascade_sum<double>(s.steps, [&](int64_t t) { return tokens[size_t(t) * plane + at]; }));
  double sum = 0;
  for (int t = 0; t < s.steps; ++t) sum += tokens[size_t(t) * plane + at];
  return float(sum);
}

// balanced_packing: items heaviest first (torch's tie order), each into the
// lightest pack with room (float64 sums, lowest index on ties); one item per
// pack is the identity. Writes pack * per_pack + rank in pack per item.
void balanced_packing(const std::vector<float>& weight, int packs, std::vector<int32_t>& position) {
  const int items = int(weight.size()), per_pack = items / packs;
  position.resize(size_t(items));
  if (per_pack == 1) {
    std::iota(position.begin(), position.end(), 0);
    return;
  }
  std::vector<double> load(static_cast<size_t>(packs), 0.0);
  std::vector<int> filled(static_cast<size_t>(packs), 0);
  for (int item : torch_descending_order(weight)) {
    int best = -1;
    for (int p = 0; p < packs; ++p)
      if (filled[size_t(p)] < per_pack && (best < 0 || load[size_t(p)] < load[size_t(best)])) best = p;
    position[size_t(item)] = best * per_pack + filled[size_t(best)]++;
    load[size_t(best)] += double(weight[size_t(item)]);
  }
}

struct Layer {
  int32_t *phy2log, *phyrank, *logcnt;
};

// One node's experts (weights w, mlog order) replicated onto `slots` and
// packed onto `ranks`; writes the node's slots of the layer.
void run_node(const std::vector<float>& w, int slots, int ranks, const int32_t* mlog2log, int first_slot, Layer out) {
  const int n = int(w.size());
  std::vector<int32_t> phy2mlog(static_cast<size_t>(slots)), rank(static_cast<size_t>(slots), 0), count(static_cast<size_t>(n), 1);
  std::iota(phy2mlog.begin(), phy2mlog.begin() + n, 0);
  for (int i = n; i < slots; ++i) {
    int best = 0;
    for (int j = 1; j < n; ++j)
      if (w[size_t(j)] / float(count[size_t(j)]) > w[size_t(best)] / float(count[size_t(best)])) best = j;
    phy2mlog[size_t(i)] = best;
    rank[size_t(i)] = count[size_t(best)]++;
  }
  std::vector<float> per_replica(static_cast<size_t>(slots));
  for (int i = 0; i < slots; ++i)
    per_replica[size_t(i)] = w[size_t(phy2mlog[size_t(i)])] / float(count[size_t(phy2mlog[size_t(i)])]);
  std::vector<int32_t> position;
  balanced_packing(per_replica, ranks, position);
  for (int i = 0; i < slots; ++i) {
    const int slot = first_slot + position[size_t(i)];
    out.phy2log[slot] = mlog2log[phy2mlog[size_t(i)]];
    out.phyrank[slot] = rank[size_t(i)];
  }
  for (int j = 0; j < n; ++j) out.logcnt[mlog2log[j]] = count[size_t(j)];
}

void run_layer(const double* tokens, const VecShape& s, int groups, int nodes, VecPrecision precision, int layer,
               Layer out) {
  const int group_size = s.experts / groups, per_node = s.experts / nodes;
  std::vector<float> weight(size_t(s.experts)), group(size_t(groups), 0.0f);
  for (int e = 0; e < s.experts; ++e)
    weight[size_t(e)] = summed_weight(tokens, s, size_t(layer) * size_t(s.experts) + size_t(e), precision);
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < group_size; ++j) group[size_t(g)] += weight[size_t(g * group_size + j)];
  std::vector<int32_t> group_position, mlog2log(size_t(s.experts));
  balanced_packing(group, nodes, group_position);
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < group_size; ++j) mlog2log[size_t(group_position[size_t(g)] * group_size + j)] = g * group_size + j;
  const int node_slots = s.slots / nodes, node_ranks = s.slots / s.local_slots / nodes;
  std::vector<float> w(static_cast<size_t>(per_node));
  for (int node = 0; node < nodes; ++node) {
    const int32_t* experts = mlog2log.data() + node * per_node;
    for (int k = 0; k < per_node; ++k) w[size_t(k)] = weight[size_t(experts[k])];
    run_node(w, node_slots, node_ranks, experts, node * node_slots, out);
  }
}

}  // namespace

Result<VecArrays> deepseek_torch(const double* tokens, const VecShape& shape, VecPrecision precision) {
  const int groups = shape.hierarchical ? shape.groups : 1, nodes = shape.hierarchical ? shape.nodes : 1;
  EPLB_TRY(check(tokens, shape, groups, nodes, precision));
  const size_t layers = size_t(shape.layers), slots = size_t(shape.slots), experts = size_t(shape.experts);
  VecArrays out{shape.layers, shape.experts, shape.slots, 0, std::vector<int32_t>(layers * slots), {},
                std::vector<int32_t>(layers * experts)};
  std::vector<int32_t> phyrank(layers * slots);
  for (size_t l = 0; l < layers; ++l)
    run_layer(tokens, shape, groups, nodes, precision, int(l),
              {out.phy2log.data() + l * slots, phyrank.data() + l * slots, out.logcnt.data() + l * experts});
  out.width = *std::max_element(out.logcnt.begin(), out.logcnt.end());
  out.log2phy.assign(layers * experts * size_t(out.width), -1);
  for (size_t l = 0; l < layers; ++l)
    for (size_t q = 0; q < slots; ++q)
      out.log2phy[(l * experts + size_t(out.phy2log[l * slots + q])) * size_t(out.width) + size_t(phyrank[l * slots + q])] =
          int32_t(q);
  return out;
}

}  // namespace eplb
