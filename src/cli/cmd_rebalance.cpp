// eplb rebalance: computes a new placement from expert loads with a policy,
// and reports balancedness before and after (and, with --current, what moves).
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "options.h"
#include "common/text.h"
#include "eplb/common.h"
#include "eplb/placement.h"
#include "eplb/placement_io.h"
#include "eplb/plan.h"
#include "eplb/policy.h"
#include "eplb/sim.h"

namespace eplb::cli {
namespace {


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
  // One DeepSeek-V3 routed expert in FP8: gate, up and down projections,
  // 3 x 7168 x 2048 bytes (42 MiB).
  std::string bytes_per_expert = "42MiB";
  std::string max_input_bytes;
  PolicyOptions options;
};

struct Moved {
  int64_t slots_changed = 0;
  PlanStats plan;
  uint64_t bytes_local = 0, bytes_intra_node = 0, bytes_inter_node = 0;
  std::vector<int> per_layer;
};

// Everything the report shows.
struct Rebalanced {
  Topology topology;
  LoadMatrix load;
  std::string load_source;
  Placement current, placement;
  double policy_seconds = 0;
  BalanceSummary before, after;
  bool with_current = false;
  Moved moved;
  uint64_t bytes_per_expert = 0;
};

// Topology: the preset, with layers and experts from the load file (if any)
// and slots, groups, nodes and ranks from the flags (if given); the load
// from the file, or generated.
Status load_inputs(const RebalanceArgs& args, Rebalanced& out) {
  EPLB_ASSIGN_OR_RETURN(out.topology, topology_preset(args.preset));
  Topology& topology = out.topology;
  if (!args.load_path.empty()) {
    EPLB_ASSIGN_OR_RETURN(uint64_t max_input_bytes, parse_max_input_bytes(args.max_input_bytes));
    EPLB_ASSIGN_OR_RETURN(out.load, read_load_file(args.load_path, 0, max_input_bytes));
    topology.num_layers = out.load.num_layers;
    topology.num_experts = out.load.num_experts;
    out.load_source = args.load_path;
  }
  if (args.replicas > 0) topology.num_slots = args.replicas;
  if (args.groups > 0) topology.num_groups = args.groups;
  if (args.nodes > 0) topology.num_nodes = args.nodes;
  if (args.ranks > 0) topology.num_ranks = args.ranks;
  EPLB_TRY(topology.validate().with_context("rebalance"));
  if (!args.load_path.empty()) return Status::ok();
  LoadGenOptions generate;
  generate.num_layers = topology.num_layers;
  generate.num_experts = topology.num_experts;
  generate.seed = args.seed;
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, generate_load_trace(generate));
  out.load = trace.sum(0, trace.num_steps);
  out.load_source = fmt::format("generated ({}-shaped zipf, seed {}; pass --load FILE for measured loads)",
                                args.preset, args.seed);
  return Status::ok();
}

Status load_current(const RebalanceArgs& args, Rebalanced& out) {
  out.current = default_placement(out.topology);
  out.with_current = !args.current_path.empty();
  if (!out.with_current) return Status::ok();
  EPLB_ASSIGN_OR_RETURN(uint64_t max_input_bytes, parse_max_input_bytes(args.max_input_bytes));
  EPLB_ASSIGN_OR_RETURN(PlacementFile file, read_placement_file(args.current_path, max_input_bytes));
  EPLB_TRY(file.placement.validate_against(out.topology).with_context("--current " + args.current_path));
  if (file.topology.num_ranks != out.topology.num_ranks)
    return error(Code::Mismatch, fmt::format("--current {}: its topology {} spreads the slots over {} ranks, not {}",
                                             args.current_path, file.topology.to_string(), file.topology.num_ranks,
                                             out.topology.num_ranks));
  out.current = std::move(file.placement);
  return Status::ok();
}

Status measure_moves(Rebalanced& out) {
  Moved& moved = out.moved;
  moved.per_layer = slots_changed(out.current, out.placement);
  for (int changed : moved.per_layer) moved.slots_changed += changed;
  EPLB_ASSIGN_OR_RETURN(MigrationPlan plan, plan_migration(out.current, out.placement, out.topology));
  moved.plan = plan.stats;
  moved.bytes_local = uint64_t(plan.stats.slots_local_copy) * out.bytes_per_expert;
  moved.bytes_intra_node = uint64_t(plan.stats.slots_read_intra_node) * out.bytes_per_expert;
  moved.bytes_inter_node = uint64_t(plan.stats.slots_read_inter_node) * out.bytes_per_expert;
  return Status::ok();
}

