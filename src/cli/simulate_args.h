// simulate_args.h - the options of `eplb simulate` (cmd_simulate.cpp) and
// the pieces it builds from them: cluster, topology, serving model.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "eplb/cluster.h"
#include "eplb/evaluate.h"
#include "eplb/policy.h"

namespace eplb::cli {

struct SimulateArgs {
  // Cluster (a preset, then overrides).
  std::string cluster = "h100";
  int ranks_per_host = 0;
  std::string intra_rate, nic_rate, host_rate, copy_rate;
  double layer_overhead_ms = -1, commit_us = -1;
  // Model and serving shape.
  std::string model = "deepseek-v3";
  int ranks = 32;
  int layers = 0, experts = 0, replicas = 0, groups = 0;
  std::string bytes_per_expert;
  // What to replay: a trace and a policy, a trace and placements, or one pair.
  std::string trace, placements, before, after, load;
  int window = 20, history = 1;
  std::string estimator = "sum";
  std::string policy = "deepseek";
  PolicyOptions policy_options;
  std::string policy_cluster;  // cost-aware's cluster preset; empty: --cluster
  // Serving.
  double step_ms = 50, tokens_per_step = 4096, interval_s = 600;
  std::string stall_mode = "sync";
  std::string json;
  std::string max_input_bytes;
  bool quiet = false;
};

void add_simulate_options(CLI::App& command, SimulateArgs& args);

// "400gbit", "200mbit" (bits per second, as tc writes them) or "50GB",
// "450GB" (bytes per second); decimal units; "0". Returns bytes per second.
Result<double> parse_rate(const std::string& text, const std::string& flag);

Result<ClusterSpec> build_cluster(const SimulateArgs& args);
// The model preset with --layers/--experts/--groups/--bytes-per-expert applied.
Result<ModelSpec> build_model(const SimulateArgs& args);
Result<Topology> build_topology(const SimulateArgs& args, const ModelSpec& model, const ClusterSpec& cluster);
Result<ServingModel> build_serving(const SimulateArgs& args);

}  // namespace eplb::cli
