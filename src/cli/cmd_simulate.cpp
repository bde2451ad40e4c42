// eplb simulate: predicts what each rebalance costs on a cluster (docs/scale.md):
// migration time with and without the transfer schedule, bytes per link,
// serving stall (sync, async copy, async swap), balance gained, tokens served.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "command.h"
#include "common/files.h"
#include "eplb/common.h"
#include "eplb/placement_io.h"
#include "options.h"
#include "simulate_args.h"

namespace eplb::cli {

namespace {

struct Simulation {
  ClusterSpec cluster;
  ModelSpec model;
  Topology topology;
  SimulateOptions options;
  std::string what;  // the input, in words
  std::vector<RebalanceSimulation> rebalances;
  double seconds = 0;  // wall time of the simulation itself
};

double busiest(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

void print_head(const Simulation& s) {
  const LinkBandwidths& links = s.cluster.links;
  fmt::print("eplb simulate: {} on {} ranks ({} per host, {} hosts), cluster {}: NVLink {:.4g} GB/s, NIC {:.4g} Gb/s, "
             "host link {}\n",
             s.model.name, s.topology.num_ranks, s.topology.ranks_per_node(), s.topology.num_nodes, s.cluster.name,
             links.intra_host / 1e9, links.nic * 8 / 1e9,
             links.host > 0 ? fmt::format("{:.4g} Gb/s", links.host * 8 / 1e9) : std::string("unlimited"));
  fmt::print("{}, {} per expert; {}\n", s.topology.to_string(), format_bytes(uint64_t(s.options.bytes_per_expert)), s.what);
  fmt::print("times: per rebalance, layers one after another, each + {:.3g} ms overhead; scheduled = the transfer "
             "schedule's rounds, unscheduled = all reads at once (fluid max-min sharing)\n\n",
             s.cluster.layer_overhead_seconds * 1e3);
  fmt::print("{:>3} {:>5} {:>15} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n", "rb", "step",
             "next-win", "slots", "inter-host", "busiest-in", "bound", "sched", "unsched", "stall", "copy", "swap",
             "tokens/s");
}

void print_row(const Simulation& s, size_t index, const RebalanceSimulation& r) {
  const double rate_window = s.options.serving.interval_seconds;
  fmt::print("{:>3} {:>5} {:>6.4f}->{:<6.4f} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10.4g}\n",
             index + 1, r.window.boundary, r.window.stale_next, r.window.next_window, r.window.slots_moved,
             format_bytes(uint64_t(r.cost.bytes_inter_host)), format_bytes(uint64_t(busiest(r.cost.loads.nic_in))),
             format_seconds(r.cost.lower_bound_seconds), format_seconds(r.cost.scheduled_seconds),
             format_seconds(r.cost.unscheduled_seconds), format_seconds(r.stall.sync),
             format_seconds(r.stall.async_copy), format_seconds(r.stall.async_swap), r.tokens / rate_window);
}

void print_summary(const Simulation& s) {
  double bound = 0, scheduled = 0, unscheduled = 0, tokens = 0, tokens_unscheduled = 0, kept = 0, next = 0, slots = 0;
  for (const auto& r : s.rebalances) {
    bound += r.cost.lower_bound_seconds;
    scheduled += r.cost.scheduled_seconds;
    unscheduled += r.cost.unscheduled_seconds;
    tokens += r.tokens;
    tokens_unscheduled += r.tokens_unscheduled;
    kept += r.tokens_kept;
    next += r.window.next_window;
    slots += double(r.window.slots_moved);
  }
  const double n = std::max<double>(1, double(s.rebalances.size()));
  const double hours = n * s.options.serving.interval_seconds / 3600;
  fmt::print("\nmean per rebalance: next-window balancedness {:.4f}, {:.1f} slots moved, lower bound {}, scheduled {}, "
             "unscheduled {} ({:.1f}% of it)\n",
             next / n, slots / n, format_seconds(bound / n), format_seconds(scheduled / n), format_seconds(unscheduled / n),
             unscheduled > 0 ? 100 * scheduled / unscheduled : 100.0);
  fmt::print("tokens per hour ({} stall, interval {:.4g} s): {:.6g} scheduled, {:.6g} unscheduled, {:.6g} had nothing "
             "moved\n",
             to_string(s.options.serving.mode), s.options.serving.interval_seconds, tokens / hours,
             tokens_unscheduled / hours, kept / hours);
  fmt::print("simulated {} rebalance(s) in {}\n", s.rebalances.size(), format_seconds(s.seconds));
}

nlohmann::json loads_json(const LinkLoads& loads) {
  return {{"nic_out", loads.nic_out},     {"nic_in", loads.nic_in},   {"intra_out", loads.intra_out},
          {"intra_in", loads.intra_in},   {"host_out", loads.host_out}, {"host_in", loads.host_in}};
}

nlohmann::json rebalance_json(const RebalanceSimulation& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerCost& l : r.cost.layers)
    layers.push_back({{"layer", l.layer}, {"changed", l.changed}, {"lower_bound", l.lower_bound},
                      {"schedule_makespan", l.schedule_makespan}, {"scheduled", l.scheduled},
                      {"unscheduled", l.unscheduled}, {"busiest_commit_bytes", l.busiest_commit_bytes}});
  return {{"boundary", r.window.boundary}, {"estimator", r.window.estimator},
          {"in_sample", r.window.in_sample}, {"next_window", r.window.next_window},
          {"stale_next", r.window.stale_next}, {"sum_before", r.sum_before}, {"sum_after", r.sum_after},
          {"slots_moved", r.window.slots_moved}, {"policy_seconds", r.window.seconds},
          {"bytes_local", r.cost.bytes_local}, {"bytes_intra_host", r.cost.bytes_intra_host},
          {"bytes_inter_host", r.cost.bytes_inter_host}, {"layers_changed", r.cost.layers_changed},
          {"lower_bound_seconds", r.cost.lower_bound_seconds}, {"scheduled_seconds", r.cost.scheduled_seconds},
          {"unscheduled_seconds", r.cost.unscheduled_seconds},
          {"schedule_makespan_seconds", r.cost.schedule_makespan_seconds},
          {"stall", {{"sync", r.stall.sync}, {"async_copy", r.stall.async_copy}, {"async_swap", r.stall.async_swap}}},
          {"stall_unscheduled_sync", r.stall_unscheduled.sync}, {"tokens", r.tokens},
          {"tokens_unscheduled", r.tokens_unscheduled}, {"tokens_kept", r.tokens_kept},
          {"link_bytes", loads_json(r.cost.loads)}, {"layers", layers}};
}

Status write_json(files::AtomicFile& file, const Simulation& s) {
  const LinkBandwidths& links = s.cluster.links;
  nlohmann::json out = {
      {"model", s.model.name}, {"input", s.what},
      {"cluster", {{"name", s.cluster.name}, {"ranks_per_host", s.topology.ranks_per_node()},
                   {"intra_host_bytes_per_second", links.intra_host}, {"nic_bytes_per_second", links.nic},
                   {"host_bytes_per_second", links.host}, {"copy_bytes_per_second", s.cluster.copy_bytes_per_second},
                   {"layer_overhead_seconds", s.cluster.layer_overhead_seconds}, {"commit_seconds", s.cluster.commit_seconds}}},
      {"topology", {{"layers", s.topology.num_layers}, {"experts", s.topology.num_experts}, {"slots", s.topology.num_slots},
                    {"groups", s.topology.num_groups}, {"nodes", s.topology.num_nodes}, {"ranks", s.topology.num_ranks}}},
      {"bytes_per_expert", s.options.bytes_per_expert},
      {"serving", {{"step_seconds", s.options.serving.step_seconds}, {"tokens_per_step", s.options.serving.tokens_per_step},
                   {"interval_seconds", s.options.serving.interval_seconds}, {"stall_mode", to_string(s.options.serving.mode)}}},
      {"simulation_seconds", s.seconds}};
  out["rebalances"] = nlohmann::json::array();
  for (const auto& r : s.rebalances) out["rebalances"].push_back(rebalance_json(r));
  EPLB_TRY(file.append(out.dump(1) + "\n"));
  return file.commit();
}

// [N][L][R] phy2log from an .npy (read through the load reader: bounded, checked).
Result<std::vector<Placement>> read_placements(const std::string& path, const Topology& topology, uint64_t max_bytes) {
  EPLB_ASSIGN_OR_RETURN(LoadTrace raw, read_load_trace(path, max_bytes));
  if (raw.num_layers != topology.num_layers || raw.num_experts != topology.num_slots)
    return error(Code::Mismatch, fmt::format("--placements {}: shape [{}][{}][{}], expected [N][{}][{}] phy2log", path,
                                             raw.num_steps, raw.num_layers, raw.num_experts, topology.num_layers,
                                             topology.num_slots));
  std::vector<Placement> placements;
  const size_t per = size_t(topology.num_layers) * size_t(topology.num_slots);
  for (int i = 0; i < raw.num_steps; ++i) {
    std::vector<int32_t> phy2log(per);
    for (size_t k = 0; k < per; ++k) {
      const double value = raw.values[size_t(i) * per + k];
      if (value != double(int32_t(value)) || value < 0 || value >= topology.num_experts)
        return error(Code::ParseError, fmt::format("--placements {}: entry {} of placement {} is {}, not an expert", path,
                                                   k, i, value));
      phy2log[k] = int32_t(value);
    }
    auto placement = Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots, std::move(phy2log));
    if (!placement) return placement.status().with_context(fmt::format("--placements {}: placement {}", path, i));
    placements.push_back(std::move(placement).value());
  }
  return placements;
}

Status check_trace_shape(const LoadTrace& trace, const Topology& topology, const std::string& path) {
  if (trace.num_layers != topology.num_layers || trace.num_experts != topology.num_experts)
    return error(Code::Mismatch, fmt::format("--trace {} is [{}][{}][{}] but the model is {} layers x {} experts (use "
                                             "--layers/--experts or another --model)",
                                             path, trace.num_steps, trace.num_layers, trace.num_experts,
                                             topology.num_layers, topology.num_experts));
  return Status::ok();
}

Status replay_trace(const SimulateArgs& args, uint64_t max_bytes, Simulation& s) {
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, read_load_trace(args.trace, max_bytes));
  EPLB_TRY(check_trace_shape(trace, s.topology, args.trace));
  if (!args.placements.empty()) {
    EPLB_ASSIGN_OR_RETURN(auto placements, read_placements(args.placements, s.topology, max_bytes));
    s.what = fmt::format("trace {} with the {} placements of {}, window {}", args.trace, placements.size(), args.placements,
                         args.window);
    EPLB_ASSIGN_OR_RETURN(s.rebalances, simulate_sequence(trace, s.topology, placements, args.window, s.options));
    return Status::ok();
  }
  EvaluateOptions evaluate;
  evaluate.window = args.window;
  evaluate.history = args.history;
  EPLB_ASSIGN_OR_RETURN(evaluate.estimator, parse_estimator(args.estimator));
  evaluate.policy = args.policy_options;
  // cost-aware weighs its moves against the serving being simulated.
  evaluate.policy.cluster = args.policy_cluster.empty() ? args.cluster : args.policy_cluster;
  evaluate.policy.interval_seconds = s.options.serving.interval_seconds;
  evaluate.policy.stall_mode = to_string(s.options.serving.mode);
  evaluate.policy.bytes_per_expert = s.options.bytes_per_expert;
  evaluate.bytes_per_expert = s.options.bytes_per_expert;
  if (!args.quiet)
    evaluate.progress = [](const std::string& line) { std::fprintf(stderr, "simulate: %s\n", line.c_str()); };
  s.what = fmt::format("trace {}, policy {}, window {}", args.trace, args.policy, args.window);
  EPLB_ASSIGN_OR_RETURN(s.rebalances, simulate_policy(trace, s.topology, args.policy, evaluate, s.options));
  return Status::ok();
}

