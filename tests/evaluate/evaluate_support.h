// Shared inputs of the evaluate tests: a drifting lognormal trace made here
// (these tests link only the evaluate module, not sim) and the topology they
// replay it on.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "eplb/evaluate.h"

namespace eplb::evaluate_support {

// Every expert's log-popularity is a mean-reverting walk; counts are rounded.
inline LoadTrace drifting_trace(int steps, uint64_t seed) {
  LoadTrace trace;
  trace.num_steps = steps;
  trace.num_layers = 3;
  trace.num_experts = 16;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> score(size_t(trace.num_layers * trace.num_experts));
  for (double& value : score) value = normal(rng);
  for (int step = 0; step < trace.num_steps; ++step)
    for (double& value : score) {
      value = 0.98 * value + 0.2 * normal(rng);
      trace.values.push_back(std::round(1000.0 * std::exp(value)));
    }
  return trace;
}

inline const Topology kTopology{3, 16, 24, 4, 2, 8};

}  // namespace eplb::evaluate_support
