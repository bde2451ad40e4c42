// cost_candidates.h - the per-layer menu the `cost-aware` policy chooses
// from (internal to src/policy/): keep the layer; every prefix of a greedy
// noise-aware move search (move_search.h) from the layer in force; the
// same from the layer in force with its replica counts re-targeted to the
// greedy counts (balanced.h recount_toward_greedy); every prefix of a
// swaps-only search that keeps replicas of one expert on distinct ranks,
// from those counts with duplicates spread out (repair_anti_affinity);
// full refits (`balanced`'s and deepseek's layers relabelled onto the one
// in force). Each candidate is scored by its expected largest rank load on
// the next window (layer_tools.h layer_expected_max_load) and priced on the
// cluster (eplb/cluster.h, layer_price) from its exact plan.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/cluster.h"
#include "eplb/placement.h"

namespace eplb::policies {

struct LayerCandidate {
  std::vector<int32_t> phy2log;
  double score = 0;  // expected largest rank load on the next window (layer_expected_max_load)
  LayerPrice price;  // migration seconds and stalls from the layer in force
  int slots = 0;     // slots rewritten
};

struct CandidateSettings {
  double noise_weight = 0.2;  // the searches' rank-score weight, as incremental's (move_search.h)
  double load_sigma = 0.1;    // relative error of an expert's next-window load, for the scores
  int max_moves = 0;          // search length; 0: the layer's slots
  ClusterSpec cluster;
  double bytes_per_expert = 0;
};

// [0] keeps `current`; then the search's prefixes (each one move more, in
// the order the search made them); then the re-counted start and its
// search's prefixes (when the counts differ); then the spread start and its
// swaps-only prefixes (unless spreading is impossible); last each full refit
// that differs from `current`.
std::vector<LayerCandidate> layer_candidates(std::span<const double> load, const Topology& topology, int layer,
                                             std::span<const int32_t> current,
                                             const std::vector<std::span<const int32_t>>& refits,
                                             const CandidateSettings& settings);

}  // namespace eplb::policies
