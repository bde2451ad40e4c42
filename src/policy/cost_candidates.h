// cost_candidates.h - the per-layer menu the `cost-aware` policy chooses
// from (internal to src/policy/): keep the layer; every prefix of a greedy
// noise-aware move search (move_search.h) from the layer in force; the
// same from the layer in force with its replica counts re-targeted to the
// greedy counts (balanced.h: surplus replicas, on their expert's most
// loaded rank, to the experts furthest below, largest load / count first);
// full refits (`balanced`'s and deepseek's layers relabelled onto the one
// in force). Each
// candidate is priced on the cluster (eplb/cluster.h, layer_price) from its
// exact plan.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/cluster.h"
#include "eplb/placement.h"

namespace eplb::policies {

struct LayerCandidate {
  std::vector<int32_t> phy2log;
  double score = 0;  // largest rank score L + w sqrt(Q) on the planning load: the expected max rank load
  LayerPrice price;  // migration seconds and stalls from the layer in force
  int slots = 0;     // slots rewritten
};

struct CandidateSettings {
  double noise_weight = 0.2;  // as incremental's rank score (move_search.h)
  int max_moves = 0;          // search length; 0: the layer's slots
  ClusterSpec cluster;
  double bytes_per_expert = 0;
};

// [0] keeps `current`; then the search's prefixes (each one move more, in
// the order the search made them); then the re-counted start and its
// search's prefixes (when the counts differ); last each full refit that
// differs from `current`.
std::vector<LayerCandidate> layer_candidates(std::span<const double> load, const Topology& topology, int layer,
                                             std::span<const int32_t> current,
                                             const std::vector<std::span<const int32_t>>& refits,
                                             const CandidateSettings& settings);

}  // namespace eplb::policies
