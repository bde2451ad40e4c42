// balanced.h - the search behind the `balanced` policy (internal to
// src/policy/): greedy replica counts, packing, and recount_toward_greedy,
// which the `cost-aware` policy's candidates also start from.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"

namespace eplb::policies {

// Replica counts: every expert >= 1, R in total, each extra replica to the
// expert with the largest load / count (ties: lowest expert).
std::vector<int> greedy_replica_counts(std::span<const double> load, int num_slots);

// Moves `phy2log`'s replica counts toward greedy_replica_counts by at most
// `max_changes` slot re-targets, the most useful first: each takes a surplus
// replica (of the expert whose replicas stay lightest, lowest load /
// (count - 1); the replica on a rank not holding the receiving expert yet if
// any, on the most loaded such rank) and gives the slot to the expert
// furthest below its count (largest load / count). Ties: lowest expert,
// lowest slot. `phy2log` is a complete placement of `topology` (num_slots
// entries, every expert at least once). Returns the slots rewritten.
int recount_toward_greedy(std::vector<int32_t>& phy2log, std::span<const double> load, const Topology& topology,
                          int max_changes);

// Packs count[e] replicas of each expert (weight load / count) onto ranks of
// slots_per_rank slots: heaviest replica first (ties: lowest expert), each to
// the lightest rank with a free slot (ties: lowest rank), skipping ranks
// that already hold the expert when anti_affinity. Returns phy2log, or an
// empty vector when anti_affinity cannot be met this way.
std::vector<int32_t> pack_replicas(std::span<const double> load, std::span<const int> count, const Topology& topology,
                                   bool anti_affinity);

// How hard `balanced` searches (all bounded by counts, never by a clock).
struct BalanceSettings {
  // Replica counts other than greedy's are tried only when the greedy
  // largest per-replica load is >= this x the mean rank load.
  double count_search_ratio = 0.4;
  int caps = 5;                      // per-replica caps tried: cap0 * (1 + cap_step * k), k < caps
  double cap_step = 0.15;
  std::vector<double> filler_fractions{1.0, 0.75};
  bool refine_start = false;         // local search from deepseek's placement too
  int refined = 1;                   // best packings refined by local search
  int iterations = 32;               // moves per local search
  int swap_partner_ranks = 4;
  int cold_candidates = 0;
  int donor_candidates = 0;
  bool allow_retarget = false;       // local search may change replica counts (else swaps only)
};

// One layer of `balanced`, starting from `start` (deepseek's layer, already
// anti-affinity-clean when asked). Never worse than `start` on `load`: if
// the search does not beat it strictly, returns `start`.
std::vector<int32_t> balance_layer(std::span<const double> load, const Topology& topology,
                                   std::span<const int32_t> start, bool anti_affinity,
                                   const BalanceSettings& settings);

}  // namespace eplb::policies
