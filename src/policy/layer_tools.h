// layer_tools.h - per-layer helpers shared by the migration-aware policies
// (internal to src/policy/): input checks, budgets, per-layer metrics
// (balancedness, max load, the expected max load `cost-aware` scores with),
// anti-affinity repair, min_gain hysteresis, and the option post-processing
// applied to `deepseek`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"
#include "eplb/policy.h"
#include "eplb/status.h"

namespace eplb::policies {

// load matches the topology (layers, experts) and is valid; topology valid.
Status check_load(const LoadMatrix& load, const Topology& topology);
// current is a valid placement of this topology's shape.
Status check_current(const Placement& current, const Topology& topology);
// PolicyOptions::budget as slots per layer: < 1 a fraction of R (rounded
// down), >= 1 a count (rounded down), clamped to [0, R].
Result<int> budget_slots(double budget, int num_slots);

// Rank loads of one layer given as phy2log (replica = load / count).
void layer_rank_loads(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology,
                      std::vector<double>& rank_load);
// mean / max of those rank loads (1 when the layer has no load), computed
// exactly like eplb::balancedness (same summation order).
double layer_balancedness(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology);
double layer_max_load(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology);

// E[max_r X_r] for independent X_r ~ Normal(mean[r], spread[r]^2) (a
// spread of 0: the constant mean[r]); by quadrature over mean-6 to mean+6
// spreads. spread.size() == mean.size(), every spread >= 0 and finite.
// Empty input: 0.
double expected_max_of_normals(std::span<const double> mean, std::span<const double> spread);
// The layer's expected largest rank load on the next window when every
// expert's load there is off by a relative error of `sigma` (independent
// across experts): rank r's load is Normal(L_r, sigma^2 Q_r), with Q_r the
// sum over the experts r holds of (r's share of the expert's load)^2, so two
// replicas of one expert on one rank count as one larger share. (The move
// search's rank score, move_search.h, sums squared replica loads instead.)
// A layer without load: 0.
double layer_expected_max_load(std::span<const int32_t> phy2log, std::span<const double> load,
                               const Topology& topology, double sigma);

// True when some rank holds two replicas of one expert.
bool violates_anti_affinity(std::span<const int32_t> phy2log, const Topology& topology);

// Removes every duplicate (expert, rank) pair by swapping slots across
// ranks, keeping replica counts; each swap picks the partner slot that
// keeps the two ranks' larger load lowest (ties: lowest slot), same node
// first when `prefer_same_node`. An expert with more replicas than ranks is
// an InvalidArgument error, unless `may_change_counts`: then its surplus
// duplicates are first re-targeted to the experts with the largest load per
// replica that have room. Also InvalidArgument when a rank has more slots
// than there are experts. Returns the number of slots rewritten.
Result<int> repair_anti_affinity(std::vector<int32_t>& phy2log, std::span<const double> load,
                                 const Topology& topology, int layer, bool prefer_same_node,
                                 bool may_change_counts = false);

// Builds a Placement (log2phy ordered by slot) from [L][R] phy2log.
Result<Placement> placement_from_phy2log(const Topology& topology, std::vector<int32_t> phy2log);

// Hysteresis: keeps current's layer l wherever the new layer's
// balancedness on `load` exceeds current's by less than min_gain. No-op when
// min_gain <= 0. With anti_affinity, a current layer that violates it is
// never kept. Returns the number of layers kept.
int apply_hysteresis(std::vector<int32_t>& phy2log, const Placement& current, const LoadMatrix& load,
                     const Topology& topology, double min_gain, bool anti_affinity);

// The options post-processing of a finished placement (deepseek's, and the
// start of relabel and balanced): anti-affinity repair, then hysteresis.
// Returns `placed` untouched (bit for bit) with default options.
Result<Placement> apply_common_options(Placement placed, const LoadMatrix& load, const Topology& topology,
                                       const Placement& current, const PolicyOptions& options,
                                       bool may_change_counts = false);

}  // namespace eplb::policies
