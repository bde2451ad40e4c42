// eplb evaluate: replays a load trace window by window and judges policies
// out of sample (balance on the next window, slots and bytes moved, time).
#include <fmt/format.h>

#include <optional>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "common/files.h"
#include "options.h"
#include "common/text.h"
#include "eplb/common.h"
#include "eplb/evaluate.h"
#include "eplb/placement_io.h"

namespace eplb::cli {

namespace {

struct EvaluateArgs {
  std::string trace;
  int window = 20;
  int history = 1;
  std::string policies = "deepseek,relabel,incremental,balanced";
  std::string estimator = "sum";
  double budget = 0.1;
  double min_gain = 0.0;
  double move_threshold = 0.0;
  bool anti_affinity = false;
  std::string bytes_per_expert = "42MiB";  // DeepSeek-V3 expert, FP8: gate, up, down (3 x 7168 x 2048)
  std::string preset;
  int replicas = 0, groups = 0, nodes = 0, ranks = 0;
  int threads = 1;
  std::string json;
  bool quiet = false;
  std::string max_input_bytes;
  PolicyOptions cost_aware;  // --cluster, --interval-s, --stall-mode
};

Result<Topology> topology_for(const EvaluateArgs& args, const LoadTrace& trace) {
  Topology topology{trace.num_layers, trace.num_experts, trace.num_experts, 1, 1, 1};
  if (!args.preset.empty()) {
    EPLB_ASSIGN_OR_RETURN(Topology preset, topology_preset(args.preset));
    topology.num_slots = preset.num_slots;
    topology.num_groups = preset.num_groups;
    topology.num_nodes = preset.num_nodes;
    topology.num_ranks = preset.num_ranks;
    if (preset.num_experts != trace.num_experts)
      return error(Code::InvalidArgument, fmt::format("preset {} has {} experts but the trace has {}", args.preset,
                                                      preset.num_experts, trace.num_experts));
  }
  if (args.replicas > 0) topology.num_slots = args.replicas;
  if (args.groups > 0) topology.num_groups = args.groups;
  if (args.nodes > 0) topology.num_nodes = args.nodes;
  if (args.ranks > 0) topology.num_ranks = args.ranks;
  EPLB_TRY(topology.validate());
  return topology;
}

std::string percent(double value) { return fmt::format("{:.1f}%", 100.0 * value); }

Result<EvaluateOptions> evaluate_options(const EvaluateArgs& args) {
  EvaluateOptions options;
  EPLB_ASSIGN_OR_RETURN(options.estimator, parse_estimator(args.estimator));
  auto bytes = parse_byte_size(args.bytes_per_expert);
  if (!bytes) return bytes.status().with_context("--bytes-per-expert");
  options.window = args.window;
  options.history = args.history;
  options.policy.threads = args.threads;
  options.policy.anti_affinity = args.anti_affinity;
  options.policy.min_gain = args.min_gain;
  options.policy.budget = args.budget;
  options.policy.move_threshold = args.move_threshold;
  options.bytes_per_expert = double(*bytes);
  options.policy.cluster = args.cost_aware.cluster;
  options.policy.interval_seconds = args.cost_aware.interval_seconds;
  options.policy.stall_mode = args.cost_aware.stall_mode;
  options.policy.bytes_per_expert = double(*bytes);
  if (!args.quiet)
    options.progress = [](const std::string& line) { std::fprintf(stderr, "evaluate: %s\n", line.c_str()); };
  return options;
}

void print_rows(const EvaluateArgs& args, const LoadTrace& trace, const Topology& topology,
                const EvaluateOptions& options, const std::vector<PolicyEvaluation>& results) {
  fmt::print("trace {}: {} steps, window {}, estimator {}, {}\n", args.trace, trace.num_steps, args.window,
             options.estimator.to_string(), topology.to_string());
  fmt::print("{} rebalances per policy; balancedness = mean over layers of mean/max rank load\n\n",
             results.front().windows.size());
  fmt::print("{:<12} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9}\n", "policy", "in-sample", "next-win",
             "slots/rb", "max slots", "bytes/rb", "max bytes", "wall/rb", "cpu/rb");
  for (const auto& r : results)
    fmt::print("{:<12} {:>9.4f} {:>9.4f} {:>9.1f} {:>9} {:>11} {:>11} {:>9} {:>9}\n", r.policy, r.mean_in_sample(),
               r.mean_next_window(), r.mean_slots_moved(), r.max_slots_moved(),
               format_bytes(uint64_t(r.mean_bytes_moved())), format_bytes(uint64_t(r.max_bytes_moved())),
               format_seconds(r.median_seconds()), format_seconds(r.median_cpu_seconds()));
}

// Relative to deepseek, when it was evaluated too.
void print_versus_deepseek(const std::vector<PolicyEvaluation>& results) {
  const PolicyEvaluation* reference = nullptr;
  for (const auto& r : results)
    if (r.policy == "deepseek") reference = &r;
  if (!reference) return;
  double stale = 0;
  for (const auto& w : reference->windows) stale += w.in_sample - w.next_window;
  fmt::print("\ndeepseek loses {:.2f} points of balancedness from in-sample to the next window (mean)\n",
             100.0 * stale / double(reference->windows.size()));
  fmt::print("{:<12} {:>12} {:>16} {:>16} {:>14}\n", "vs deepseek", "next-win", "next >= deepseek", "in >= deepseek",
             "slots moved");
  for (const auto& r : results) {
    if (&r == reference) continue;
    int next_at_least = 0, in_at_least = 0;
    for (size_t i = 0; i < r.windows.size(); ++i) {
      const auto &mine = r.windows[i], &theirs = reference->windows[i];
      next_at_least += mine.next_window >= theirs.next_window - 1e-12;
      in_at_least += mine.in_sample >= theirs.in_sample - 1e-12;
    }
    const double slots = reference->mean_slots_moved() > 0 ? r.mean_slots_moved() / reference->mean_slots_moved() : 0;
    fmt::print("{:<12} {:>12} {:>16} {:>16} {:>14}\n", r.policy,
               percent(r.mean_next_window() / reference->mean_next_window()),
               fmt::format("{}/{}", next_at_least, r.windows.size()), fmt::format("{}/{}", in_at_least, r.windows.size()),
               percent(slots));
  }
}

nlohmann::json policy_json(const PolicyEvaluation& r) {
  nlohmann::json policy = {{"policy", r.policy},
                           {"mean_in_sample", r.mean_in_sample()},
                           {"mean_next_window", r.mean_next_window()},
                           {"mean_slots_moved", r.mean_slots_moved()},
                           {"max_slots_moved", r.max_slots_moved()},
                           {"mean_bytes_moved", r.mean_bytes_moved()},
                           {"max_bytes_moved", r.max_bytes_moved()},
                           {"median_seconds", r.median_seconds()},
                           {"median_cpu_seconds", r.median_cpu_seconds()}};
  for (const auto& w : r.windows)
    policy["windows"].push_back({{"boundary", w.boundary},
                                 {"estimator", w.estimator},
                                 {"in_sample", w.in_sample},
                                 {"next_window", w.next_window},
                                 {"stale_next", w.stale_next},
                                 {"slots_moved", w.slots_moved},
                                 {"bytes_moved", w.bytes_moved},
                                 {"seconds", w.seconds},
                                 {"cpu_seconds", w.cpu_seconds}});
  return policy;
}

Status write_json(files::AtomicFile& file, const EvaluateArgs& args, const Topology& topology,
                  const EvaluateOptions& options, const std::vector<PolicyEvaluation>& results) {
  nlohmann::json out;
  out["trace"] = args.trace;
  out["window"] = args.window;
  out["history"] = args.history;
  out["estimator"] = options.estimator.to_string();
  out["topology"] = {{"layers", topology.num_layers}, {"experts", topology.num_experts},
                     {"slots", topology.num_slots},   {"groups", topology.num_groups},
                     {"nodes", topology.num_nodes},   {"ranks", topology.num_ranks}};
  out["options"] = {{"budget", args.budget},
                    {"min_gain", args.min_gain},
                    {"move_threshold", args.move_threshold},
                    {"anti_affinity", args.anti_affinity},
                    {"bytes_per_expert", options.bytes_per_expert},
                    {"threads", args.threads}};
  for (const auto& r : results) out["policies"].push_back(policy_json(r));
  EPLB_TRY(file.append(out.dump(1) + "\n"));
  return file.commit();
}

Status run_evaluate(const EvaluateArgs& args) {
  EPLB_ASSIGN_OR_RETURN(uint64_t max_input_bytes, parse_max_input_bytes(args.max_input_bytes));
  // --json is created (its directory checked) before any work, renamed into place at the end.
  std::optional<files::AtomicFile> json;
  if (!args.json.empty()) {
    auto created = files::AtomicFile::create(args.json);
    if (!created) return created.status().with_context("--json");
    json.emplace(std::move(created).value());
  }
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, read_load_trace(args.trace, max_input_bytes));
  EPLB_ASSIGN_OR_RETURN(Topology topology, topology_for(args, trace));
  EPLB_ASSIGN_OR_RETURN(EvaluateOptions options, evaluate_options(args));
  std::vector<std::string> names;
  for (std::string_view name : text::split(args.policies, ','))
    if (!name.empty()) names.emplace_back(name);
  if (names.empty()) return error(Code::InvalidArgument, "--policies lists no policy");
  for (const auto& name : names) EPLB_TRY(make_policy(name).status());
  std::vector<PolicyEvaluation> results;
  for (const auto& name : names) {
    EPLB_ASSIGN_OR_RETURN(PolicyEvaluation evaluation, evaluate_policy(trace, topology, name, options));
    results.push_back(std::move(evaluation));
  }
  print_rows(args, trace, topology, options, results);
  print_versus_deepseek(results);
  if (json) EPLB_TRY(write_json(*json, args, topology, options, results).with_context("--json"));
  return Status::ok();
}

void add_evaluate(CLI::App& app) {
  auto args = std::make_shared<EvaluateArgs>();
  CLI::App* command = app.add_subcommand(
      "evaluate",
      "Replay a load trace and judge policies out of sample.\n"
      "At every window boundary each policy plans from the past window(s) (through the estimator),\n"
      "starting from its own placement in force (the first from the default placement), and is\n"
      "measured on the next window. Prints one row per policy: mean balancedness in sample and on\n"
      "the next window, slots and bytes moved per rebalance (mean, max), median policy time\n"
      "(wall and process CPU). Times aside, the same inputs give the same numbers.");
  command->add_option("--trace", args->trace, "Load trace [W][L][E] (.npy, .csv, .json), e.g. from `eplb gen-load --steps`")
      ->required();
  command->add_option("--window", args->window, "Steps per window K (rebalance every K steps)")
      ->capture_default_str()
      ->check(positive_integer());
  command->add_option("--history", args->history, "Past windows the estimator sees")
      ->capture_default_str()
      ->check(positive_integer());
  command->add_option("--policies", args->policies, "Comma-separated policies: deepseek, relabel, incremental, balanced, cost-aware")
      ->capture_default_str();
  command->add_option("--estimator", args->estimator,
                      "Load estimator: sum | ema:H (half-life H steps) | robust:Z (mean + Z*stddev per step) | "
                      "auto (the ema half-life, or sum, that best predicts the newer half of the steps from the "
                      "older half)")
      ->capture_default_str();
  command->add_option("--budget", args->budget,
                      "incremental: slots rewritten per layer and rebalance; < 1 a fraction of the slots, >= 1 a count")
      ->capture_default_str();
  command->add_option("--move-threshold", args->move_threshold,
                      "incremental: stop when no move lowers a layer's max rank load by more than this fraction")
      ->capture_default_str();
  command->add_option("--min-gain", args->min_gain,
                      "Hysteresis: keep a layer unchanged when the new one gains less balancedness than this (0: off)")
      ->capture_default_str();
  command->add_flag("--anti-affinity", args->anti_affinity, "Never put two replicas of one expert on one rank");
  command->add_option("--bytes-per-expert", args->bytes_per_expert,
                      "Bytes of one expert's weights, for bytes moved, as a byte size (44040192, 42MiB, 1.5G);\n"
                      "default: a DeepSeek-V3 routed expert in FP8, 42 MiB")
      ->capture_default_str();
  command->add_option("--preset", args->preset, "Topology preset: deepseek-v3, qwen3-235b, mixtral-8x7b, tiny");
  command->add_option("--replicas", args->replicas, "Physical slots per layer R (overrides the preset)");
  command->add_option("--groups", args->groups, "Expert groups G (overrides the preset)");
  command->add_option("--nodes", args->nodes, "Nodes N (overrides the preset)");
  command->add_option("--ranks", args->ranks, "Ranks P (overrides the preset)");
  command->add_option("--threads", args->threads, "Worker threads per policy call (layers in parallel)")
      ->capture_default_str()
      ->check(positive_integer());
  command->add_option("--json", args->json, "Also write the raw per-window numbers to this JSON file");
  command->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  add_max_input_bytes(*command, args->max_input_bytes);
  add_cost_aware_options(*command, args->cost_aware);
  command->callback([args] { set_command_result(run_evaluate(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(40, add_evaluate);

}  // namespace eplb::cli
