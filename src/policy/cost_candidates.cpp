#include "cost_candidates.h"

#include <algorithm>

#include "balanced.h"
#include "eplb/plan.h"
#include "layer_tools.h"
#include "move_search.h"

namespace eplb::policies {

namespace {

// A candidate scored (its expected largest rank load on the next window) and
// priced from its exact plan.
LayerCandidate priced(std::vector<int32_t> phy2log, std::span<const double> load, std::span<const int32_t> current,
                      const Topology& topology, int layer, const CandidateSettings& settings) {
  LayerCandidate candidate;
  candidate.phy2log = std::move(phy2log);
  candidate.score = layer_expected_max_load(candidate.phy2log, load, topology, settings.load_sigma);
  for (size_t s = 0; s < current.size(); ++s) candidate.slots += candidate.phy2log[s] != current[s];
  if (candidate.slots == 0) return candidate;
  // Both mappings are complete placements of this topology: planning cannot fail.
  auto plan = plan_layer(current, candidate.phy2log, topology, layer);
  if (plan) candidate.price = layer_price(*plan, topology, settings.cluster, settings.bytes_per_expert);
  return candidate;
}

// `start` and every prefix of a greedy search from it, one move at a time;
// `swaps_only_spread`: swaps only, never two replicas of one expert on one rank.
void add_search(std::vector<LayerCandidate>& candidates, std::span<const double> load, const Topology& topology,
                int layer, std::span<const int32_t> current, std::span<const int32_t> start,
                const CandidateSettings& settings, bool swaps_only_spread) {
  LayerSearch search(load, topology, start);
  SearchLimits one_move;
  one_move.max_iterations = 1;
  one_move.noise_weight = settings.noise_weight;
  one_move.allow_retarget = !swaps_only_spread;
  one_move.anti_affinity = swaps_only_spread;
  const int max_moves = settings.max_moves > 0 ? settings.max_moves : topology.num_slots;
  candidates.push_back(priced(std::vector<int32_t>(start.begin(), start.end()), load, current, topology, layer,
                              settings));
  for (int move = 0; move < max_moves && search.improve(one_move) > 0; ++move)
    candidates.push_back(priced(search.phy2log(), load, current, topology, layer, settings));
}

}  // namespace

std::vector<LayerCandidate> layer_candidates(std::span<const double> load, const Topology& topology, int layer,
                                             std::span<const int32_t> current,
                                             const std::vector<std::span<const int32_t>>& refits,
                                             const CandidateSettings& settings) {
  std::vector<LayerCandidate> candidates;
  add_search(candidates, load, topology, layer, current, current, settings, /*swaps_only_spread=*/false);  // [0]: keep
  std::vector<int32_t> recounted(current.begin(), current.end());
  recount_toward_greedy(recounted, load, topology, topology.num_slots);
  if (recounted != std::vector<int32_t>(current.begin(), current.end()))
    add_search(candidates, load, topology, layer, current, recounted, settings, /*swaps_only_spread=*/false);
  // Spreading fails (InvalidArgument) where a rank has more slots than there are experts; any
  // failure only drops this path: the policy still has the others.
  std::vector<int32_t> spread_start = recounted;
  if (repair_anti_affinity(spread_start, load, topology, layer, /*prefer_same_node=*/false, /*may_change_counts=*/true))
    add_search(candidates, load, topology, layer, current, spread_start, settings, /*swaps_only_spread=*/true);
  for (std::span<const int32_t> refit : refits) {
    if (std::equal(refit.begin(), refit.end(), current.begin(), current.end())) continue;
    candidates.push_back(priced(std::vector<int32_t>(refit.begin(), refit.end()), load, current, topology, layer,
                                settings));
  }
  return candidates;
}

}  // namespace eplb::policies
