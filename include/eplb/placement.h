// eplb/placement.h - the placement model: Topology, LoadMatrix, Placement,
// the default initial placement and the balance metrics.
//
// Contract:
// - Topology describes one expert-parallel group: L layers, E logical
//   experts, R physical slots per layer, G expert groups, N nodes, P ranks.
//   Rank r owns slots [r*R/P, (r+1)*R/P) of every layer; node n owns ranks
//   [n*P/N, (n+1)*P/N). validate() explains the first violated rule.
// - LoadMatrix is a dense [L][E] matrix of non-negative finite loads;
//   LoadTrace a [steps][L][E] window of them, summed into a LoadMatrix.
// - Placement holds, for every layer, phy2log[R], logcnt[E] and
//   log2phy[E][max_replicas] (-1 padded, replica k of expert e in the order
//   the policy assigned them). validate() checks every invariant: each
//   expert has >= 1 replica, counts add up to R, log2phy is the inverse of
//   phy2log.
// - Metrics: a replica carries load[e] / logcnt[e]; a rank's load is the sum
//   over its slots; balancedness of a layer is mean rank load / max rank load
//   (1.0 when the layer has no load at all).
// All functions are pure and deterministic.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eplb/status.h"

namespace eplb {

// Documented size caps (docs/operations.md "Size limits"), checked before any
// table is sized: experts and slots per layer, and entries of one
// [layers][slots] or [layers][experts] table (256 MiB of int32).
inline constexpr int kMaxExpertsPerLayer = 1 << 20;
inline constexpr int kMaxSlotsPerLayer = 1 << 20;
inline constexpr int64_t kMaxTableEntries = int64_t(1) << 26;

struct Topology {
  int num_layers = 0;
  int num_experts = 0;  // logical experts per layer (E)
  int num_slots = 0;    // physical slots per layer (R)
  int num_groups = 1;   // expert groups (G)
  int num_nodes = 1;    // nodes (N)
  int num_ranks = 1;    // ranks (P)

  Status validate() const;

  int slots_per_rank() const { return num_slots / num_ranks; }
  int ranks_per_node() const { return num_ranks / num_nodes; }
  int experts_per_group() const { return num_experts / num_groups; }
  int rank_of_slot(int slot) const { return slot / slots_per_rank(); }
  int node_of_rank(int rank) const { return rank / ranks_per_node(); }
  int node_of_slot(int slot) const { return node_of_rank(rank_of_slot(slot)); }
  // DeepSeek's hierarchical variant applies when groups divide evenly over nodes.
  bool hierarchical() const { return num_groups % num_nodes == 0; }

  // "L=58 E=256 R=288 G=8 N=4 P=32"
  std::string to_string() const;
  bool operator==(const Topology&) const = default;
};

// The serving shapes eplb knows by name: "deepseek-v3" (58 layers, 256
// experts, 288 slots, 8 groups, 4 nodes, 32 ranks), "qwen3-235b",
// "mixtral-8x7b", "tiny".
Result<Topology> topology_preset(const std::string& name);

struct LoadMatrix {
  int num_layers = 0;
  int num_experts = 0;
  std::vector<double> values;  // row-major [num_layers][num_experts]

  LoadMatrix() = default;
  LoadMatrix(int layers, int experts) : num_layers(layers), num_experts(experts), values(size_t(layers) * experts, 0.0) {}

  double& at(int layer, int expert) { return values[size_t(layer) * num_experts + expert]; }
  double at(int layer, int expert) const { return values[size_t(layer) * num_experts + expert]; }
  std::span<const double> layer(int layer) const {
    return {values.data() + size_t(layer) * num_experts, size_t(num_experts)};
  }
  // Checks shape, and that every value is finite and >= 0.
  Status validate() const;
};

// A window of per-step loads: [steps][layers][experts].
struct LoadTrace {
  int num_steps = 0;
  int num_layers = 0;
  int num_experts = 0;
  std::vector<double> values;  // row-major [num_steps][num_layers][num_experts]

