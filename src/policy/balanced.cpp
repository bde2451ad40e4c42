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
#include <numeric>
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
  if (extra <= 0) return;
  Heavier order{load, count};
  std::vector<int> eligible, rest;
  eligible.reserve(load.size());
  for (int e = 0; e < int(load.size()); ++e)
    (load[size_t(e)] / count[size_t(e)] <= limit ? eligible : rest).push_back(e);
  std::make_heap(eligible.begin(), eligible.end(), order);
  bool rest_ready = false;
  while (extra > 0) {
    if (eligible.empty() && !rest_ready) {
      std::make_heap(rest.begin(), rest.end(), order);
      rest_ready = true;
    }
    auto& heap = eligible.empty() ? rest : eligible;
    std::pop_heap(heap.begin(), heap.end(), order);
    ++count[size_t(heap.back())];
    --extra;
    std::push_heap(heap.begin(), heap.end(), order);
  }
}

}  // namespace

std::vector<int> greedy_replica_counts(std::span<const double> load, int num_slots) {
  std::vector<int> count(load.size(), 1);
  fill_replicas(load, count, num_slots - int(load.size()), std::numeric_limits<double>::infinity());
  return count;
}

namespace {

// The expert with the best key among those `eligible` (ties: lowest expert), or -1.
template <typename Eligible, typename Key>
int best_expert(int experts, Eligible eligible, Key key) {
  int best = -1;
  for (int e = 0; e < experts; ++e)
    if (eligible(e) && (best < 0 || key(e) > key(best))) best = e;
  return best;
}

// The slot that gives up a replica of `lose` to `gain`: first on a rank not
// holding `gain` yet, then on the most loaded rank (ties: lowest slot); -1
// when no slot holds `lose`.
int surplus_slot(std::span<const int32_t> phy2log, int lose, int gain, std::span<const double> rank_load,
                 const Topology& topology) {
  const int per_rank = topology.slots_per_rank();
  auto holds_gain = [&](int rank) {
    const auto first = phy2log.begin() + ptrdiff_t(rank) * per_rank;
    return std::find(first, first + per_rank, gain) != first + per_rank;
  };
  int slot = -1;
  bool slot_free = false;  // slot's rank does not hold `gain`
  for (int s = 0; s < topology.num_slots; ++s) {
    if (phy2log[size_t(s)] != lose) continue;
    const int rank = topology.rank_of_slot(s);
    const bool free = !holds_gain(rank);
    if (slot < 0 || (free && !slot_free) ||
        (free == slot_free && rank_load[size_t(rank)] > rank_load[size_t(topology.rank_of_slot(slot))])) {
      slot = s;
      slot_free = free;
    }
  }
  return slot;
}

}  // namespace

int recount_toward_greedy(std::vector<int32_t>& phy2log, std::span<const double> load, const Topology& topology,
                          int max_changes) {
  const int experts = int(load.size());
  const std::vector<int> target = greedy_replica_counts(load, topology.num_slots);
  std::vector<int> count(size_t(experts), 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  std::vector<double> rank_load;
  int changes = 0;
  for (; changes < max_changes; ++changes) {
    const int gain = best_expert(
        experts, [&](int e) { return count[size_t(e)] < target[size_t(e)]; },
        [&](int e) { return load[size_t(e)] / count[size_t(e)]; });
    const int lose = best_expert(
        experts, [&](int e) { return count[size_t(e)] > target[size_t(e)]; },
        [&](int e) { return -load[size_t(e)] / (count[size_t(e)] - 1); });
    if (gain < 0 || lose < 0) break;
    layer_rank_loads(phy2log, load, topology, rank_load);
    const int slot = surplus_slot(phy2log, lose, gain, rank_load, topology);
    if (slot < 0) break;  // not a complete placement: `lose` is counted but held nowhere
    phy2log[size_t(slot)] = gain;
    --count[size_t(lose)];
    ++count[size_t(gain)];
  }
  return changes;
}

std::vector<int32_t> pack_replicas(std::span<const double> load, std::span<const int> count, const Topology& topology,
                                   bool anti_affinity) {
  const int per_rank = topology.slots_per_rank(), ranks = topology.num_ranks;
  const int experts = int(count.size());
  std::vector<double> weight(static_cast<size_t>(experts));
  std::vector<int> order(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e) weight[size_t(e)] = load[size_t(e)] / count[size_t(e)];
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return weight[size_t(a)] != weight[size_t(b)] ? weight[size_t(a)] > weight[size_t(b)] : a < b;
  });
  using Entry = std::pair<double, int>;  // (rank load, rank): lightest, then lowest rank first
  std::vector<Entry> open;  // a binary min-heap
  open.reserve(size_t(ranks));
  for (int r = 0; r < ranks; ++r) open.push_back({0.0, r});
  std::vector<int> filled(size_t(ranks), 0);
  std::vector<int32_t> phy2log(size_t(topology.num_slots), -1);
  std::vector<Entry> skipped;
  for (int e : order) {
    for (int k = 0; k < count[size_t(e)]; ++k) {
      skipped.clear();
      while (!open.empty() && anti_affinity) {
        const int r = open.front().second;
        bool holds = false;
        for (int i = 0; i < filled[size_t(r)]; ++i) holds |= phy2log[size_t(r) * per_rank + i] == e;
        if (!holds) break;
        skipped.push_back(open.front());
        std::pop_heap(open.begin(), open.end(), std::greater<Entry>());
        open.pop_back();
      }
      if (open.empty()) return {};
      std::pop_heap(open.begin(), open.end(), std::greater<Entry>());
      auto [rank_load, r] = open.back();
      open.pop_back();
      phy2log[size_t(r) * per_rank + filled[size_t(r)]++] = e;
      if (filled[size_t(r)] < per_rank) {
        open.push_back({rank_load + weight[size_t(e)], r});
        std::push_heap(open.begin(), open.end(), std::greater<Entry>());
      }
      for (const Entry& entry : skipped) {
        open.push_back(entry);
        std::push_heap(open.begin(), open.end(), std::greater<Entry>());
      }
    }
  }
  return phy2log;
}

