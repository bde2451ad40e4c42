#include "layer_tools.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace eplb::policies {

Status check_load(const LoadMatrix& load, const Topology& topology) {
  EPLB_TRY(topology.validate());
  EPLB_TRY(load.validate());
  if (load.num_layers != topology.num_layers || load.num_experts != topology.num_experts)
    return error(Code::Mismatch, "load is [" + std::to_string(load.num_layers) + "][" +
                                     std::to_string(load.num_experts) + "] but the topology is " +
                                     topology.to_string());
  return Status::ok();
}

Status check_current(const Placement& current, const Topology& topology) {
  return current.validate_against(topology).with_context("current placement");
}

Result<int> budget_slots(double budget, int num_slots) {
  if (!std::isfinite(budget) || budget < 0)
    return error(Code::InvalidArgument, "budget must be a finite number >= 0 (fraction of slots < 1, count >= 1), got " +
                                            std::to_string(budget));
  double slots = budget < 1 ? std::floor(budget * num_slots + 1e-9) : std::floor(budget);
  return int(std::min<double>(slots, num_slots));
}

void layer_rank_loads(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology,
                      std::vector<double>& rank_load) {
  std::vector<int> count(load.size(), 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  rank_load.assign(size_t(topology.num_ranks), 0.0);
  int per_rank = topology.slots_per_rank();
  for (size_t s = 0; s < phy2log.size(); ++s) {
    int e = phy2log[s];
    rank_load[s / size_t(per_rank)] += load[size_t(e)] / count[size_t(e)];
  }
}

double layer_max_load(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology) {
  std::vector<double> rank_load;
  layer_rank_loads(phy2log, load, topology, rank_load);
  return *std::max_element(rank_load.begin(), rank_load.end());
}

double expected_max_of_normals(std::span<const double> mean, std::span<const double> spread) {
  if (mean.empty()) return 0;
  double lo = -std::numeric_limits<double>::infinity(), hi = lo;
  for (size_t r = 0; r < mean.size(); ++r) {
    lo = std::max(lo, mean[r] - 6 * spread[r]);  // below lo some rank is almost surely above
    hi = std::max(hi, mean[r] + 6 * spread[r]);  // above hi no rank almost surely
  }
  if (!(hi > lo)) return hi;
  // Ranks that stay below lo almost surely leave P(max <= x) as it is.
  std::vector<size_t> near;
  for (size_t r = 0; r < mean.size(); ++r)
    if (mean[r] + 6 * spread[r] > lo) near.push_back(r);
  // E[max] = lo + integral over [lo, hi] of P(max > x) dx (trapezoids).
  constexpr int kIntervals = 64;
  const double step = (hi - lo) / kIntervals;
  double integral = 0;
  for (int k = 0; k <= kIntervals; ++k) {
    const double x = lo + k * step;
    double all_below = 1;
    for (size_t r : near)
      all_below *= spread[r] > 0 ? 0.5 * std::erfc((mean[r] - x) / (spread[r] * std::sqrt(2.0))) : double(x >= mean[r]);
    integral += (k == 0 || k == kIntervals ? 0.5 : 1.0) * (1 - all_below) * step;
  }
  return lo + integral;
}

double layer_expected_max_load(std::span<const int32_t> phy2log, std::span<const double> load,
                               const Topology& topology, double sigma) {
  // Counted and summed as layer_rank_loads does, per expert share; in units of the largest
  // load, so that squares of huge (finite) loads stay finite. E[max] scales with its inputs.
  const double scale = load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  if (!(scale > 0)) return 0;
  std::vector<int> count(load.size(), 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  const size_t ranks = size_t(topology.num_ranks), per_rank = size_t(topology.slots_per_rank());
  std::vector<double> mean(ranks, 0.0), rank_sd(ranks, 0.0);
  for (size_t r = 0; r < ranks; ++r) {
    const int32_t* slots = phy2log.data() + r * per_rank;
    double square = 0;
    for (size_t i = 0; i < per_rank; ++i) {
      if (std::find(slots, slots + i, slots[i]) != slots + i) continue;  // this expert's share is counted
      const auto held = std::count(slots + i, slots + per_rank, slots[i]);
      const double share = load[size_t(slots[i])] / scale * double(held) / count[size_t(slots[i])];
      mean[r] += share;
      square += share * share;
    }
    rank_sd[r] = sigma * std::sqrt(square);
  }
  return scale * expected_max_of_normals(mean, rank_sd);
}

double layer_balancedness(std::span<const int32_t> phy2log, std::span<const double> load, const Topology& topology) {
  std::vector<double> rank_load;
  layer_rank_loads(phy2log, load, topology, rank_load);
  double max = 0, total = 0;
  for (double v : rank_load) {
    max = std::max(max, v);
    total += v;
  }
  double mean = total / double(rank_load.size());
  return max > 0 ? mean / max : 1.0;
}

bool violates_anti_affinity(std::span<const int32_t> phy2log, const Topology& topology) {
  int per_rank = topology.slots_per_rank();
  for (size_t base = 0; base < phy2log.size(); base += size_t(per_rank))
    for (int i = 0; i < per_rank; ++i)
      for (int j = 0; j < i; ++j)
        if (phy2log[base + i] == phy2log[base + j]) return true;
  return false;
}

namespace {

bool rank_holds(std::span<const int32_t> phy2log, int per_rank, int rank, int expert) {
  for (int i = 0; i < per_rank; ++i)
    if (phy2log[size_t(rank) * per_rank + i] == expert) return true;
  return false;
}

}  // namespace

namespace {

std::string at_layer(int layer) { return "layer " + std::to_string(layer) + ": "; }

// An expert with more replicas than ranks: its duplicates (last slot first)
// re-targeted to the experts with the largest load per replica that have
// room. Returns the slots rewritten.
Result<int> reduce_surplus(std::vector<int32_t>& phy2log, std::span<const double> load, int ranks, int per_rank,
                           int expert, std::vector<int>& count, int layer) {
  const int experts = int(load.size());
  int rewritten = 0;
  for (int slot = int(phy2log.size()) - 1; slot >= 0 && count[size_t(expert)] > ranks; --slot) {
    if (phy2log[size_t(slot)] != expert) continue;
    const int rank = slot / per_rank;
    int on_rank = 0;
    for (int i = 0; i < per_rank; ++i) on_rank += phy2log[size_t(rank) * per_rank + i] == expert;
    if (on_rank < 2) continue;
    int target = -1;
    double target_weight = -1;
    for (int h = 0; h < experts; ++h) {
      if (count[size_t(h)] >= ranks || rank_holds(phy2log, per_rank, rank, h)) continue;
      const double w = load[size_t(h)] / (count[size_t(h)] + 1);
      if (w > target_weight) {
        target = h;
        target_weight = w;
      }
    }
    if (target < 0) break;
    phy2log[size_t(slot)] = target;
    --count[size_t(expert)];
    ++count[size_t(target)];
    ++rewritten;
  }
  if (count[size_t(expert)] > ranks)
    return error(Code::Internal, at_layer(layer) + "anti-affinity repair could not reduce the replicas of expert " +
                                     std::to_string(expert));
  return rewritten;
}

// The slot of another rank to swap with `slot` (whose expert is duplicated
// on its rank): neither rank may then hold a duplicate; the smallest larger
// load of the two ranks wins (ties: lowest slot), same node first when
// prefer_same_node. -1 if none.
int swap_partner(const std::vector<int32_t>& phy2log, const Topology& topology, const std::vector<double>& rank_load,
                 const std::vector<int>& count, std::span<const double> load, int slot, bool prefer_same_node) {
  const int per_rank = topology.slots_per_rank();
  const int rank = slot / per_rank, expert = phy2log[size_t(slot)];
  auto weight = [&](int s) { return load[size_t(phy2log[size_t(s)])] / count[size_t(phy2log[size_t(s)])]; };
  int best = -1;
  bool best_same_node = false;
  double best_peak = std::numeric_limits<double>::infinity();
  for (int other = 0; other < topology.num_ranks; ++other) {
    if (other == rank || rank_holds(phy2log, per_rank, other, expert)) continue;
    const bool same_node = topology.node_of_rank(other) == topology.node_of_rank(rank);
    if (prefer_same_node && best_same_node && !same_node) continue;
    for (int k = 0; k < per_rank; ++k) {
      const int partner = other * per_rank + k;
      const int partner_expert = phy2log[size_t(partner)];
      if (partner_expert == expert || rank_holds(phy2log, per_rank, rank, partner_expert)) continue;
      const double delta = weight(partner) - weight(slot);
      const double peak = std::max(rank_load[size_t(rank)] + delta, rank_load[size_t(other)] - delta);
      if (peak < best_peak || (prefer_same_node && same_node && !best_same_node)) {
        best = partner;
        best_peak = peak;
        best_same_node = same_node;
      }
    }
  }
  return best;
}

// Every duplicate swapped away; each swap removes one duplicate and creates
// none, so this terminates. Returns the slots rewritten.
Result<int> separate_duplicates(std::vector<int32_t>& phy2log, std::span<const double> load, const Topology& topology,
                                const std::vector<int>& count, int layer, bool prefer_same_node) {
  const int per_rank = topology.slots_per_rank();
  std::vector<double> rank_load;
  layer_rank_loads(phy2log, load, topology, rank_load);
  auto weight = [&](int s) { return load[size_t(phy2log[size_t(s)])] / count[size_t(phy2log[size_t(s)])]; };
  int rewritten = 0;
  for (int slot = 0; slot < int(phy2log.size()); ++slot) {
    const int rank = slot / per_rank, expert = phy2log[size_t(slot)];
    bool duplicate = false;
    for (int j = rank * per_rank; j < slot; ++j) duplicate |= phy2log[size_t(j)] == expert;
    if (!duplicate) continue;
    const int best = swap_partner(phy2log, topology, rank_load, count, load, slot, prefer_same_node);
    if (best < 0)
      return error(Code::InvalidArgument, at_layer(layer) + "anti-affinity repair found no swap for expert " +
                                              std::to_string(expert) + " on rank " + std::to_string(rank));
    const double delta = weight(best) - weight(slot);
    rank_load[size_t(rank)] += delta;
    rank_load[size_t(best / per_rank)] -= delta;
    std::swap(phy2log[size_t(slot)], phy2log[size_t(best)]);
    rewritten += 2;
  }
  return rewritten;
}

}  // namespace

Result<int> repair_anti_affinity(std::vector<int32_t>& phy2log, std::span<const double> load,
                                 const Topology& topology, int layer, bool prefer_same_node, bool may_change_counts) {
  const int per_rank = topology.slots_per_rank();
  const int ranks = topology.num_ranks;
  const int experts = int(load.size());
  if (per_rank > experts)
    return error(Code::InvalidArgument, at_layer(layer) + "anti-affinity is impossible: " +
                                            std::to_string(per_rank) + " slots per rank but only " +
                                            std::to_string(experts) + " experts");
  std::vector<int> count(load.size(), 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  int rewritten = 0;
  for (int e = 0; e < experts; ++e) {
    if (count[size_t(e)] <= ranks) continue;
    if (!may_change_counts)
      return error(Code::InvalidArgument, at_layer(layer) + "anti-affinity is impossible: expert " +
                                              std::to_string(e) + " has " + std::to_string(count[size_t(e)]) +
                                              " replicas but there are only " + std::to_string(ranks) + " ranks");
    EPLB_ASSIGN_OR_RETURN(int surplus, reduce_surplus(phy2log, load, ranks, per_rank, e, count, layer));
    rewritten += surplus;
  }
  EPLB_ASSIGN_OR_RETURN(int swapped, separate_duplicates(phy2log, load, topology, count, layer, prefer_same_node));
  return rewritten + swapped;
}

// A policy's own phy2log: the checks that can fail (every entry an expert,
// every expert at least one replica), then logcnt and log2phy built directly
// instead of built and validated again (Placement::from_phy2log, which
// gives the message when a check fails).
Result<Placement> placement_from_phy2log(const Topology& topology, std::vector<int32_t> phy2log) {
  const size_t layers = size_t(topology.num_layers), experts = size_t(topology.num_experts);
  const size_t slots = size_t(topology.num_slots);
  std::vector<int32_t> logcnt(layers * experts, 0);
  bool valid = phy2log.size() == layers * slots;
  for (size_t i = 0; valid && i < phy2log.size(); ++i) {
    valid = uint32_t(phy2log[i]) < uint32_t(experts);
    if (valid) ++logcnt[(i / slots) * experts + size_t(phy2log[i])];
  }
  valid = valid && std::find(logcnt.begin(), logcnt.end(), 0) == logcnt.end();
  if (!valid)
    return Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots, std::move(phy2log));
  const size_t width = size_t(*std::max_element(logcnt.begin(), logcnt.end()));
  std::vector<int32_t> log2phy(layers * experts * width, -1);
  std::vector<int32_t> filled(experts);
  for (size_t l = 0; l < layers; ++l) {
    std::fill(filled.begin(), filled.end(), 0);
    for (size_t s = 0; s < slots; ++s) {
      const size_t e = size_t(phy2log[l * slots + s]);
      log2phy[(l * experts + e) * width + size_t(filled[e]++)] = int32_t(s);
    }
  }
  return Placement::from_arrays_unchecked(topology.num_layers, topology.num_experts, topology.num_slots, int(width),
                                          std::move(phy2log), std::move(log2phy), std::move(logcnt));
}

int apply_hysteresis(std::vector<int32_t>& phy2log, const Placement& current, const LoadMatrix& load,
                     const Topology& topology, double min_gain, bool anti_affinity) {
  if (!(min_gain > 0)) return 0;
  const size_t slots = size_t(topology.num_slots);
  int kept = 0;
  for (int l = 0; l < topology.num_layers; ++l) {
    std::span<int32_t> fresh(phy2log.data() + size_t(l) * slots, slots);
    std::span<const int32_t> old = current.layer_phy2log(l);
    if (anti_affinity && violates_anti_affinity(old, topology)) continue;
    double gain = layer_balancedness(fresh, load.layer(l), topology) - layer_balancedness(old, load.layer(l), topology);
    if (gain < min_gain) {
      std::copy(old.begin(), old.end(), fresh.begin());
      ++kept;
    }
  }
  return kept;
}

Result<Placement> apply_common_options(Placement placed, const LoadMatrix& load, const Topology& topology,
                                       const Placement& current, const PolicyOptions& options,
                                       bool may_change_counts) {
  bool hysteresis = options.min_gain > 0;
  if (!options.anti_affinity && !hysteresis) return placed;
  if (hysteresis) EPLB_TRY(check_current(current, topology));
  std::vector<int32_t> phy2log = placed.phy2log_data();
  const size_t slots = size_t(topology.num_slots);
  if (options.anti_affinity) {
    for (int l = 0; l < topology.num_layers; ++l) {
      std::vector<int32_t> layer(phy2log.begin() + l * slots, phy2log.begin() + (l + 1) * slots);
      if (!violates_anti_affinity(layer, topology)) continue;
      auto repaired = repair_anti_affinity(layer, load.layer(l), topology, l, topology.hierarchical(),
                                           may_change_counts);
      if (!repaired) return repaired.status();
      std::copy(layer.begin(), layer.end(), phy2log.begin() + l * slots);
    }
  }
  apply_hysteresis(phy2log, current, load, topology, options.min_gain, options.anti_affinity);
  if (phy2log == placed.phy2log_data()) return placed;
  return placement_from_phy2log(topology, std::move(phy2log));
}

}  // namespace eplb::policies
