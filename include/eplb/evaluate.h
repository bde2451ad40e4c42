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
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "eplb/estimator.h"
#include "eplb/placement.h"
#include "eplb/policy.h"
#include "eplb/status.h"

namespace eplb {

struct EvaluateOptions {
  int window = 20;   // K, steps per window
  int history = 1;   // windows the estimator looks back over
  Estimator estimator;
  PolicyOptions policy;
  double bytes_per_expert = 0;
  // Called now and then with a one-line progress message (may be empty).
  std::function<void(const std::string&)> progress;
};

struct WindowResult {
  int boundary = 0;  // first step of the next window
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

}  // namespace eplb
