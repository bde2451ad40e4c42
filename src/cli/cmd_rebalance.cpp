// eplb rebalance: computes a new placement from expert loads with a policy,
// and reports balancedness before and after (and, with --current, what moves).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "eplb/common.h"
#include "eplb/placement.h"
#include "eplb/placement_io.h"
#include "eplb/plan.h"
#include "eplb/policy.h"
#include "eplb/sim.h"

namespace eplb::cli {
namespace {

// One DeepSeek-V3 routed expert in FP8: gate, up and down projections,
// 3 x 7168 x 2048 bytes (42 MiB).
constexpr uint64_t kDefaultBytesPerExpert = 3ull * 7168 * 2048;

struct RebalanceArgs {
  std::string load_path;
  std::string preset = "deepseek-v3";
  int replicas = 0, groups = 0, nodes = 0, ranks = 0;
  uint64_t seed = 0;
  std::string policy = "deepseek";
  std::string current_path;
  std::string out_path;
  std::string format = "table";
  int threads = 1;
  uint64_t bytes_per_expert = kDefaultBytesPerExpert;
  PolicyOptions options;
};

struct Moved {
  int64_t slots_changed = 0;
  PlanStats plan;
  uint64_t bytes_local = 0, bytes_intra_node = 0, bytes_inter_node = 0;
  std::vector<int> per_layer;
};

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

Status run_rebalance(RebalanceArgs args) {
  // Topology: the preset, with layers and experts from the load file (if
  // any) and slots, groups, nodes and ranks from the flags (if given).
  EPLB_ASSIGN_OR_RETURN(Topology topology, topology_preset(args.preset));
  LoadMatrix load;
  std::string load_source;
  if (!args.load_path.empty()) {
    EPLB_ASSIGN_OR_RETURN(load, read_load_file(args.load_path));
    topology.num_layers = load.num_layers;
    topology.num_experts = load.num_experts;
    load_source = args.load_path;
  }
  if (args.replicas > 0) topology.num_slots = args.replicas;
  if (args.groups > 0) topology.num_groups = args.groups;
  if (args.nodes > 0) topology.num_nodes = args.nodes;
  if (args.ranks > 0) topology.num_ranks = args.ranks;
  EPLB_TRY(topology.validate().with_context("rebalance"));
  if (args.load_path.empty()) {
    LoadGenOptions generate;
    generate.num_layers = topology.num_layers;
    generate.num_experts = topology.num_experts;
    generate.seed = args.seed;
    EPLB_ASSIGN_OR_RETURN(LoadTrace trace, generate_load_trace(generate));
    load = trace.sum(0, trace.num_steps);
    load_source = "generated (" + args.preset + "-shaped zipf, seed " + std::to_string(args.seed) +
                  "; pass --load FILE for measured loads)";
  }

  Placement current = default_placement(topology);
  if (!args.current_path.empty()) {
    EPLB_ASSIGN_OR_RETURN(PlacementFile file, read_placement_file(args.current_path));
    EPLB_TRY(file.placement.validate_against(topology).with_context("--current " + args.current_path));
    if (file.topology.num_ranks != topology.num_ranks)
      return error(Code::Mismatch, "--current " + args.current_path + ": its topology " +
                                       file.topology.to_string() + " spreads the slots over " +
                                       std::to_string(file.topology.num_ranks) + " ranks, not " +
                                       std::to_string(topology.num_ranks));
    current = std::move(file.placement);
  }

  EPLB_ASSIGN_OR_RETURN(auto policy, make_policy(args.policy));
  args.options.threads = args.threads;
  Stopwatch watch;
  auto placed = policy->place(load, topology, current, args.options);
  const double policy_seconds = watch.seconds();
  if (!placed.is_ok()) return placed.status().with_context("rebalance");
  const Placement& placement = *placed;

  BalanceSummary before = balancedness(current, load, topology);
  BalanceSummary after = balancedness(placement, load, topology);
  const bool with_current = !args.current_path.empty();
  Moved moved;
  if (with_current) {
    moved.per_layer = slots_changed(current, placement);
    for (int changed : moved.per_layer) moved.slots_changed += changed;
    EPLB_ASSIGN_OR_RETURN(MigrationPlan plan, plan_migration(current, placement, topology));
    moved.plan = plan.stats;
    moved.bytes_local = uint64_t(plan.stats.slots_local_copy) * args.bytes_per_expert;
    moved.bytes_intra_node = uint64_t(plan.stats.slots_read_intra_node) * args.bytes_per_expert;
    moved.bytes_inter_node = uint64_t(plan.stats.slots_read_inter_node) * args.bytes_per_expert;
  }
  const int64_t total_slots = int64_t(topology.num_layers) * topology.num_slots;

  if (!args.out_path.empty()) {
    nlohmann::json extra = {{"policy", args.policy},
                            {"balancedness_mean", after.mean_balancedness},
                            {"balancedness_sum", after.sum_balancedness}};
    EPLB_TRY(write_placement_file(args.out_path, placement, topology, extra.dump()));
  }

  const char* variant = topology.hierarchical() ? "hierarchical" : "global";
  if (args.format == "json") {
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < topology.num_layers; ++l) {
      nlohmann::json row = {{"layer", l},
                            {"before", before.per_layer[l]},
                            {"after", after.per_layer[l]},
                            {"max_rank_load_before", before.max_load[l]},
                            {"max_rank_load_after", after.max_load[l]},
                            {"mean_rank_load", after.mean_load[l]}};
      if (with_current) row["slots_moved"] = moved.per_layer[l];
      layers.push_back(row);
    }
    nlohmann::json out = {
        {"policy", args.policy},
        {"topology",
         {{"layers", topology.num_layers},
          {"experts", topology.num_experts},
          {"slots", topology.num_slots},
          {"groups", topology.num_groups},
          {"nodes", topology.num_nodes},
          {"ranks", topology.num_ranks},
          {"variant", variant}}},
        {"load", load_source},
        {"before_placement", with_current ? args.current_path : std::string("default")},
        {"per_layer", layers},
        {"summary",
         {{"before", {{"mean_balancedness", before.mean_balancedness}, {"sum_balancedness", before.sum_balancedness}}},
          {"after", {{"mean_balancedness", after.mean_balancedness}, {"sum_balancedness", after.sum_balancedness}}}}},
        {"policy_seconds", policy_seconds},
        {"threads", args.threads}};
    if (with_current)
      out["moved"] = {{"slots", moved.slots_changed},
                      {"slots_total", total_slots},
                      {"slots_kept", moved.plan.slots_kept},
                      {"slots_local_copy", moved.plan.slots_local_copy},
                      {"slots_read_intra_node", moved.plan.slots_read_intra_node},
                      {"slots_read_inter_node", moved.plan.slots_read_inter_node},
                      {"bytes_per_expert", args.bytes_per_expert},
                      {"bytes_local_copy", moved.bytes_local},
                      {"bytes_intra_node", moved.bytes_intra_node},
                      {"bytes_inter_node", moved.bytes_inter_node},
                      {"bytes_over_network", moved.bytes_intra_node + moved.bytes_inter_node}};
    if (!args.out_path.empty()) out["out"] = args.out_path;
    std::printf("%s\n", out.dump(2).c_str());
    return Status::ok();
  }