nlohmann::json layers_json(const Rebalanced& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < r.topology.num_layers; ++l) {
    nlohmann::json row = {{"layer", l},
                          {"before", r.before.per_layer[l]},
                          {"after", r.after.per_layer[l]},
                          {"max_rank_load_before", r.before.max_load[l]},
                          {"max_rank_load_after", r.after.max_load[l]},
                          {"mean_rank_load", r.after.mean_load[l]}};
    if (r.with_current) row["slots_moved"] = r.moved.per_layer[l];
    layers.push_back(row);
  }
  return layers;
}

nlohmann::json moved_json(const Rebalanced& r) {
  const Moved& moved = r.moved;
  return {{"slots", moved.slots_changed},
          {"slots_total", int64_t(r.topology.num_layers) * r.topology.num_slots},
          {"slots_kept", moved.plan.slots_kept},
          {"slots_local_copy", moved.plan.slots_local_copy},
          {"slots_read_intra_node", moved.plan.slots_read_intra_node},
          {"slots_read_inter_node", moved.plan.slots_read_inter_node},
          {"bytes_per_expert", r.bytes_per_expert},
          {"bytes_local_copy", moved.bytes_local},
          {"bytes_intra_node", moved.bytes_intra_node},
          {"bytes_inter_node", moved.bytes_inter_node},
          {"bytes_over_network", moved.bytes_intra_node + moved.bytes_inter_node}};
}

void print_json(const RebalanceArgs& args, const Rebalanced& r) {
  const Topology& t = r.topology;
  auto summary = [](const BalanceSummary& b) {
    return nlohmann::json{{"mean_balancedness", b.mean_balancedness}, {"sum_balancedness", b.sum_balancedness}};
  };
  nlohmann::json out = {{"policy", args.policy},
                        {"topology",
                         {{"layers", t.num_layers},
                          {"experts", t.num_experts},
                          {"slots", t.num_slots},
                          {"groups", t.num_groups},
                          {"nodes", t.num_nodes},
                          {"ranks", t.num_ranks},
                          {"variant", t.hierarchical() ? "hierarchical" : "global"}}},
                        {"load", r.load_source},
                        {"before_placement", r.with_current ? args.current_path : std::string("default")},
                        {"per_layer", layers_json(r)},
                        {"summary", {{"before", summary(r.before)}, {"after", summary(r.after)}}},
                        {"policy_seconds", r.policy_seconds},
                        {"threads", args.threads}};
  if (r.with_current) out["moved"] = moved_json(r);
  if (!args.out_path.empty()) out["out"] = args.out_path;
  std::printf("%s\n", out.dump(2).c_str());
}

void print_moved(const Rebalanced& r) {
  const Moved& moved = r.moved;
  const int64_t total_slots = int64_t(r.topology.num_layers) * r.topology.num_slots;
  fmt::print("moved vs --current: {} of {} slots rewritten ({:.1f}%): {} local copies, {} intra-node reads, {} "
             "inter-node reads\n",
             moved.slots_changed, total_slots, 100.0 * double(moved.slots_changed) / double(total_slots),
             moved.plan.slots_local_copy, moved.plan.slots_read_intra_node, moved.plan.slots_read_inter_node);
  fmt::print("bytes ({} per expert): {} over the network ({} intra-node, {} inter-node), {} copied locally\n",
             format_bytes(r.bytes_per_expert), format_bytes(moved.bytes_intra_node + moved.bytes_inter_node),
             format_bytes(moved.bytes_intra_node), format_bytes(moved.bytes_inter_node),
             format_bytes(moved.bytes_local));
}

