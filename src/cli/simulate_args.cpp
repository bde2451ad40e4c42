// The options of `eplb simulate` (simulate_args.h).
#include "simulate_args.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "common/text.h"
#include "options.h"

namespace eplb::cli {

namespace {

void add_cluster_options(CLI::App& command, SimulateArgs& args) {
  std::string names;
  for (const auto& name : cluster_preset_names()) names += (names.empty() ? "" : ", ") + name;
  command.add_option("--cluster", args.cluster,
                     "Hosts and network preset: " + names + " (8 GPUs per host, NVLink 4, one 400 Gb/s NIC per GPU;\n"
                     "numbers and sources in docs/scale.md); the options below override its parts")
      ->capture_default_str();
  command.add_option("--ranks-per-host", args.ranks_per_host, "GPUs (ranks) per host")->check(integer_in(1, 1024));
  command.add_option("--intra-rate", args.intra_rate, "Per rank link inside a host, each way (e.g. 450GB, 2GB)");
  command.add_option("--nic-rate", args.nic_rate, "Per rank NIC, each way (e.g. 400gbit, 200mbit)");
  command.add_option("--host-rate", args.host_rate, "Per host link shared by its ranks, each way; 0 for none (e.g. 200mbit)");
  command.add_option("--copy-rate", args.copy_rate, "Device-local row copy (staging -> live), e.g. 1675GB");
  command.add_option("--layer-overhead-ms", args.layer_overhead_ms, "Fixed cost of every changed layer (vote, checksums), ms")
      ->check(CLI::Range(0.0, 1e6));
  command.add_option("--commit-us", args.commit_us, "Serving-thread cost of one layer's swap commit, us")
      ->check(CLI::Range(0.0, 1e9));
}

void add_model_options(CLI::App& command, SimulateArgs& args) {
  std::string names;
  for (const auto& name : model_preset_names()) names += (names.empty() ? "" : ", ") + name;
  command.add_option("--model", args.model, "Model preset: " + names)->capture_default_str();
  command.add_option("--ranks", args.ranks, "Expert-parallel ranks (GPUs), a multiple of --ranks-per-host")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 20));
  command.add_option("--layers", args.layers, "MoE layers (overrides the model)")->check(positive_integer());
  command.add_option("--experts", args.experts, "Routed experts per layer (overrides the model)")->check(positive_integer());
  command.add_option("--replicas", args.replicas,
                     "Physical slots per layer (default: the smallest multiple of --ranks >= experts * 9/8)")
      ->check(positive_integer());
  command.add_option("--groups", args.groups, "Expert groups (overrides the model)")->check(positive_integer());
  command.add_option("--bytes-per-expert", args.bytes_per_expert, "Bytes of one expert (overrides the model), e.g. 1MiB");
}

void add_input_options(CLI::App& command, SimulateArgs& args) {
  command.add_option("--trace", args.trace, "Load trace [W][L][E] (.npy, .json): a rebalance every --window steps");
  command.add_option("--placements", args.placements,
                     "With --trace: the placements some policy chose, phy2log [N][L][R] (.npy), one per boundary");
  command.add_option("--before", args.before, "Placement in force (JSON from `eplb rebalance --out`): one rebalance");
  command.add_option("--after", args.after, "The new placement (JSON), with --before");
  command.add_option("--load", args.load, "With --before/--after: the load [L][E] to judge the balance on");
  command.add_option("--window", args.window, "Trace steps between rebalances")->capture_default_str()->check(positive_integer());
  command.add_option("--history", args.history, "Past windows the estimator sees")->capture_default_str()->check(positive_integer());
  command.add_option("--estimator", args.estimator, "Load estimator: sum | ema:H | robust:Z | auto (eplb evaluate --help)")
      ->capture_default_str();
  std::string names;
  for (const auto& name : policy_names()) names += (names.empty() ? "" : ", ") + name;
  command.add_option("--policy", args.policy, "Policy replayed on --trace: " + names)->capture_default_str();
  command.add_option("--budget", args.policy_options.budget, "incremental: slots rewritten per layer (< 1 a fraction)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command.add_option("--policy-cluster", args.policy_cluster,
                     "cost-aware: the cluster preset that prices its moves (default: --cluster when it is a preset)");
}

