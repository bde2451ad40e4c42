// The options of `eplb run` (see run_args.h).
#include "run_args.h"

#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <system_error>

#include "common/text.h"
#include "eplb/bootstrap.h"
#include "options.h"

namespace eplb::cli {
namespace {

// UCX transports of --transport shm and tcp (the user's UCX_TLS wins).
constexpr const char* kSharedMemoryTransports = "posix,sysv,cma,self";
constexpr const char* kTcpTransports = "tcp,self";

Result<Topology> build_topology(const RunArgs& args, int group_size) {
  Topology topology{args.layers, args.experts, args.replicas, args.groups, args.nodes, args.ranks};
  if (!args.preset.empty()) {
    EPLB_ASSIGN_OR_RETURN(topology, topology_preset(args.preset));
    if (args.layers_option->count()) topology.num_layers = args.layers;
    if (args.experts_option->count()) topology.num_experts = args.experts;
    if (args.replicas_option->count()) topology.num_slots = args.replicas;
    if (args.groups_option->count()) topology.num_groups = args.groups;
    if (args.nodes_option->count()) topology.num_nodes = args.nodes;
    if (args.ranks_option->count()) topology.num_ranks = args.ranks;
  }
  if (group_size > 0) {
    if (args.ranks_option->count() && args.ranks != group_size)
      return error(Code::InvalidArgument,
                   fmt::format("--ranks {} but {} processes were started", args.ranks, group_size));
    topology.num_ranks = group_size;
  }
  if (Status valid = topology.validate(); !valid) return valid.with_context("topology");
  return topology;
}

Status set_transfers(const RunArgs& args, RunOptions& options) {
  if (args.transport != "shm" && args.transport != "tcp" && args.transport != "loopback")
    return error(Code::InvalidArgument, "--transport must be shm, tcp or loopback, got '" + args.transport + "'");
  if (args.bootstrap != "local" && args.bootstrap != "mpi")
    return error(Code::InvalidArgument, "--bootstrap must be local or mpi, got '" + args.bootstrap + "'");
  options.agent.backend = args.transport == "loopback" ? "loopback" : "ucx";
  options.agent.transports = args.transport == "shm" ? kSharedMemoryTransports
                             : args.transport == "tcp" ? kTcpTransports
                                                       : "";
  // TCP listens on the devices UCX is told to use: this machine's loopback
  // when the local launcher starts every rank here, UCX's choice (every
  // interface) under mpirun unless --net-devices or UCX_NET_DEVICES says.
  const bool local = args.bootstrap == "local" && !launched_by_mpirun();
  if (args.transport == "tcp")
    options.agent.net_devices = !args.net_devices.empty() ? args.net_devices : local ? "lo" : "";
  options.agent.fault_spec = args.inject;
  EPLB_TRY(check_duration(args.timeout, "--timeout", true));
  if (args.retries < 0 || args.retries > 100) return error(Code::InvalidArgument, "--retries must be in [0, 100]");
  options.migrate.timeout_seconds = args.timeout;
  options.migrate.retries = args.retries;
  EPLB_TRY(set_transfer_schedule(options.migrate, args.transfer_schedule).with_context("--transfer-schedule"));
  return Status::ok();
}

Status set_load(const RunArgs& args, RunOptions& options) {
  options.trace_path = args.trace;
  EPLB_ASSIGN_OR_RETURN(options.max_input_bytes, parse_max_input_bytes(args.max_input_bytes));
  if (args.dist == "zipf")
    options.generate.distribution = LoadDistribution::Zipf;
  else if (args.dist == "lognormal")
    options.generate.distribution = LoadDistribution::Lognormal;
  else
    return error(Code::InvalidArgument, "--dist must be zipf or lognormal, got '" + args.dist + "'");
  options.generate.skew = args.skew;
  options.generate.drift = args.drift < 0 ? default_drift() : args.drift;
  options.generate.seed = args.seed;
  return Status::ok();
}

void add_shape_options(CLI::App& run, RunArgs& args) {
  args.ranks_option = run.add_option("--ranks", args.ranks, "rank processes (P); with mpirun: the -np count")
                          ->capture_default_str();
  args.nodes_option = run.add_option("--nodes", args.nodes, "emulated nodes (N); ranks [n*P/N, (n+1)*P/N) form node n")
                          ->capture_default_str();
  run.add_option("--preset", args.preset,
                 "a named serving shape (deepseek-v3, qwen3-235b, mixtral-8x7b, tiny); explicit options override it");
  args.layers_option = run.add_option("--layers", args.layers, "MoE layers (L)")->capture_default_str();
  args.experts_option = run.add_option("--experts", args.experts, "logical experts per layer (E)")->capture_default_str();
  args.replicas_option =
      run.add_option("--replicas", args.replicas, "physical slots per layer (R >= E, a multiple of P)")
          ->capture_default_str();
  args.groups_option =
      run.add_option("--groups", args.groups, "expert groups (G) for the hierarchical policy")->capture_default_str();
  run.add_option("--bytes-per-expert", args.bytes_per_expert,
                 "bytes of one expert (all its tensors), e.g. 1MiB, 8MiB, 512KiB, 1.5M; split into the default\n"
                 "tensors gate_up (~2/3), down (~1/3) and scales (1/256, at least 64 B)")
      ->capture_default_str();
  run.add_option("--tensors", args.tensors,
                 "the tensors of one expert as name:bytes,... (e.g. gate_up:2MiB,down:1MiB,scales:8KiB);\n"
                 "overrides --bytes-per-expert");
}

void add_load_options(CLI::App& run, RunArgs& args) {
  run.add_option("--rounds", args.rounds, "rebalancing rounds (one trace window each)")->capture_default_str();
  run.add_option("--policy", args.policy, "placement policy: deepseek, relabel, incremental, balanced")
      ->capture_default_str();
  args.trace_option = run.add_option("--trace", args.trace, "load trace file [steps][layers][experts] (.npy, .csv, .json); default: generated");
  run.add_option("--dist", args.dist, "generated load distribution: zipf or lognormal")->capture_default_str();
  run.add_option("--skew", args.skew, "zipf exponent or lognormal sigma of the generated load")->capture_default_str();
  run.add_option("--drift", args.drift, "per-step drift of expert popularity in the generated trace (< 0: the default)")
      ->capture_default_str();
  run.add_option("--seed", args.seed, "seed of the generated trace")->capture_default_str();
  run.add_option("--window", args.window, "trace steps per round (summed into the round's load)")->capture_default_str();
  run.add_option("--threads", args.threads, "threads for the placement policy")->capture_default_str();
  add_max_input_bytes(run, args.max_input_bytes);
}

void add_transfer_options(CLI::App& run, RunArgs& args) {
  run.add_option("--transfer-schedule", args.transfer_schedule,
                 "order of each layer's READs (docs/scale.md): off (all at once), ranks (contention-aware rounds,\n"
                 "one expert per NIC per round; hosts limited by their ranks' NICs) or hosts (rounds for hosts\n"
                 "whose one link carries one expert at a time, as on the scripts/netns_cluster.sh testbed); each\n"
                 "round starts when this rank's previous one landed. ranks-fenced, hosts-fenced: every rank\n"
                 "waits for every rank's round before the next (a small allgather per round), so that rounds never\n"
                 "overlap on a link (faster where shallow NIC queues drop packets; docs/scale.md)")
      ->check(
          [](const std::string& name) {
            MigrateOptions probe;  // the library's one rule for the names
            const Status named = set_transfer_schedule(probe, name);
            return named ? std::string() : named.message();
          },
          "SCHEDULE")
      ->capture_default_str();
  run.add_option("--transport", args.transport,
                 "shm (UCX over shared memory: posix,sysv,cma,self), tcp (UCX over TCP: tcp,self) or loopback (all\n"
                 "ranks as threads of this process, in-process copies). A UCX_TLS set in the environment wins")
      ->capture_default_str();
  run.add_option("--net-devices", args.net_devices,
                 "with --transport tcp: the network devices UCX uses and listens on, in UCX_NET_DEVICES syntax (e.g.\n"
                 "lo, eth0, mlx5_0:1); default lo with the local launcher (every rank on this machine), every\n"
                 "interface under mpirun. A UCX_NET_DEVICES in the environment wins; the report names the devices");
  run.add_option("--bootstrap", args.bootstrap,
                 "local (this command starts --ranks processes) or mpi (each process started by mpirun is a rank)")
      ->capture_default_str();
  run.add_option("--timeout", args.timeout,
                 "seconds one layer's transfers may take, at most 86400 (0: automatic, 5 s + 1 s per 256 MiB read by\n"
                 "a rank)")
      ->capture_default_str();
  run.add_option("--retries", args.retries, "extra attempts of a failed layer before the round stops")
      ->capture_default_str();
  run.add_option("--inject", args.inject,
                 "fault spec for the faulty transfer backend, e.g. err=0.01,stall=0.005,corrupt=0.005,delay_ms=5,\n"
                 "disconnect_after=100,seed=7");
  args.json_option = run.add_option("--json", args.json,
                 "write the report (per round and per layer) to this JSON file (rank 0): created before any work,\n"
                 "each round appended as it ends, renamed into place when the run ends (also when it stops)");
  args.metrics_option = run.add_option("--metrics", args.metrics,
                 "write Prometheus metrics (text exposition format, for node_exporter's textfile collector: name\n"
                 "it *.prom in the collector's directory) to this file. Rank 0 writes it: byte counters are the\n"
                 "whole group's, durations rank 0's own per layer. Written atomically (a temporary file beside it,\n"
                 "renamed) when the ranks are ready and after every round, also a failed one; its directory is\n"
                 "checked before any work. eplb_rebalances_total, eplb_bytes_moved_total{locality},\n"
                 "eplb_layer_retries_total, eplb_layer_failures_total{code}, eplb_balancedness{when},\n"
                 "histograms eplb_layer_commit_seconds, eplb_transfer_seconds, eplb_serving_stall_seconds\n"
                 "(observed in async runs only; zero count otherwise)");
}

void add_serving_options(CLI::App& run, RunArgs& args) {
  run.add_flag("--async", args.async,
               "migrate while serving: each rank runs emulated serving steps in lockstep with the others (a\n"
               "per-step barrier on a group of its own stands in for all-to-all); a step commits the layers agreed\n"
               "for it, reads its share of slots and checks each holds the expert the mapping in force names\n"
               "(a mismatch is an inconsistent read and fails the round's verification). The report gains\n"
               "per-round serving statistics and timeline, and serving_idle (the same steps without migration).\n"
               "A step waits for the other ranks at most the layer's transfer deadline (--timeout, or the\n"
               "automatic one) + 5 s; a rank lost or stopped longer stops the round (layers committed stay new)");
  args.commit_option = run.add_option("--commit", args.commit,
                                      "how a layer commits (at its agreed step with --async): copy (staging rows\n"
                                      "are copied into the live rows, in the serving thread with --async; no extra\n"
                                      "memory) or swap (the new rows are written into a spare buffer of the layer,\n"
                                      "in the background with --async, and the commit swaps live and spare: one\n"
                                      "copy per moved byte instead of two and no row copy at commit, but ONE\n"
                                      "EXTRA LAYER OF MEMORY PER LAYER, i.e. twice the expert weights per rank;\n"
                                      "counted by the memory admission, shown as spare_bytes in the report;\n"
                                      "about 1.3x copy's bandwidth in sync rounds, see docs/migrate.md Bandwidth)")
                           ->capture_default_str();
  args.step_ms_option = run.add_option("--step-ms", args.step_ms,
                                       "with --async: the least duration of a serving step in ms (the emulated\n"
                                       "forward pass), in [0, 10000]")
                            ->capture_default_str();
  args.serve_share_option =
      run.add_option("--serve-share", args.serve_share,
                     "with --async: the share of each layer's slots a serving step reads and checks, in (0, 1];\n"
                     "successive steps read successive slots, so every slot is read every 1/share steps")
          ->capture_default_str();
}

}  // namespace

void add_run_options(CLI::App& run, RunArgs& args) {
  add_shape_options(run, args);
  add_load_options(run, args);
  add_transfer_options(run, args);
  add_serving_options(run, args);
}

Status set_serving(const RunArgs& args, RunOptions& options) {
  for (const CLI::Option* option : {args.step_ms_option, args.serve_share_option})
    if (!args.async && option && option->count())
      return error(Code::InvalidArgument, option->get_name() + " needs --async (it sets the emulated serving loop)");
  options.serving.async = args.async;
  options.serving.commit = args.commit;
  options.serving.step_ms = args.step_ms;
  options.serving.slot_share = args.serve_share;
  return Status::ok();
}

namespace {

// The file `path` names: symbolic links of its last component followed (a
// dangling one too: writing it creates its target), its directory made
// canonical as far as it exists.
std::filesystem::path real_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code failed;
  fs::path at = fs::absolute(path, failed);
  for (int links = 0; links < 40 && fs::is_symlink(fs::symlink_status(at, failed)); ++links) {
    fs::path target = fs::read_symlink(at, failed);
    if (failed) break;
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  fs::path canonical = fs::weakly_canonical(at, failed);
  return failed ? at.lexically_normal() : canonical;
}

}  // namespace

Status check_file_options(const RunArgs& args) {
  const std::pair<const CLI::Option*, const std::string*> files[] = {
      {args.json_option, &args.json}, {args.metrics_option, &args.metrics}, {args.trace_option, &args.trace}};
  for (const auto& [option, path] : files)
    if (option && option->count() && path->empty())
      return error(Code::InvalidArgument, option->get_name() + " needs a file name, got an empty one");
  for (size_t a = 0; a < std::size(files); ++a)
    for (size_t b = a + 1; b < std::size(files); ++b) {
      if (files[a].second->empty() || files[b].second->empty() || !files[a].first || !files[b].first) continue;
      const auto first = real_path(*files[a].second), second = real_path(*files[b].second);
      if (first == second)
        return error(Code::InvalidArgument,
                     fmt::format("{} and {} name the same file ({}): {} would overwrite it", files[a].first->get_name(),
                                 files[b].first->get_name(), first.string(),
                                 files[b].first == args.trace_option ? "the output" : "one output"));
    }
  return Status::ok();
}

Result<RunOptions> build_run_options(const RunArgs& args, int group_size) {
  RunOptions options;
  EPLB_TRY(check_file_options(args));
  EPLB_ASSIGN_OR_RETURN(options.topology, build_topology(args, group_size));
  if (!args.tensors.empty()) {
    auto tensors = parse_tensors(args.tensors);
    if (!tensors) return tensors.status().with_context("--tensors");
    options.tensors = std::move(tensors).value();
  } else {
    auto bytes = parse_byte_size(args.bytes_per_expert);
    if (!bytes) return bytes.status().with_context("--bytes-per-expert");
    options.tensors = default_tensors(*bytes);
  }
  options.rounds = args.rounds;
  options.window = args.window;
  options.policy = args.policy;
  if (args.threads < 1 || args.threads > 256) return error(Code::InvalidArgument, "--threads must be in [1, 256]");
  options.threads = args.threads;
  EPLB_TRY(set_load(args, options));
  EPLB_TRY(set_transfers(args, options));
  EPLB_TRY(set_serving(args, options));
  return options;
}

RunLabels run_labels(const RunArgs& args, bool mpi) {
  return {args.transport, args.transport == "loopback" ? "threads" : mpi ? "mpi" : args.bootstrap};
}

}  // namespace eplb::cli