  std::printf("eplb rebalance: policy %s, %s (%s variant)\n", args.policy.c_str(), topology.to_string().c_str(),
              variant);
  std::printf("load: %s\n", load_source.c_str());
  std::printf("before: %s\n", with_current ? ("--current " + args.current_path).c_str()
                                           : "the default placement (slot s holds expert s mod E)");
  std::printf("\n%5s  %8s  %8s  %14s  %14s%s\n", "layer", "before", "after", "max load before", "max load after",
              with_current ? "  slots moved" : "");
  for (int l = 0; l < topology.num_layers; ++l) {
    std::printf("%5d  %8.4f  %8.4f  %14.1f  %14.1f", l, before.per_layer[l], after.per_layer[l],
                before.max_load[l], after.max_load[l]);
    if (with_current) std::printf("  %11d", moved.per_layer[l]);
    std::printf("\n");
  }
  std::printf("\nbalancedness (mean rank load / max rank load; 1.0 is perfect)\n");
  std::printf("  mean over layers:           %s -> %s\n", fixed(before.mean_balancedness, 4).c_str(),
              fixed(after.mean_balancedness, 4).c_str());
  std::printf("  sum of means / sum of maxes: %s -> %s\n", fixed(before.sum_balancedness, 4).c_str(),
              fixed(after.sum_balancedness, 4).c_str());
  std::printf("policy time: %s (%d thread%s)\n", format_seconds(policy_seconds).c_str(), args.threads,
              args.threads == 1 ? "" : "s");
  if (with_current) {
    std::printf("moved vs --current: %lld of %lld slots rewritten (%s%%): %lld local copies, %lld intra-node "
                "reads, %lld inter-node reads\n",
                static_cast<long long>(moved.slots_changed), static_cast<long long>(total_slots),
                fixed(100.0 * double(moved.slots_changed) / double(total_slots), 1).c_str(),
                static_cast<long long>(moved.plan.slots_local_copy),
                static_cast<long long>(moved.plan.slots_read_intra_node),
                static_cast<long long>(moved.plan.slots_read_inter_node));
    std::printf("bytes (%s per expert): %s over the network (%s intra-node, %s inter-node), %s copied locally\n",
                format_bytes(args.bytes_per_expert).c_str(),
                format_bytes(moved.bytes_intra_node + moved.bytes_inter_node).c_str(),
                format_bytes(moved.bytes_intra_node).c_str(), format_bytes(moved.bytes_inter_node).c_str(),
                format_bytes(moved.bytes_local).c_str());
  }
  if (!args.out_path.empty()) std::printf("wrote %s\n", args.out_path.c_str());
  return Status::ok();
}

void add_rebalance(CLI::App& app) {
  auto args = std::make_shared<RebalanceArgs>();
  CLI::App* command = app.add_subcommand(
      "rebalance",
      "Compute a new expert placement from expert loads with a policy and report balancedness\n"
      "(mean rank load / max rank load, per layer) before and after. Without --load, uses a\n"
      "generated load of the preset's shape. Defaults: the DeepSeek-V3 serving shape (58 layers,\n"
      "256 experts, 288 slots, 8 groups, 4 nodes, 32 ranks) and the `deepseek` policy.");
  command->add_option("--load", args->load_path,
                      "Expert loads [L][E] (.npy, .csv, .json; a [W][L][E] .npy/.json trace is summed over W).\n"
                      "Its shape sets the layers and experts. Default: a generated zipf load (see --seed)");
  command->add_option("--preset", args->preset,
                      "Serving shape giving the defaults: deepseek-v3 (L=58 E=256 R=288 G=8 N=4 P=32),\n"
                      "qwen3-235b, mixtral-8x7b, tiny")
      ->check(CLI::IsMember({"deepseek-v3", "qwen3-235b", "mixtral-8x7b", "tiny"}))
      ->capture_default_str();
  command->add_option("--replicas", args->replicas, "Physical slots R per layer (>= E, a multiple of --ranks)")
      ->check(CLI::PositiveNumber);
  command->add_option("--groups", args->groups,
                      "Expert groups G (E a multiple of G); G % N == 0 selects DeepSeek's hierarchical variant")
      ->check(CLI::PositiveNumber);
  command->add_option("--nodes", args->nodes, "Nodes N (ranks a multiple of N)")->check(CLI::PositiveNumber);
  command->add_option("--ranks", args->ranks, "Ranks P (GPUs); each holds R / P slots")
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", args->seed, "Seed of the generated load (without --load)")->capture_default_str();
  std::string names;
  for (const auto& name : policy_names()) names += (names.empty() ? "" : ", ") + name;
  command->add_option("--policy", args->policy, "Placement policy: " + names)
      ->check(CLI::IsMember(policy_names()))
      ->capture_default_str();
  command->add_option("--current", args->current_path,
                      "Placement in force (a JSON written by --out): the policy starts from it, 'before' is\n"
                      "measured on it, and the report adds the slots and bytes moved relative to it");
  command->add_option("--out", args->out_path,
                      "Write the new placement as JSON (topology, phy2log, log2phy, logcnt, policy, metrics)");
  command->add_option("--format", args->format, "Output: table, or json (metrics and policy_seconds)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  command->add_option("--threads", args->threads,
                      "Threads for independent layers (the result is the same for any count)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_option("--bytes-per-expert", args->bytes_per_expert,
                      "Bytes of one expert's weights, for the bytes moved with --current; default\n"
                      "44040192 (42 MiB: a DeepSeek-V3 routed expert in FP8, 3 x 7168 x 2048)")
      ->check(CLI::PositiveNumber);
  command->add_option("--budget", args->options.budget,
                      "incremental: slots rewritten per layer; < 1 a fraction of R, >= 1 a count")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_flag("--anti-affinity", args->options.anti_affinity,
                    "Never two replicas of one expert on one rank (an error when impossible; deepseek: post-processing)");
  command->add_option("--min-gain", args->options.min_gain,
                      "Hysteresis: keep a layer's current placement if its balancedness would gain less")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--move-threshold", args->options.move_threshold,
                      "incremental: stop when the best move improves the max rank load by <= this (relative)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->callback([args] { set_command_result(run_rebalance(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(10, add_rebalance);

}  // namespace eplb::cli
