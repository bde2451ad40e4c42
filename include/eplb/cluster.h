// eplb/cluster.h - what a rebalance costs on a cluster: hardware and model
// presets, the migration time with and without the transfer schedule, the
// serving stall of each commit mode, and the tokens served until the next
// rebalance (docs/scale.md).
//
// Contract: pure and deterministic (no clock, no randomness): the same
// placements, topology and cluster give the same numbers on every machine.
// Hosts are the topology's nodes. Times are in seconds, sizes in bytes.
// The network model: every read of a layer is a flow; flows share each
// link max-min fairly (a fluid model of TCP or RDMA flows sharing a NIC);
// a layer ends when its last flow lands, then pays a fixed overhead (vote,
// checksums), and layers run one after another (the executor's per-layer
// protocol). Unscheduled: a layer's flows all start at once. Scheduled: each
// receiver runs its schedule rounds (schedule_transfers) one after another,
// a round starting when its own previous round landed (no global barrier:
// the executor's behaviour).
#pragma once

#include <string>
#include <vector>

#include "eplb/placement.h"
#include "eplb/plan.h"
#include "eplb/status.h"

namespace eplb {

// One kind of host and its network (presets: docs/scale.md, with sources).
struct ClusterSpec {
  std::string name;
  int ranks_per_host = 8;
  LinkBandwidths links;               // per rank NVLink and NIC, per host link (0: unlimited)
  double copy_bytes_per_second = 0;   // device-local copy of rows (staging -> live): HBM bandwidth / 2
  double layer_overhead_seconds = 0;  // fixed cost of a changed layer: vote, checksum exchange
  double commit_seconds = 0;          // serving-thread cost of one layer's swap commit
  std::string source;                 // where the numbers come from
  Status validate() const;
};

// "h100", "h200": 8 GPUs per host, NVLink 4 (450 GB/s per GPU each way),
// one 400 Gb/s NIC per GPU (50 GB/s each way), no host-wide limit.
Result<ClusterSpec> cluster_preset(const std::string& name);
std::vector<std::string> cluster_preset_names();

// One MoE model: its MoE layers, routed experts, expert groups, bytes of one
// routed expert's weights.
struct ModelSpec {
  std::string name;
  int layers = 0;
  int experts = 0;
  int groups = 1;
  double bytes_per_expert = 0;
  std::string source;
};

// "deepseek-v3" (also R1: 58 MoE layers, 256 experts, 8 groups, 44,040,192
// B per FP8 expert), "kimi-k2" (60 MoE layers, 384 experts, FP8),
// "qwen3-235b" (94 MoE layers, 128 experts, BF16).
Result<ModelSpec> model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// The serving shape of `model` on `ranks` GPUs, `ranks_per_host` per host:
// hosts = ranks / ranks_per_host (ranks a multiple of it, or one host when
// ranks < ranks_per_host), slots = the smallest multiple of ranks holding
// experts * 9 / 8 (DeepSeek-V3's 288 for 256 experts on 32 GPUs; one slot
// per GPU at EP320), groups kept only when they divide over the hosts.
Result<Topology> cluster_topology(const ModelSpec& model, int ranks, int ranks_per_host);

// ---- migration time -----------------------------------------------------

// One layer's flows: per (receiver, source) bytes; in rounds when scheduled.
struct LayerCost {
  int layer = 0;
  bool changed = false;             // the plan moves or copies something
  double lower_bound = 0;           // the busiest link's bytes over its bandwidth
  double schedule_makespan = 0;     // the schedule's rounds back to back (TransferSchedule)
  double scheduled = 0;             // fluid, receivers running their rounds in order
  double unscheduled = 0;           // fluid, all reads at once
  double busiest_commit_bytes = 0;  // rows written into live by the busiest rank (copy commit)
};

struct MigrationCost {
  std::vector<LayerCost> layers;
  LinkLoads loads;                  // summed over layers
  double bytes_local = 0, bytes_intra_host = 0, bytes_inter_host = 0;
  int layers_changed = 0;
  // Sums over layers, each changed layer plus ClusterSpec::layer_overhead_seconds.
  double lower_bound_seconds = 0;
  double scheduled_seconds = 0;
  double unscheduled_seconds = 0;
  double schedule_makespan_seconds = 0;
};

Result<MigrationCost> migration_cost(const Placement& before, const Placement& after, const Topology& topology,
                                     const ClusterSpec& cluster, double bytes_per_expert);

// One layer's price as the cost-aware policy weighs it, without the fluid
// model (fast enough for many candidates per layer): its lower bound plus
// the overhead when it changes (the schedule and the fluid model land
// within a few percent of the bound, docs/scale.md), and its stall per
// commit mode (serving_stall's rules).
struct LayerPrice {
  bool changed = false;
  double seconds = 0;
  double stall_copy = 0;
  double stall_swap = 0;
};
LayerPrice layer_price(const LayerPlan& plan, const Topology& topology, const ClusterSpec& cluster,
                       double bytes_per_expert);

// The fluid model alone, for one layer plan: all reads at once
// (`rounds` == nullptr) or each receiver's schedule rounds in order.
double fluid_layer_seconds(const LayerPlan& plan, const Topology& topology, const LinkBandwidths& links,
                           double bytes_per_expert, const TransferSchedule* rounds);

// ---- serving ------------------------------------------------------------

// Seconds the serving engine stops for one rebalance:
//   sync        the whole migration (serving waits for it);
//   async_copy  per changed layer, the busiest rank's copy of its new rows
//               staging -> live at the commit step, plus commit_seconds;
//   async_swap  per changed layer, commit_seconds (a buffer swap).
struct ServingStall {
  double sync = 0, async_copy = 0, async_swap = 0;
};
ServingStall serving_stall(const MigrationCost& cost, const ClusterSpec& cluster, bool scheduled);

enum class StallMode { Sync, AsyncCopy, AsyncSwap };
Result<StallMode> parse_stall_mode(const std::string& name);  // "sync", "async-copy", "async-swap"
std::string to_string(StallMode mode);

// Serving between two rebalances: a step takes step_seconds / balancedness
// (the most loaded rank sets it; balancedness as sum of mean rank loads
// over sum of max rank loads), a step serves tokens_per_step.
struct ServingModel {
  double step_seconds = 0.05;        // at perfect balance
  double tokens_per_step = 4096;
  double interval_seconds = 600;     // between rebalances
  StallMode mode = StallMode::Sync;
  Status validate() const;
};

// Tokens served in one interval after a rebalance that takes `migration`
// seconds and stalls serving `stall` seconds: sync stops for the migration
// and then serves at `balance_after`; async serves at `balance_before`
// while the migration runs, then at `balance_after`, minus the stall.
double tokens_served(const ServingModel& serving, double balance_before, double balance_after, double migration,
                     double stall);

}  // namespace eplb
