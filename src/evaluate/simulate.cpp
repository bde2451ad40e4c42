// The replay priced on a cluster (eplb/evaluate.h, docs/scale.md).
#include <fmt/format.h>

#include "eplb/evaluate.h"

namespace eplb {

Result<RebalanceSimulation> simulate_rebalance(const Placement& before, const Placement& after, const LoadMatrix& next,
                                               const Topology& topology, const SimulateOptions& options) {
  EPLB_TRY(options.serving.validate());
  RebalanceSimulation out;
  const BalanceSummary stale = balancedness(before, next, topology), fresh = balancedness(after, next, topology);
  out.window.stale_next = stale.mean_balancedness;
  out.window.next_window = fresh.mean_balancedness;
  out.sum_before = stale.sum_balancedness;
  out.sum_after = fresh.sum_balancedness;
  for (int changed : slots_changed(before, after)) out.window.slots_moved += changed;
  out.window.bytes_moved = double(out.window.slots_moved) * options.bytes_per_expert;
  EPLB_ASSIGN_OR_RETURN(out.cost, migration_cost(before, after, topology, options.cluster, options.bytes_per_expert));
  out.stall = serving_stall(out.cost, options.cluster, true);
  out.stall_unscheduled = serving_stall(out.cost, options.cluster, false);
  auto stall_of = [&](const ServingStall& stall) {
    switch (options.serving.mode) {
      case StallMode::Sync: return stall.sync;
      case StallMode::AsyncCopy: return stall.async_copy;
      case StallMode::AsyncSwap: return stall.async_swap;
    }
    return stall.sync;
  };
  out.tokens = tokens_served(options.serving, out.sum_before, out.sum_after, out.cost.scheduled_seconds, stall_of(out.stall));
  out.tokens_unscheduled = tokens_served(options.serving, out.sum_before, out.sum_after, out.cost.unscheduled_seconds,
                                         stall_of(out.stall_unscheduled));
  out.tokens_kept = tokens_served(options.serving, out.sum_before, out.sum_before, 0, 0);
  return out;
}

Result<std::vector<RebalanceSimulation>> simulate_policy(const LoadTrace& trace, const Topology& topology,
                                                         const std::string& policy, const EvaluateOptions& evaluate,
                                                         const SimulateOptions& options) {
  std::vector<RebalanceSimulation> results;
  EvaluateOptions replay = evaluate;
  replay.on_rebalance = [&](const WindowResult& row, const Placement& before, const Placement& after,
                            const LoadMatrix& next) -> Status {
    EPLB_ASSIGN_OR_RETURN(RebalanceSimulation simulated, simulate_rebalance(before, after, next, topology, options));
    simulated.window = row;
    results.push_back(std::move(simulated));
    return Status::ok();
  };
  EPLB_TRY(evaluate_policy(trace, topology, policy, replay).status());
  return results;
}

Result<std::vector<RebalanceSimulation>> simulate_sequence(const LoadTrace& trace, const Topology& topology,
                                                           const std::vector<Placement>& placements, int window,
                                                           const SimulateOptions& options) {
  if (window <= 0) return error(Code::InvalidArgument, "window must be > 0 steps");
  std::vector<RebalanceSimulation> results;
  Placement current = default_placement(topology);
  for (size_t i = 0; i < placements.size(); ++i) {
    const int boundary = int(i + 1) * window;
    if (boundary + window > trace.num_steps)
      return error(Code::InvalidArgument, fmt::format("placement {} is for step {}, but the trace has {} steps: no whole "
                                                      "next window", i, boundary, trace.num_steps));
    EPLB_TRY(placements[i].validate_against(topology).with_context(fmt::format("placement {}", i)));
    const LoadMatrix next = trace.sum(boundary, window);
    EPLB_ASSIGN_OR_RETURN(RebalanceSimulation simulated,
                          simulate_rebalance(current, placements[i], next, topology, options));
    simulated.window.boundary = boundary;
    simulated.window.estimator = "sum";  // in sample: the window's plain sum
    simulated.window.in_sample = balancedness(placements[i], trace.sum(boundary - window, window), topology).mean_balancedness;
    results.push_back(std::move(simulated));
    current = placements[i];
  }
  return results;
}

}  // namespace eplb