void add_serving_options(CLI::App& command, SimulateArgs& args) {
  command.add_option("--step-ms", args.step_ms, "Serving step time at perfect balance, ms")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e9));
  command.add_option("--tokens-per-step", args.tokens_per_step, "Tokens one serving step serves")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e15));
  command.add_option("--interval-s", args.interval_s, "Seconds between rebalances")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e9));
  command.add_option("--stall-mode", args.stall_mode,
                     "How serving waits for a migration, for tokens served: sync, async-copy, async-swap")
      ->capture_default_str()
      ->check(CLI::IsMember({"sync", "async-copy", "async-swap"}));
  command.add_option("--json", args.json, "Also write every rebalance's numbers (link loads included) to this JSON file");
  command.add_flag("--quiet", args.quiet, "No progress lines on stderr");
  add_max_input_bytes(command, args.max_input_bytes);
}

}  // namespace

void add_simulate_options(CLI::App& command, SimulateArgs& args) {
  add_cluster_options(command, args);
  add_model_options(command, args);
  add_input_options(command, args);
  add_serving_options(command, args);
}

Result<double> parse_rate(const std::string& text, const std::string& flag) {
  if (text == "0") return 0.0;  // --host-rate 0: no host-wide limit
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  const std::string unit = text.substr(digits);
  auto number = text::parse_double(std::string_view(text).substr(0, digits), flag);
  if (!number) return number.status();
  struct Unit {
    const char* name;
    double bytes_per_second;
  };
  const Unit units[] = {{"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8}, {"tbit", 1e12 / 8},
                        {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},       {"TB", 1e12}};
  for (const Unit& u : units)
    if (unit == u.name && std::isfinite(*number) && *number >= 0) return *number * u.bytes_per_second;
  return error(Code::InvalidArgument,
               fmt::format("{}: '{}' is not a rate (a number with kbit, mbit, gbit or tbit per second, or KB, MB, GB, TB "
                           "per second, e.g. 400gbit, 450GB)",
                           flag, text));
}

Result<ClusterSpec> build_cluster(const SimulateArgs& args) {
  EPLB_ASSIGN_OR_RETURN(ClusterSpec cluster, cluster_preset(args.cluster));
  if (args.ranks_per_host > 0) cluster.ranks_per_host = args.ranks_per_host;
  auto set_rate = [&](const std::string& text, const std::string& flag, double& field) -> Status {
    if (text.empty()) return Status::ok();
    EPLB_ASSIGN_OR_RETURN(field, parse_rate(text, flag));
    return Status::ok();
  };
  EPLB_TRY(set_rate(args.intra_rate, "--intra-rate", cluster.links.intra_host));
  EPLB_TRY(set_rate(args.nic_rate, "--nic-rate", cluster.links.nic));
  EPLB_TRY(set_rate(args.host_rate, "--host-rate", cluster.links.host));
  EPLB_TRY(set_rate(args.copy_rate, "--copy-rate", cluster.copy_bytes_per_second));
  if (args.layer_overhead_ms >= 0) cluster.layer_overhead_seconds = args.layer_overhead_ms / 1e3;
  if (args.commit_us >= 0) cluster.commit_seconds = args.commit_us / 1e6;
  EPLB_TRY(cluster.validate());
  return cluster;
}

Result<ModelSpec> build_model(const SimulateArgs& args) {
  EPLB_ASSIGN_OR_RETURN(ModelSpec model, model_preset(args.model));
  if (args.layers > 0) model.layers = args.layers;
  if (args.experts > 0) model.experts = args.experts;
  if (args.groups > 0) model.groups = args.groups;
  if (!args.bytes_per_expert.empty()) {
    auto bytes = parse_byte_size(args.bytes_per_expert);
    if (!bytes) return bytes.status().with_context("--bytes-per-expert");
    model.bytes_per_expert = double(*bytes);
  }
  return model;
}

Result<Topology> build_topology(const SimulateArgs& args, const ModelSpec& model, const ClusterSpec& cluster) {
  EPLB_ASSIGN_OR_RETURN(Topology topology, cluster_topology(model, args.ranks, cluster.ranks_per_host));
  if (args.replicas > 0) topology.num_slots = args.replicas;
  if (args.groups > 0) topology.num_groups = args.groups;
  EPLB_TRY(topology.validate().with_context("simulate"));
  return topology;
}

Result<ServingModel> build_serving(const SimulateArgs& args) {
  ServingModel serving;
  serving.step_seconds = args.step_ms / 1e3;
  serving.tokens_per_step = args.tokens_per_step;
  serving.interval_seconds = args.interval_s;
  EPLB_ASSIGN_OR_RETURN(serving.mode, parse_stall_mode(args.stall_mode));
  EPLB_TRY(serving.validate());
  return serving;
}

}  // namespace eplb::cli
