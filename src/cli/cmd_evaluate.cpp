// eplb evaluate: replays a load trace window by window and judges policies
// out of sample (balance on the next window, slots and bytes moved, time).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
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
  double bytes_per_expert = 3.0 * 7168 * 2048;  // DeepSeek-V3 expert, FP8: gate, up, down
  std::string preset;
  int replicas = 0, groups = 0, nodes = 0, ranks = 0;
  int threads = 1;
  std::string json;
  bool quiet = false;
};

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream stream(text);
  std::string name;
  while (std::getline(stream, name, ','))
    if (!name.empty()) names.push_back(name);
  return names;
}

Result<Topology> topology_for(const EvaluateArgs& args, const LoadTrace& trace) {
  Topology topology{trace.num_layers, trace.num_experts, trace.num_experts, 1, 1, 1};
  if (!args.preset.empty()) {
    EPLB_ASSIGN_OR_RETURN(Topology preset, topology_preset(args.preset));
    topology.num_slots = preset.num_slots;
    topology.num_groups = preset.num_groups;
    topology.num_nodes = preset.num_nodes;
    topology.num_ranks = preset.num_ranks;
    if (preset.num_experts != trace.num_experts)
      return error(Code::InvalidArgument, "preset " + args.preset + " has " + std::to_string(preset.num_experts) +
                                              " experts but the trace has " + std::to_string(trace.num_experts));
  }
  if (args.replicas > 0) topology.num_slots = args.replicas;
  if (args.groups > 0) topology.num_groups = args.groups;
  if (args.nodes > 0) topology.num_nodes = args.nodes;
  if (args.ranks > 0) topology.num_ranks = args.ranks;
  EPLB_TRY(topology.validate());
  return topology;
}

std::string percent(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * value);
  return text;
}

