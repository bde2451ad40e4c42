// The `relabel` policy: deepseek's rank contents, renumbered onto ranks so
// that as few slots as possible change (see relabel.h).
#include "relabel.h"

#include <algorithm>

#include "eplb/common.h"
#include "hungarian.h"
#include "layer_tools.h"
#include "policies.h"

namespace eplb::policies {

namespace {

// overlap[a * P + b] = |multiset(fresh rank a) ∩ multiset(old rank b)|,
// from the old replicas of each expert (CSR lists of (rank, multiplicity)):
// O(R + P^2) instead of P^2 merges.
std::vector<int> rank_overlaps(std::span<const int32_t> fresh, std::span<const int32_t> old, int experts, int ranks,
                               int per_rank) {
  std::vector<int> first(size_t(experts) + 1, 0);
  for (int32_t e : old) ++first[size_t(e) + 1];
  for (int e = 0; e < experts; ++e) first[size_t(e) + 1] += first[size_t(e)];
  std::vector<int> fill(first.begin(), first.end() - 1);
  std::vector<int> entry_rank(old.size()), entry_multiplicity(old.size());
  for (size_t s = 0; s < old.size(); ++s) {  // slots of one rank are consecutive: merge repeats
    const int e = old[s], r = int(s) / per_rank;
    int& end = fill[size_t(e)];
    if (end > first[size_t(e)] && entry_rank[size_t(end) - 1] == r) {
      ++entry_multiplicity[size_t(end) - 1];
    } else {
      entry_rank[size_t(end)] = r;
      entry_multiplicity[size_t(end)] = 1;
      ++end;
    }
  }
  std::vector<int> overlap(size_t(ranks) * ranks, 0);
  for (int a = 0; a < ranks; ++a) {
    const int32_t* contents = fresh.data() + size_t(a) * per_rank;
    int* row = overlap.data() + size_t(a) * ranks;
    for (int i = 0; i < per_rank; ++i) {
      const int e = contents[i];
      int copy = 1;  // this is the copy-th replica of e on fresh rank a
      for (int j = 0; j < i; ++j) copy += contents[j] == e;
      for (int k = first[size_t(e)]; k < fill[size_t(e)]; ++k)
        if (entry_multiplicity[size_t(k)] >= copy) ++row[entry_rank[size_t(k)]];
    }
  }
  return overlap;
}

// Best assignment of the fresh ranks of node `from` onto the old ranks of
// node `to`; returns the total overlap and fills target[fresh rank].
int assign_node(const std::vector<int>& overlap, int ranks, int per_node, int from, int to, std::vector<int>* target) {
  std::vector<int> gain(size_t(per_node) * per_node);
  for (int i = 0; i < per_node; ++i)
    for (int j = 0; j < per_node; ++j)
      gain[size_t(i) * per_node + j] = overlap[size_t(from * per_node + i) * ranks + (to * per_node + j)];
  std::vector<int> column = max_gain_assignment(gain, per_node);
  int total = 0;
  for (int i = 0; i < per_node; ++i) {
    total += gain[size_t(i) * per_node + column[i]];
    if (target) (*target)[size_t(from * per_node + i)] = to * per_node + column[i];
  }
  return total;
}

}  // namespace

std::vector<int32_t> relabel_layer(std::span<const int32_t> fresh, std::span<const int32_t> old,
                                   const Topology& topology, bool keep_nodes_whole) {
  const int ranks = topology.num_ranks;
  const int per_rank = topology.slots_per_rank();
  std::vector<int> overlap = rank_overlaps(fresh, old, topology.num_experts, ranks, per_rank);
  std::vector<int> target(static_cast<size_t>(ranks));
  const int nodes = keep_nodes_whole ? topology.num_nodes : 1;
  const int per_node = ranks / nodes;
  if (nodes == 1) {
    assign_node(overlap, ranks, per_node, 0, 0, &target);
  } else {
    std::vector<int> node_gain(size_t(nodes) * nodes);
    for (int i = 0; i < nodes; ++i)
      for (int j = 0; j < nodes; ++j) node_gain[size_t(i) * nodes + j] = assign_node(overlap, ranks, per_node, i, j, nullptr);
    std::vector<int> node_target = max_gain_assignment(node_gain, nodes);
    for (int i = 0; i < nodes; ++i) assign_node(overlap, ranks, per_node, i, node_target[i], &target);
  }
  std::vector<int32_t> result(fresh.size(), -1);
  std::vector<char> used(static_cast<size_t>(per_rank));
  for (int a = 0; a < ranks; ++a) {
    const int b = target[size_t(a)];
    std::span<const int32_t> contents = fresh.subspan(size_t(a) * per_rank, size_t(per_rank));
    std::fill(used.begin(), used.end(), 0);
    int32_t* out = result.data() + size_t(b) * per_rank;
    // Keep every expert the old rank already holds in its old slot.
    for (int k = 0; k < per_rank; ++k) {
      int32_t expert = old[size_t(b) * per_rank + k];
      for (int i = 0; i < per_rank; ++i)
        if (!used[i] && contents[i] == expert) {
          used[i] = 1;
          out[k] = expert;
          break;
        }
    }
    int next = 0;
    for (int i = 0; i < per_rank; ++i) {
      if (used[i]) continue;
      while (out[next] != -1) ++next;
      out[next] = contents[i];
    }
  }
  return result;
}

namespace {

class RelabelPolicy final : public Policy {
 public:
  std::string name() const override { return "relabel"; }

  Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                          const PolicyOptions& options) const override {
    EPLB_TRY(check_load(load, topology));
    EPLB_TRY(check_current(current, topology));
    EPLB_ASSIGN_OR_RETURN(Placement fresh, deepseek_placement(load, topology, options.threads));
    PolicyOptions repair_only = options;
    repair_only.min_gain = 0;
    EPLB_ASSIGN_OR_RETURN(fresh, apply_common_options(std::move(fresh), load, topology, current, repair_only));
    const size_t slots = size_t(topology.num_slots);
    std::vector<int32_t> phy2log(size_t(topology.num_layers) * slots);
    const bool keep_nodes_whole = topology.hierarchical() && topology.num_nodes > 1;
    parallel_for(size_t(topology.num_layers), options.threads, [&](size_t l) {
      std::vector<int32_t> layer = relabel_layer(fresh.layer_phy2log(int(l)), current.layer_phy2log(int(l)),
                                                 topology, keep_nodes_whole);
      std::copy(layer.begin(), layer.end(), phy2log.begin() + l * slots);
    });
    apply_hysteresis(phy2log, current, load, topology, options.min_gain, options.anti_affinity);
    return placement_from_phy2log(topology, std::move(phy2log));
  }
};

}  // namespace

std::unique_ptr<Policy> make_relabel() { return std::make_unique<RelabelPolicy>(); }

}  // namespace eplb::policies
