// deepseek_torch.cpp - DeepSeek's algorithm with torch's tie order, as SGLang
// runs it (eplb/deepseek_vec.h, deepseek_torch).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deepseek_sglang_common.h"
#include "eplb/deepseek_vec.h"

namespace eplb {

namespace {

using deepseek_vec_detail::group_weights;
using deepseek_vec_detail::pack_heaviest_first;
using deepseek_vec_detail::place_groups;
using deepseek_vec_detail::summed_over_steps;

// balanced_packing: pack_heaviest_first with float64 pack sums; one item
// per pack is the identity.
std::vector<int32_t> balanced_packing(const std::vector<float>& weight, int packs) {
  if (int(weight.size()) / packs == 1) {
    std::vector<int32_t> position(weight.size());
    std::iota(position.begin(), position.end(), 0);
    return position;
  }
  return pack_heaviest_first<double>(weight, packs);
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
  const std::vector<int32_t> position = balanced_packing(per_replica, ranks);
  for (int i = 0; i < slots; ++i) {
    const int slot = first_slot + position[size_t(i)];
    out.phy2log[slot] = mlog2log[phy2mlog[size_t(i)]];
    out.phyrank[slot] = rank[size_t(i)];
  }
  for (int j = 0; j < n; ++j) out.logcnt[mlog2log[j]] = count[size_t(j)];
}

void run_layer(const double* tokens, const VecShape& s, int groups, int nodes, VecPrecision precision, int layer,
               Layer out) {
  const int per_node = s.experts / nodes;
  std::vector<float> weight(size_t(s.experts));
  for (int e = 0; e < s.experts; ++e)
    weight[size_t(e)] = summed_over_steps<float>(tokens, s, size_t(layer) * size_t(s.experts) + size_t(e), precision);
  std::vector<int32_t> mlog2log(size_t(s.experts));
  place_groups(balanced_packing(group_weights(weight, groups), nodes), s.experts / groups, mlog2log.data());
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
  EPLB_TRY(deepseek_vec_detail::check_input("deepseek (torch order)", tokens, shape, precision));
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