void print_table(const RebalanceArgs& args, const Rebalanced& r) {
  fmt::print("eplb rebalance: policy {}, {} ({} variant)\n", args.policy, r.topology.to_string(),
             r.topology.hierarchical() ? "hierarchical" : "global");
  fmt::print("load: {}\n", r.load_source);
  fmt::print("before: {}\n", r.with_current ? "--current " + args.current_path
                                              : "the default placement (slot s holds expert s mod E)");
  fmt::print("\n{:>5}  {:>8}  {:>8}  {:>14}  {:>14}{}\n", "layer", "before", "after", "max load before",
             "max load after", r.with_current ? "  slots moved" : "");
  for (int l = 0; l < r.topology.num_layers; ++l)
    fmt::print("{:>5}  {:>8.4f}  {:>8.4f}  {:>14.1f}  {:>14.1f}{}\n", l, r.before.per_layer[l], r.after.per_layer[l],
               r.before.max_load[l], r.after.max_load[l],
               r.with_current ? fmt::format("  {:>11}", r.moved.per_layer[l]) : std::string());
  fmt::print("\nbalancedness (mean rank load / max rank load; 1.0 is perfect)\n");
  fmt::print("  mean over layers:           {:.4f} -> {:.4f}\n", r.before.mean_balancedness, r.after.mean_balancedness);
  fmt::print("  sum of means / sum of maxes: {:.4f} -> {:.4f}\n", r.before.sum_balancedness, r.after.sum_balancedness);
  fmt::print("policy time: {} ({} thread{})\n", format_seconds(r.policy_seconds), args.threads,
             args.threads == 1 ? "" : "s");
  if (r.with_current) print_moved(r);
  if (!args.out_path.empty()) fmt::print("wrote {}\n", args.out_path);
}

Status run_rebalance(RebalanceArgs args) {
  Rebalanced r;
  EPLB_ASSIGN_OR_RETURN(r.bytes_per_expert, parse_byte_size(args.bytes_per_expert));
  EPLB_TRY(load_inputs(args, r));
  EPLB_TRY(load_current(args, r));
  EPLB_ASSIGN_OR_RETURN(auto policy, make_policy(args.policy));
  args.options.threads = args.threads;
  args.options.bytes_per_expert = double(r.bytes_per_expert);  // cost-aware prices moves with it
  Stopwatch watch;
  auto placed = policy->place(r.load, r.topology, r.current, args.options);
  r.policy_seconds = watch.seconds();
  if (!placed.is_ok()) return placed.status().with_context("rebalance");
  r.placement = std::move(placed).value();
  r.before = balancedness(r.current, r.load, r.topology);
  r.after = balancedness(r.placement, r.load, r.topology);
  if (r.with_current) EPLB_TRY(measure_moves(r));
  if (!args.out_path.empty()) {
    nlohmann::json extra = {{"policy", args.policy},
                            {"balancedness_mean", r.after.mean_balancedness},
                            {"balancedness_sum", r.after.sum_balancedness}};
    EPLB_TRY(write_placement_file(args.out_path, r.placement, r.topology, extra.dump()));
  }
  if (args.format == "json") print_json(args, r);
  else print_table(args, r);
  return Status::ok();
}

// The knobs of the policies themselves (PolicyOptions).
void add_policy_options(CLI::App& command, PolicyOptions& options) {
  command
      .add_option("--budget", options.budget,
                  "incremental: slots rewritten per layer; < 1 a fraction of R, >= 1 a count")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command.add_flag(
      "--anti-affinity", options.anti_affinity,
      "Never two replicas of one expert on one rank (an error when impossible; deepseek: post-processing)");
  command
      .add_option("--min-gain", options.min_gain,
                  "Hysteresis: keep a layer's current placement if its balancedness would gain less")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      .add_option("--move-threshold", options.move_threshold,
                  "incremental: stop when the best move improves the max rank load by <= this (relative)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_cost_aware_options(command, options);
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
      ->check(positive_integer());
  command->add_option("--groups", args->groups,
                      "Expert groups G (E a multiple of G); G % N == 0 selects DeepSeek's hierarchical variant")
      ->check(positive_integer());
  command->add_option("--nodes", args->nodes, "Nodes N (ranks a multiple of N)")->check(positive_integer());
  command->add_option("--ranks", args->ranks, "Ranks P (GPUs); each holds R / P slots")
      ->check(positive_integer());
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
      ->check(integer_in(1, 1024))
      ->capture_default_str();
  command->add_option("--bytes-per-expert", args->bytes_per_expert,
                      "Bytes of one expert's weights, for the bytes moved with --current (a byte size: 44040192,\n"
                      "42MiB, 1.5G); default 42MiB, a DeepSeek-V3 routed expert in FP8, 3 x 7168 x 2048");
  add_max_input_bytes(*command, args->max_input_bytes);
  add_policy_options(*command, args->options);
  command->callback([args] { set_command_result(run_rebalance(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(10, add_rebalance);

}  // namespace eplb::cli
