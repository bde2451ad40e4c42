// The `balanced` policy: better in-sample balance than deepseek's greedy.
//
// Per layer: (1) a family of replica-count vectors: for caps t from the
// greedy per-replica maximum upwards, each expert gets ceil(load / t)
// replicas and the remaining slots go to the largest per-replica loads,
// either among all experts or only among those below a fraction of t (which
// splits mid-sized experts into small fillers instead of splitting the
// giants further); (2) each vector is packed heaviest-first onto the
// lightest rank; (3) the best packings, and deepseek's own placement, are
// refined by local search (move_search.h: swaps with the lightest ranks and
// replica re-targets, plateau moves allowed), bounded by iteration counts.
// The best result wins if it beats deepseek's strictly, else deepseek's.
#include "balanced.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "eplb/common.h"
#include "layer_tools.h"
#include "move_search.h"
#include "policies.h"

namespace eplb::policies {

namespace {

struct Heavier {
  std::span<const double> load;
  std::span<const int> count;
  // priority_queue pops the largest: larger load/count first, then lower expert.
  bool operator()(int a, int b) const {
    double wa = load[size_t(a)] / count[size_t(a)], wb = load[size_t(b)] / count[size_t(b)];
    return wa != wb ? wa < wb : a > b;
  }
};

// Adds `extra` replicas, each to the largest load/count among experts whose
// load/count is <= limit (all experts once none is left).
void fill_replicas(std::span<const double> load, std::vector<int>& count, int extra, double limit) {
  Heavier order{load, count};
  std::priority_queue<int, std::vector<int>, Heavier> eligible(order), rest(order);
  for (int e = 0; e < int(load.size()); ++e)
    (load[size_t(e)] / count[size_t(e)] <= limit ? eligible : rest).push(e);
  while (extra > 0) {
    auto& queue = eligible.empty() ? rest : eligible;
    int e = queue.top();
    queue.pop();
    ++count[size_t(e)];
    --extra;
    queue.push(e);
  }
}

}  // namespace

std::vector<int> greedy_replica_counts(std::span<const double> load, int num_slots) {
  std::vector<int> count(load.size(), 1);
  fill_replicas(load, count, num_slots - int(load.size()), std::numeric_limits<double>::infinity());
  return count;
}

std::vector<int32_t> pack_replicas(std::span<const double> load, std::span<const int> count, const Topology& topology,
                                   bool anti_affinity) {
  const int per_rank = topology.slots_per_rank(), ranks = topology.num_ranks;
  std::vector<int> items;  // experts, one entry per replica
  items.reserve(size_t(topology.num_slots));
  for (int e = 0; e < int(count.size()); ++e)
    for (int k = 0; k < count[size_t(e)]; ++k) items.push_back(e);
  std::stable_sort(items.begin(), items.end(), [&](int a, int b) {
    double wa = load[size_t(a)] / count[size_t(a)], wb = load[size_t(b)] / count[size_t(b)];
    return wa != wb ? wa > wb : a < b;
  });
  using Entry = std::pair<double, int>;  // (rank load, rank): lightest, then lowest rank first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> open;
  for (int r = 0; r < ranks; ++r) open.push({0.0, r});
  std::vector<int> filled(size_t(ranks), 0);
  std::vector<int32_t> phy2log(size_t(topology.num_slots), -1);
  std::vector<Entry> skipped;
  for (int e : items) {
    skipped.clear();
    while (!open.empty() && anti_affinity) {
      int r = open.top().second;
      bool holds = false;
      for (int i = 0; i < filled[size_t(r)]; ++i) holds |= phy2log[size_t(r) * per_rank + i] == e;
      if (!holds) break;
      skipped.push_back(open.top());
      open.pop();
    }
    if (open.empty()) return {};
    auto [rank_load, r] = open.top();
    open.pop();
    phy2log[size_t(r) * per_rank + filled[size_t(r)]++] = e;
    if (filled[size_t(r)] < per_rank) open.push({rank_load + load[size_t(e)] / count[size_t(e)], r});
    for (const Entry& entry : skipped) open.push(entry);
  }
  return phy2log;
}

std::vector<int32_t> balance_layer(std::span<const double> load, const Topology& topology,
                                   std::span<const int32_t> start, bool anti_affinity) {
  const int experts = int(load.size()), slots = topology.num_slots;
  std::vector<int32_t> start_layer(start.begin(), start.end());
  const double start_max = layer_max_load(start_layer, load, topology);
  if (start_max <= 0) return start_layer;

  // (1)+(2): candidate count vectors and their packings.
  std::vector<int> greedy = greedy_replica_counts(load, slots);
  double cap0 = 0;
  for (int e = 0; e < experts; ++e) cap0 = std::max(cap0, load[size_t(e)] / greedy[size_t(e)]);
  struct Packed {
    double max_load;
    std::vector<int32_t> phy2log;
  };
  std::vector<Packed> packed;
  std::vector<std::vector<int>> seen;
  constexpr int kCaps = 8;
  constexpr double kCapStep = 0.1;
  constexpr double kFillerFractions[] = {1.0, 0.75, 0.5};
  for (int k = 0; k < kCaps; ++k) {
    const double cap = cap0 * (1.0 + kCapStep * k);
    std::vector<int> base(static_cast<size_t>(experts));
    int total = 0;
    for (int e = 0; e < experts; ++e) {
      base[size_t(e)] = std::max(1, int(std::ceil(load[size_t(e)] / cap - 1e-9)));
      total += base[size_t(e)];
    }
    if (total > slots) continue;
    for (double fraction : kFillerFractions) {
      std::vector<int> count = base;
      fill_replicas(load, count, slots - total, fraction * cap);
      if (std::find(seen.begin(), seen.end(), count) != seen.end()) continue;
      std::vector<int32_t> phy2log = pack_replicas(load, count, topology, anti_affinity);
      seen.push_back(std::move(count));
      if (phy2log.empty()) continue;
      double max = layer_max_load(phy2log, load, topology);
      packed.push_back({max, std::move(phy2log)});
    }
  }
  std::stable_sort(packed.begin(), packed.end(), [](const Packed& a, const Packed& b) { return a.max_load < b.max_load; });

  // (3): refine deepseek's start and the best packings.
  SearchLimits limits;
  limits.max_iterations = 48;
  limits.accept_plateau = true;
  limits.anti_affinity = anti_affinity;
  limits.swap_partner_ranks = 8;
  limits.cold_candidates = 4;
  limits.donor_candidates = 8;
  constexpr size_t kRefined = 2;
  std::vector<int32_t> best = start_layer;
  double best_max = start_max;
  auto refine = [&](std::span<const int32_t> from) {
    LayerSearch search(load, topology, from);
    search.improve(limits);
    double max = layer_max_load(search.phy2log(), load, topology);
    if (max < best_max) {
      best_max = max;
      best = search.phy2log();
    }
  };
  refine(start_layer);
  for (size_t i = 0; i < std::min(kRefined, packed.size()); ++i) refine(packed[i].phy2log);
  // Never worse than the start, compared exactly as the metrics do.
  if (layer_balancedness(best, load, topology) <= layer_balancedness(start_layer, load, topology)) return start_layer;
  return best;
}

namespace {

class BalancedPolicy final : public Policy {
 public:
  std::string name() const override { return "balanced"; }

  Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                          const PolicyOptions& options) const override {
    EPLB_TRY(check_load(load, topology));
    if (options.min_gain > 0) EPLB_TRY(check_current(current, topology));
    EPLB_ASSIGN_OR_RETURN(Placement start, deepseek_placement(load, topology, options.threads));
    PolicyOptions repair_only = options;
    repair_only.min_gain = 0;
    EPLB_ASSIGN_OR_RETURN(start, apply_common_options(std::move(start), load, topology, current, repair_only,
                                                                  /*may_change_counts=*/true));
    const size_t slots = size_t(topology.num_slots);
    std::vector<int32_t> phy2log(size_t(topology.num_layers) * slots);
    parallel_for(size_t(topology.num_layers), options.threads, [&](size_t l) {
      std::vector<int32_t> layer = balance_layer(load.layer(int(l)), topology, start.layer_phy2log(int(l)),
                                                 options.anti_affinity);
      std::copy(layer.begin(), layer.end(), phy2log.begin() + l * slots);
    });
    apply_hysteresis(phy2log, current, load, topology, options.min_gain, options.anti_affinity);
    return placement_from_phy2log(topology, std::move(phy2log));
  }
};

}  // namespace

std::unique_ptr<Policy> make_balanced() { return std::make_unique<BalancedPolicy>(); }

}  // namespace eplb::policies
