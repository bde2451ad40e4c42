// eplb/evaluate.h - judging policies out of sample by replaying a load trace.
//
// Contract: evaluate_policy replays a [W][L][E] trace window by window.
// Each policy has its own chain, starting from default_placement. At every
// boundary b = K, 2K, ... (while a whole next window [b, b + K) exists) it
// estimates the load from the past `history` windows (steps
// [max(0, b - history * K), b)) with the estimator, asks the policy for a
// new placement starting from the one in force, and measures:
//   in_sample    balancedness (mean over layers) of the new placement on the
//                load it was planned from;
//   next_window  balancedness of the new placement on the plain sum of the
//                next window [b, b + K) (the number that matters);
//   stale_next   balancedness of the placement in force before the
//                rebalance on that same next window;
//   slots_moved  slots whose expert changed (all layers), bytes_moved the
//                same times bytes_per_expert;
//   seconds      wall time of the policy call, cpu_seconds the process CPU
//                time it used (all threads; on a machine shared with other
//                work the CPU time is the fairer number). The only
//                non-deterministic fields.
// Everything except the times is a pure function of the inputs.
//
// simulate_policy (docs/scale.md) is the same replay with each rebalance
// priced on a cluster (eplb/cluster.h): migration time with and without the
// transfer schedule, link loads, serving stalls and the tokens served until
// the next rebalance. simulate_sequence prices a sequence of placements
// chosen by any policy (one per boundary, e.g. an external one).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "eplb/cluster.h"
#include "eplb/estimator.h"
#include "eplb/placement.h"
#include "eplb/policy.h"
#include "eplb/status.h"

namespace eplb {

struct WindowResult;

struct EvaluateOptions {
  int window = 20;   // K, steps per window
  int history = 1;   // windows the estimator looks back over
  Estimator estimator;
  PolicyOptions policy;
  double bytes_per_expert = 0;
  // Called now and then with a one-line progress message (may be empty).
  std::function<void(const std::string&)> progress;
  // Called after each rebalance with its row, the placement in force before
  // it, the new one and the next window's load; a failure stops the replay.
  std::function<Status(const WindowResult&, const Placement& before, const Placement& after, const LoadMatrix& next)>
      on_rebalance;
};

struct WindowResult {
  int boundary = 0;        // first step of the next window
  std::string estimator;   // the estimator as applied ("auto" resolved: "ema:2", "sum")
  double in_sample = 0;
  double next_window = 0;
  double stale_next = 0;
  int64_t slots_moved = 0;
  double bytes_moved = 0;
  double seconds = 0;
  double cpu_seconds = 0;
};

struct PolicyEvaluation {
  std::string policy;
  std::vector<WindowResult> windows;

  double mean_in_sample() const;
  double mean_next_window() const;
  double mean_slots_moved() const;
  int64_t max_slots_moved() const;
  double mean_bytes_moved() const;
  double max_bytes_moved() const;
  double median_seconds() const;
  double median_cpu_seconds() const;
};

Result<PolicyEvaluation> evaluate_policy(const LoadTrace& trace, const Topology& topology, const std::string& policy,
                                         const EvaluateOptions& options);

// ---- simulate: the replay priced on a cluster ---------------------------

struct SimulateOptions {
  ClusterSpec cluster;
  double bytes_per_expert = 0;
  ServingModel serving;
};

struct RebalanceSimulation {
  WindowResult window;         // as evaluate_policy's row
  double sum_before = 0;       // placement in force before, on the next window (sum of means / sum of maxes)
  double sum_after = 0;        // the new placement on the next window, the same way
  MigrationCost cost;
  ServingStall stall;              // with the transfer schedule
  ServingStall stall_unscheduled;  // all reads at once
  double tokens = 0;               // served until the next rebalance (serving.mode), with the schedule
  double tokens_unscheduled = 0;
  double tokens_kept = 0;          // had the placement in force been kept (no migration)
};

// One rebalance from `before` to `after`, judged on `next` (the load until
// the next rebalance).
Result<RebalanceSimulation> simulate_rebalance(const Placement& before, const Placement& after, const LoadMatrix& next,
                                               const Topology& topology, const SimulateOptions& options);
// evaluate_policy's replay, every rebalance priced.
Result<std::vector<RebalanceSimulation>> simulate_policy(const LoadTrace& trace, const Topology& topology,
                                                         const std::string& policy, const EvaluateOptions& evaluate,
                                                         const SimulateOptions& options);
// A given sequence: placements[i] is the one chosen at boundary (i + 1) * window
// (the first replaces default_placement).
Result<std::vector<RebalanceSimulation>> simulate_sequence(const LoadTrace& trace, const Topology& topology,
                                                           const std::vector<Placement>& placements, int window,
                                                           const SimulateOptions& options);

}  // namespace eplb
