// balanced.h - the search behind the `balanced` policy (internal to src/policy/).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"

namespace eplb::policies {

// Replica counts: every expert >= 1, R in total, each extra replica to the
// expert with the largest load / count (ties: lowest expert).
std::vector<int> greedy_replica_counts(std::span<const double> load, int num_slots);

// Packs count[e] replicas of each expert (weight load / count) onto ranks of
// slots_per_rank slots: heaviest replica first (ties: lowest expert), each to
// the lightest rank with a free slot (ties: lowest rank), skipping ranks
// that already hold the expert when anti_affinity. Returns phy2log, or an
// empty vector when anti_affinity cannot be met this way.
std::vector<int32_t> pack_replicas(std::span<const double> load, std::span<const int> count, const Topology& topology,
                                   bool anti_affinity);

// One layer of `balanced`, starting from `start` (deepseek's layer, already
// anti-affinity-clean when asked). Never worse than `start` on `load`: if
// the search does not beat it strictly, returns `start`.
std::vector<int32_t> balance_layer(std::span<const double> load, const Topology& topology,
                                   std::span<const int32_t> start, bool anti_affinity);

}  // namespace eplb::policies