Status one_pair(const SimulateArgs& args, uint64_t max_bytes, Simulation& s) {
  if (args.after.empty()) return error(Code::InvalidArgument, "--before needs --after");
  EPLB_ASSIGN_OR_RETURN(PlacementFile before, read_placement_file(args.before, max_bytes));
  EPLB_ASSIGN_OR_RETURN(PlacementFile after, read_placement_file(args.after, max_bytes));
  EPLB_TRY(before.placement.validate_against(s.topology).with_context("--before " + args.before));
  EPLB_TRY(after.placement.validate_against(s.topology).with_context("--after " + args.after));
  LoadMatrix load(s.topology.num_layers, s.topology.num_experts);
  if (!args.load.empty()) { EPLB_ASSIGN_OR_RETURN(load, read_load_file(args.load, s.topology.num_experts, max_bytes)); }
  s.what = fmt::format("{} -> {}{}", args.before, args.after, args.load.empty() ? "" : ", balance on " + args.load);
  EPLB_ASSIGN_OR_RETURN(RebalanceSimulation r, simulate_rebalance(before.placement, after.placement, load, s.topology, s.options));
  s.rebalances.push_back(std::move(r));
  return Status::ok();
}

Status run_simulate(const SimulateArgs& args) {
  EPLB_ASSIGN_OR_RETURN(uint64_t max_bytes, parse_max_input_bytes(args.max_input_bytes));
  std::optional<files::AtomicFile> json;
  if (!args.json.empty()) {
    auto created = files::AtomicFile::create(args.json);
    if (!created) return created.status().with_context("--json");
    json.emplace(std::move(created).value());
  }
  Simulation s;
  EPLB_ASSIGN_OR_RETURN(s.cluster, build_cluster(args));
  EPLB_ASSIGN_OR_RETURN(s.model, build_model(args));
  EPLB_ASSIGN_OR_RETURN(s.topology, build_topology(args, s.model, s.cluster));
  EPLB_ASSIGN_OR_RETURN(s.options.serving, build_serving(args));
  s.options.cluster = s.cluster;
  s.options.bytes_per_expert = s.model.bytes_per_expert;
  const int inputs = !args.trace.empty() + !args.before.empty();
  if (inputs != 1) return error(Code::InvalidArgument, "give either --trace (with --policy or --placements) or --before and --after");
  Stopwatch watch;
  EPLB_TRY(args.trace.empty() ? one_pair(args, max_bytes, s) : replay_trace(args, max_bytes, s));
  s.seconds = watch.seconds();
  print_head(s);
  for (size_t i = 0; i < s.rebalances.size(); ++i) print_row(s, i, s.rebalances[i]);
  print_summary(s);
  if (json) EPLB_TRY(write_json(*json, s).with_context("--json"));
  return Status::ok();
}

void add_simulate(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* command = app.add_subcommand(
      "simulate",
      "Predict what each rebalance costs on a cluster (docs/scale.md): the migration time with and\n"
      "without the contention-aware transfer schedule, bytes per link, the serving stall for sync,\n"
      "async copy and async swap, the balance gained and the tokens served until the next rebalance.\n"
      "Input: a load trace and a policy (replayed as `eplb evaluate` does), a trace and the placements\n"
      "some policy chose, or one placement pair. Pure: the same inputs give the same numbers.");
  add_simulate_options(*command, *args);
  command->callback([args] { set_command_result(run_simulate(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(45, add_simulate);

}  // namespace eplb::cli