namespace {

struct Packed {
  double max_load;
  std::vector<int32_t> phy2log;
};

// (1)+(2): candidate replica count vectors (the greedy counts; with large
// single replicas also counts under a few load caps with a few filler
// fractions) and their packings, best first.
std::vector<Packed> candidate_packings(std::span<const double> load, const Topology& topology, bool anti_affinity,
                                       const BalanceSettings& settings) {
  const int experts = int(load.size()), slots = topology.num_slots;
  std::vector<int> greedy = greedy_replica_counts(load, slots);
  double cap0 = 0, total_load = 0;
  for (int e = 0; e < experts; ++e) {
    cap0 = std::max(cap0, load[size_t(e)] / greedy[size_t(e)]);
    total_load += load[size_t(e)];
  }
  // Other replica counts only pay off when single replicas are large next
  // to a rank's share of the load; otherwise the greedy counts alone.
  const bool search_counts = cap0 >= settings.count_search_ratio * total_load / topology.num_ranks;
  const int caps = search_counts ? settings.caps : 1;
  const std::vector<double> greedy_only{1.0};
  const std::vector<double>& fractions = search_counts ? settings.filler_fractions : greedy_only;
  std::vector<Packed> packed;
  std::vector<std::vector<int>> seen;
  std::vector<int> base(static_cast<size_t>(experts));
  for (int k = 0; k < caps; ++k) {
    const double cap = cap0 * (1.0 + settings.cap_step * k);
    int total = 0;
    for (int e = 0; e < experts; ++e) {
      base[size_t(e)] = std::max(1, int(std::ceil(load[size_t(e)] / cap - 1e-9)));
      total += base[size_t(e)];
    }
    if (total > slots) continue;
    for (double fraction : fractions) {
      std::vector<int> count = base;
      fill_replicas(load, count, slots - total, fraction * cap);
      if (std::find(seen.begin(), seen.end(), count) != seen.end()) continue;
      std::vector<int32_t> phy2log = pack_replicas(load, count, topology, anti_affinity);
      seen.push_back(std::move(count));
      if (phy2log.empty()) continue;
      const double max = layer_max_load(phy2log, load, topology);
      packed.push_back({max, std::move(phy2log)});
    }
  }
  std::stable_sort(packed.begin(), packed.end(), [](const Packed& a, const Packed& b) { return a.max_load < b.max_load; });
  return packed;
}

}  // namespace

std::vector<int32_t> balance_layer(std::span<const double> load, const Topology& topology,
                                   std::span<const int32_t> start, bool anti_affinity,
                                   const BalanceSettings& settings) {
  std::vector<int32_t> start_layer(start.begin(), start.end());
  const double start_max = layer_max_load(start_layer, load, topology);
  if (start_max <= 0) return start_layer;
  const std::vector<Packed> packed = candidate_packings(load, topology, anti_affinity, settings);

  // (3): refine deepseek's start and the best packings.
  SearchLimits limits;
  limits.max_iterations = settings.iterations;
  limits.accept_plateau = true;
  limits.anti_affinity = anti_affinity;
  limits.swap_partner_ranks = settings.swap_partner_ranks;
  limits.cold_candidates = settings.cold_candidates;
  limits.donor_candidates = settings.donor_candidates;
  limits.allow_retarget = settings.allow_retarget;
  std::vector<int32_t> best = start_layer;
  double best_max = start_max;
  auto refine = [&](std::span<const int32_t> from) {
    LayerSearch search(load, topology, from);
    search.improve(limits);
    const double max = search.max_load();
    if (max < best_max) {
      best_max = max;
      best = search.phy2log();
    }
  };
  if (settings.refine_start) refine(start_layer);
  for (size_t i = 0; i < std::min(size_t(std::max(settings.refined, 0)), packed.size()); ++i)
    refine(packed[i].phy2log);
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
                                                 options.anti_affinity, BalanceSettings{});
      std::copy(layer.begin(), layer.end(), phy2log.begin() + l * slots);
    });
    apply_hysteresis(phy2log, current, load, topology, options.min_gain, options.anti_affinity);
    return placement_from_phy2log(topology, std::move(phy2log));
  }
};

}  // namespace

std::unique_ptr<Policy> make_balanced() { return std::make_unique<BalancedPolicy>(); }

}  // namespace eplb::policies
