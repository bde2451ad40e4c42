// eplb/sim.h - synthetic load traces and synthetic expert weights.
//
// Contract: everything here is a pure function of its arguments (the seed
// included): same arguments, same bytes, on every machine and every run.
// No global random state.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "eplb/placement.h"
#include "eplb/status.h"

namespace eplb {

enum class LoadDistribution { Zipf, Lognormal };

struct LoadGenOptions {
  int num_layers = 58;
  int num_experts = 256;
  LoadDistribution distribution = LoadDistribution::Zipf;
  double skew = 1.0;            // zipf exponent, or lognormal sigma
  int num_steps = 1;            // > 1 gives a drifting trace
  double drift = -1;            // per-step drift of expert popularity; < 0: the default
  double tokens_per_step = 0;   // tokens routed per layer per step (x top-k); 0: a default
  uint64_t seed = 0;
};

// The default drift: chosen so that a placement fitted on one 20-step window
// loses at least 5 points of balancedness on the next (docs/policies.md).
double default_drift();

// A [steps][layers][experts] trace of non-negative integer token counts.
Result<LoadTrace> generate_load_trace(const LoadGenOptions& options);

// Synthetic expert weights: byte `offset` of tensor `tensor` of expert
// `expert` in layer `layer`. fill_expert_bytes writes bytes
// [offset, offset + out.size()) of that tensor. Fast (>= several GB/s).
void fill_expert_bytes(int layer, int expert, int tensor, uint64_t offset, std::span<uint8_t> out);

}  // namespace eplb
