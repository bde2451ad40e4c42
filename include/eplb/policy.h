// eplb/policy.h - placement policies, by name.
//
// Contract: a policy is a pure, deterministic function
//   (load [L][E], topology, current placement, options) -> new placement
// Same inputs, same output on every rank and every run, whatever the number
// of threads. Layers are independent and may be computed in parallel.
// `deepseek` reproduces DeepSeek's published EPLB algorithm exactly (float32
// arithmetic and the tie rules documented in docs/policies.md) and ignores
// the current placement.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eplb/placement.h"
#include "eplb/status.h"

namespace eplb {

struct PolicyOptions {
  int threads = 1;              // worker threads for independent layers
  bool anti_affinity = false;   // never two replicas of one expert on one rank
  double min_gain = 0.0;        // hysteresis: keep a layer if balancedness gains less than this
  double budget = 0.1;          // incremental: slots rewritten per layer; < 1 a fraction of R, >= 1 a count
  double move_threshold = 0.0;  // incremental: stop when a move improves max rank load by <= this (relative)
  // cost-aware (docs/scale.md): the cluster preset that prices a migration
  // (eplb/cluster.h; the topology's nodes are its hosts), the seconds
  // between rebalances, the bytes of one expert, and how serving waits for
  // the migration: "sync", "async-copy" or "async-swap". Defaults: a
  // DeepSeek-V3 deployment (FP8 experts) on H100 hosts, rebalanced every
  // 10 minutes, serving paused during the migration.
  std::string cluster = "h100";
  double interval_seconds = 600;
  double bytes_per_expert = 44040192;
  std::string stall_mode = "sync";
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // `current` is the placement in force (same topology); policies that do not
  // care about it ignore it.
  virtual Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                                  const PolicyOptions& options) const = 0;
};

// "deepseek", "relabel", "incremental", "balanced", "cost-aware".
Result<std::unique_ptr<Policy>> make_policy(const std::string& name);
std::vector<std::string> policy_names();

// DeepSeek's algorithm, directly (the `deepseek` policy).
Result<Placement> deepseek_placement(const LoadMatrix& load, const Topology& topology, int threads = 1);

// The same split in two, for a caller that keeps the results in its own
// buffers and types (the Python binding writes int64 straight into numpy's):
// deepseek_arrays computes phy2log, phyrank (the replica rank of each slot's
// expert, [L][R]) and logcnt ([L][E]); write_log2phy then writes log2phy
// ([L][E][max_replicas], -1 padded) into out, identical to
// deepseek_placement's.
struct DeepSeekArrays {
  int num_layers = 0, num_experts = 0, num_slots = 0, max_replicas = 0;
  std::vector<int32_t> phy2log, phyrank, logcnt;
};
Result<DeepSeekArrays> deepseek_arrays(const LoadMatrix& load, const Topology& topology, int threads = 1);
// The same over a caller's [L][E] loads, borrowed for the call (a numpy
// array's buffer: no copy). Invalid values are found while they are read.
struct LoadView {
  const double* values = nullptr;  // row-major [num_layers][num_experts]
  int num_layers = 0, num_experts = 0;
};
Result<DeepSeekArrays> deepseek_arrays(LoadView load, const Topology& topology, int threads = 1);
// Defined for int32_t and int64_t; out holds L * E * max_replicas values.
template <typename Index>
void write_log2phy(const DeepSeekArrays& arrays, Index* out, int threads = 1);

}  // namespace eplb