Status run_evaluate(const EvaluateArgs& args) {
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, read_load_trace(args.trace));
  EPLB_ASSIGN_OR_RETURN(Topology topology, topology_for(args, trace));
  EPLB_ASSIGN_OR_RETURN(Estimator estimator, parse_estimator(args.estimator));
  std::vector<std::string> names = split_names(args.policies);
  if (names.empty()) return error(Code::InvalidArgument, "--policies lists no policy");
  for (const auto& name : names) EPLB_TRY(make_policy(name).status());
  if (args.bytes_per_expert < 0) return error(Code::InvalidArgument, "--bytes-per-expert must be >= 0");

  EvaluateOptions options;
  options.window = args.window;
  options.history = args.history;
  options.estimator = estimator;
  options.policy.threads = args.threads;
  options.policy.anti_affinity = args.anti_affinity;
  options.policy.min_gain = args.min_gain;
  options.policy.budget = args.budget;
  options.policy.move_threshold = args.move_threshold;
  options.bytes_per_expert = args.bytes_per_expert;
  if (!args.quiet)
    options.progress = [](const std::string& line) { std::fprintf(stderr, "evaluate: %s\n", line.c_str()); };

  std::vector<PolicyEvaluation> results;
  for (const auto& name : names) {
    EPLB_ASSIGN_OR_RETURN(PolicyEvaluation evaluation, evaluate_policy(trace, topology, name, options));
    results.push_back(std::move(evaluation));
  }

  std::printf("trace %s: %d steps, window %d, estimator %s, %s\n", args.trace.c_str(), trace.num_steps, args.window,
              estimator.to_string().c_str(), topology.to_string().c_str());
  std::printf("%d rebalances per policy; balancedness = mean over layers of mean/max rank load\n\n",
              int(results.front().windows.size()));
  std::printf("%-12s %9s %9s %9s %9s %11s %11s %9s %9s\n", "policy", "in-sample", "next-win", "slots/rb",
              "max slots", "bytes/rb", "max bytes", "wall/rb", "cpu/rb");
  for (const auto& r : results)
    std::printf("%-12s %9.4f %9.4f %9.1f %9lld %11s %11s %9s %9s\n", r.policy.c_str(), r.mean_in_sample(),
                r.mean_next_window(), r.mean_slots_moved(), static_cast<long long>(r.max_slots_moved()),
                format_bytes(uint64_t(r.mean_bytes_moved())).c_str(), format_bytes(uint64_t(r.max_bytes_moved())).c_str(),
                format_seconds(r.median_seconds()).c_str(), format_seconds(r.median_cpu_seconds()).c_str());
  // Relative to deepseek, when it was evaluated too.
  const PolicyEvaluation* reference = nullptr;
  for (const auto& r : results)
    if (r.policy == "deepseek") reference = &r;
  if (reference) {
    double stale = 0;
    for (const auto& w : reference->windows) stale += w.in_sample - w.next_window;
    std::printf("\ndeepseek loses %.2f points of balancedness from in-sample to the next window (mean)\n",
                100.0 * stale / double(reference->windows.size()));
    std::printf("%-12s %12s %16s %16s %14s\n", "vs deepseek", "next-win", "next >= deepseek", "in >= deepseek",
                "slots moved");
    for (const auto& r : results) {
      if (&r == reference) continue;
      int next_at_least = 0, in_at_least = 0;
      for (size_t i = 0; i < r.windows.size(); ++i) {
        const auto &mine = r.windows[i], &theirs = reference->windows[i];
        next_at_least += mine.next_window >= theirs.next_window - 1e-12;
        in_at_least += mine.in_sample >= theirs.in_sample - 1e-12;
      }
      std::string windows = std::to_string(r.windows.size());
      std::printf("%-12s %12s %16s %16s %14s\n", r.policy.c_str(),
                  percent(r.mean_next_window() / reference->mean_next_window()).c_str(),
                  (std::to_string(next_at_least) + "/" + windows).c_str(),
                  (std::to_string(in_at_least) + "/" + windows).c_str(),
                  percent(reference->mean_slots_moved() > 0 ? r.mean_slots_moved() / reference->mean_slots_moved() : 0)
                      .c_str());
    }
  }

  if (!args.json.empty()) {
    nlohmann::json out;
    out["trace"] = args.trace;
    out["window"] = args.window;
    out["history"] = args.history;
    out["estimator"] = estimator.to_string();
    out["topology"] = {{"layers", topology.num_layers}, {"experts", topology.num_experts},
                       {"slots", topology.num_slots},   {"groups", topology.num_groups},
                       {"nodes", topology.num_nodes},   {"ranks", topology.num_ranks}};
    out["options"] = {{"budget", args.budget},
                      {"min_gain", args.min_gain},
                      {"move_threshold", args.move_threshold},
                      {"anti_affinity", args.anti_affinity},
                      {"bytes_per_expert", args.bytes_per_expert},
                      {"threads", args.threads}};
    for (const auto& r : results) {
      nlohmann::json policy;
      policy["policy"] = r.policy;
      policy["mean_in_sample"] = r.mean_in_sample();
      policy["mean_next_window"] = r.mean_next_window();
      policy["mean_slots_moved"] = r.mean_slots_moved();
      policy["max_slots_moved"] = r.max_slots_moved();
      policy["mean_bytes_moved"] = r.mean_bytes_moved();
      policy["max_bytes_moved"] = r.max_bytes_moved();
      policy["median_seconds"] = r.median_seconds();
      policy["median_cpu_seconds"] = r.median_cpu_seconds();
      for (const auto& w : r.windows)
        policy["windows"].push_back({{"boundary", w.boundary},
                                     {"in_sample", w.in_sample},
                                     {"next_window", w.next_window},
                                     {"stale_next", w.stale_next},
                                     {"slots_moved", w.slots_moved},
                                     {"bytes_moved", w.bytes_moved},
                                     {"seconds", w.seconds},
                                     {"cpu_seconds", w.cpu_seconds}});
      out["policies"].push_back(policy);
    }
    std::ofstream file(args.json);
    file << out.dump(1) << "\n";
    if (!file) return error(Code::IoError, "cannot write " + args.json);
  }
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
      ->check(CLI::PositiveNumber);
  command->add_option("--history", args->history, "Past windows the estimator sees")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--policies", args->policies, "Comma-separated policies: deepseek, relabel, incremental, balanced")
      ->capture_default_str();
  command->add_option("--estimator", args->estimator,
                      "Load estimator: sum | ema:H (half-life H steps) | robust:Z (mean + Z*stddev per step)")
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
                      "Bytes of one expert's weights, for bytes moved (default: DeepSeek-V3 FP8, 44 MB)")
      ->capture_default_str();
  command->add_option("--preset", args->preset, "Topology preset: deepseek-v3, qwen3-235b, mixtral-8x7b, tiny");
  command->add_option("--replicas", args->replicas, "Physical slots per layer R (overrides the preset)");
  command->add_option("--groups", args->groups, "Expert groups G (overrides the preset)");
  command->add_option("--nodes", args->nodes, "Nodes N (overrides the preset)");
  command->add_option("--ranks", args->ranks, "Ranks P (overrides the preset)");
  command->add_option("--threads", args->threads, "Worker threads per policy call (layers in parallel)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--json", args->json, "Also write the raw per-window numbers to this JSON file");
  command->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  command->callback([args] { set_command_result(run_evaluate(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(40, add_evaluate);

}  // namespace eplb::cli
