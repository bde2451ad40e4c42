#include "cost_candidates.h"

#include <algorithm>

#include "balanced.h"
#include "eplb/plan.h"
#include "layer_tools.h"
#include "move_search.h"

namespace eplb::policies {

namespace {

double score_of(std::span<const double> load, const Topology& topology, std::span<const int32_t> phy2log,
                double noise_weight) {
  LayerSearch search(load, topology, phy2log);
  SearchLimits limits;
  limits.max_iterations = 0;  // refresh only: the scores of this state
  limits.noise_weight = noise_weight;
  search.improve(limits);
  return search.max_score();
}

LayerCandidate priced(std::vector<int32_t> phy2log, double score, std::span<const int32_t> current,
                      const Topology& topology, int layer, const CandidateSettings& settings) {
  LayerCandidate candidate;
  candidate.phy2log = std::move(phy2log);
  candidate.score = score;
  for (size_t s = 0; s < current.size(); ++s) candidate.slots += candidate.phy2log[s] != current[s];
  if (candidate.slots == 0) return candidate;
  // Both mappings are complete placements of this topology: planning cannot fail.
  auto plan = plan_layer(current, candidate.phy2log, topology, layer);
  if (plan) candidate.price = layer_price(*plan, topology, settings.cluster, settings.bytes_per_expert);
  return candidate;
}

// `current` with replica counts set to greedy_replica_counts (balanced.h):
// each surplus replica (the one on the rank most loaded in `current`) is
// re-targeted to the expert below its count with the largest load / count.
std::vector<int32_t> with_greedy_counts(std::span<const double> load, const Topology& topology,
                                        std::span<const int32_t> current) {
  const int experts = int(load.size());
  const std::vector<int> target = greedy_replica_counts(load, topology.num_slots);
  std::vector<int32_t> phy2log(current.begin(), current.end());
  std::vector<int> count(size_t(experts), 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  std::vector<double> rank_load;
  layer_rank_loads(phy2log, load, topology, rank_load);
  for (int e = 0; e < experts; ++e) {
    while (count[size_t(e)] > target[size_t(e)]) {
      int slot = -1;
      for (int s = 0; s < topology.num_slots; ++s)
        if (phy2log[size_t(s)] == e && (slot < 0 || rank_load[size_t(topology.rank_of_slot(s))] >
                                                        rank_load[size_t(topology.rank_of_slot(slot))]))
          slot = s;
      int best = -1;
      for (int h = 0; h < experts; ++h)
        if (count[size_t(h)] < target[size_t(h)] &&
            (best < 0 || load[size_t(h)] / count[size_t(h)] > load[size_t(best)] / count[size_t(best)]))
          best = h;
      if (slot < 0 || best < 0) break;
      phy2log[size_t(slot)] = best;
      --count[size_t(e)];
      ++count[size_t(best)];
    }
  }
  return phy2log;
}

void add_search(std::vector<LayerCandidate>& candidates, std::span<const double> load, const Topology& topology,
                int layer, std::span<const int32_t> current, std::span<const int32_t> start,
                const CandidateSettings& settings) {
  LayerSearch search(load, topology, start);
  SearchLimits one_move;
  one_move.max_iterations = 1;
  one_move.noise_weight = settings.noise_weight;
  const int max_moves = settings.max_moves > 0 ? settings.max_moves : topology.num_slots;
  candidates.push_back(priced(std::vector<int32_t>(start.begin(), start.end()),
                              score_of(load, topology, start, settings.noise_weight), current, topology, layer, settings));
  for (int move = 0; move < max_moves && search.improve(one_move) > 0; ++move)
    candidates.push_back(priced(search.phy2log(), search.max_score(), current, topology, layer, settings));
}

}  // namespace

std::vector<LayerCandidate> layer_candidates(std::span<const double> load, const Topology& topology, int layer,
                                             std::span<const int32_t> current,
                                             const std::vector<std::span<const int32_t>>& refits,
                                             const CandidateSettings& settings) {
  std::vector<LayerCandidate> candidates;
  add_search(candidates, load, topology, layer, current, current, settings);  // [0]: keep
  const std::vector<int32_t> recounted = with_greedy_counts(load, topology, current);
  if (recounted != std::vector<int32_t>(current.begin(), current.end()))
    add_search(candidates, load, topology, layer, current, recounted, settings);
  for (std::span<const int32_t> refit : refits) {
    if (std::equal(refit.begin(), refit.end(), current.begin(), current.end())) continue;
    std::vector<int32_t> full(refit.begin(), refit.end());
    const double score = score_of(load, topology, full, settings.noise_weight);
    candidates.push_back(priced(std::move(full), score, current, topology, layer, settings));
  }
  return candidates;
}

}  // namespace eplb::policies