  double at(int step, int layer, int expert) const {
    return values[(size_t(step) * num_layers + layer) * num_experts + expert];
  }
  // Sum of steps [first, first + count) as a [L][E] matrix.
  LoadMatrix sum(int first, int count) const;
};

class Placement {
 public:
  Placement() = default;
  // An all-empty placement (phy2log = -1) of the given shape.
  Placement(int num_layers, int num_experts, int num_slots, int max_replicas);

  // Builds logcnt and log2phy from phy2log, replicas ordered by slot index.
  static Result<Placement> from_phy2log(int num_layers, int num_experts, int num_slots,
                                        std::vector<int32_t> phy2log);
  // Adopts all three arrays (as a policy produced them) and validates them.
  static Result<Placement> from_arrays(int num_layers, int num_experts, int num_slots, int max_replicas,
                                       std::vector<int32_t> phy2log, std::vector<int32_t> log2phy,
                                       std::vector<int32_t> logcnt);
  // The same without the O(L * E * max_replicas) validation, for a producer
  // that guarantees the invariants and whose tests check them (the deepseek
  // policy); debug builds (no NDEBUG) still validate and abort on a violation.
  static Placement from_arrays_unchecked(int num_layers, int num_experts, int num_slots, int max_replicas,
                                         std::vector<int32_t> phy2log, std::vector<int32_t> log2phy,
                                         std::vector<int32_t> logcnt);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int num_slots() const { return num_slots_; }
  int max_replicas() const { return max_replicas_; }

  int32_t phy2log(int layer, int slot) const { return phy2log_[size_t(layer) * num_slots_ + slot]; }
  int32_t logcnt(int layer, int expert) const { return logcnt_[size_t(layer) * num_experts_ + expert]; }
  int32_t log2phy(int layer, int expert, int replica) const {
    return log2phy_[(size_t(layer) * num_experts_ + expert) * max_replicas_ + replica];
  }
  std::span<const int32_t> layer_phy2log(int layer) const {
    return {phy2log_.data() + size_t(layer) * num_slots_, size_t(num_slots_)};
  }
  std::span<const int32_t> layer_logcnt(int layer) const {
    return {logcnt_.data() + size_t(layer) * num_experts_, size_t(num_experts_)};
  }

  const std::vector<int32_t>& phy2log_data() const { return phy2log_; }
  const std::vector<int32_t>& log2phy_data() const { return log2phy_; }
  const std::vector<int32_t>& logcnt_data() const { return logcnt_; }

  // Replaces one layer's mapping (e.g. after a committed migration) with
  // another placement's layer of the same shape; re-pads log2phy if needed.
  Status set_layer(int layer, const Placement& source, int source_layer);

  // Checks every invariant and the shape against the topology (if given).
  Status validate() const;
  Status validate_against(const Topology& topology) const;

  bool operator==(const Placement&) const = default;

 private:
  // Adopts the arrays as they are (from_arrays and from_arrays_unchecked).
  Placement(std::vector<int32_t> phy2log, std::vector<int32_t> log2phy, std::vector<int32_t> logcnt, int num_layers,
            int num_experts, int num_slots, int max_replicas);

  int num_layers_ = 0;
  int num_experts_ = 0;
  int num_slots_ = 0;
  int max_replicas_ = 0;
  std::vector<int32_t> phy2log_;  // [L][R]
  std::vector<int32_t> log2phy_;  // [L][E][max_replicas]
  std::vector<int32_t> logcnt_;   // [L][E]
};

// Slot s holds expert s for s < E and expert (s - E) mod E for redundant slots.
Placement default_placement(const Topology& topology);

// Per-layer rank loads: a replica carries load[e] / logcnt[e].
std::vector<double> rank_loads(const Placement& placement, const LoadMatrix& load, const Topology& topology,
                               int layer);

struct BalanceSummary {
  std::vector<double> per_layer;   // mean / max rank load of each layer
  std::vector<double> max_load;    // max rank load of each layer
  std::vector<double> mean_load;   // mean rank load of each layer
  double mean_balancedness = 1.0;  // mean over layers of per_layer
  double sum_balancedness = 1.0;   // sum of means / sum of maxes
};

BalanceSummary balancedness(const Placement& placement, const LoadMatrix& load, const Topology& topology);

// Slots whose expert differs between two placements of one shape, per layer.
std::vector<int> slots_changed(const Placement& before, const Placement& after);

}  // namespace eplb
