// cmd_run.cpp - `eplb run`: the main job. Rebalances a simulated MoE model
// over N rank processes for a few rounds of a drifting load trace and moves
// the expert weights with verified one-sided READs (src/migrate/run.cpp).
//
// Modes: --transport loopback runs all ranks as threads of this process;
// --bootstrap mpi (or being started by mpirun) makes each process one rank;
// otherwise this process is the launcher: it re-executes itself as N rank
// processes (launch_local_ranks) that find each other through EPLB_RANK /
// EPLB_SIZE / EPLB_BOOTSTRAP_DIR.
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "command.h"
#include "eplb/bootstrap.h"
#include "eplb/migrate.h"
#include "eplb/sim.h"

namespace eplb::cli {
namespace {

struct RunArgs {
  int ranks = 4;
  int nodes = 2;
  std::string preset;
  int layers = 8;
  int experts = 64;
  int replicas = 72;
  int groups = 8;
  std::string bytes_per_expert = "1MiB";
  std::string tensors;
  int rounds = 3;
  std::string policy = "deepseek";
  std::string trace;
  std::string dist = "zipf";
  double skew = 1.0;
  double drift = -1;
  uint64_t seed = 0;
  int window = 20;
  std::string transport = "shm";
  std::string bootstrap = "local";
  double timeout = 0;
  int retries = 2;
  std::string inject;
  std::string json;
  int threads = 1;
  // Which options the user gave (they override a preset / the group size).
  CLI::Option* ranks_option = nullptr;
  CLI::Option* nodes_option = nullptr;
  CLI::Option* layers_option = nullptr;
  CLI::Option* experts_option = nullptr;
  CLI::Option* replicas_option = nullptr;
  CLI::Option* groups_option = nullptr;
};

Result<RunOptions> build_options(const RunArgs& args, int group_size) {
  RunOptions options;
  Topology topology;
  if (!args.preset.empty()) {
    EPLB_ASSIGN_OR_RETURN(topology, topology_preset(args.preset));
    if (args.layers_option->count()) topology.num_layers = args.layers;
    if (args.experts_option->count()) topology.num_experts = args.experts;
    if (args.replicas_option->count()) topology.num_slots = args.replicas;
    if (args.groups_option->count()) topology.num_groups = args.groups;
    if (args.nodes_option->count()) topology.num_nodes = args.nodes;
    if (args.ranks_option->count()) topology.num_ranks = args.ranks;
  } else {
    topology = Topology{args.layers, args.experts, args.replicas, args.groups, args.nodes, args.ranks};
  }
  if (group_size > 0) {
    if (args.ranks_option->count() && args.ranks != group_size)
      return error(Code::InvalidArgument, "--ranks " + std::to_string(args.ranks) + " but " +
                                              std::to_string(group_size) + " processes were started");
    topology.num_ranks = group_size;
  }
  if (Status valid = topology.validate(); !valid) return valid.with_context("topology");
  options.topology = topology;
  if (!args.tensors.empty()) {
    EPLB_ASSIGN_OR_RETURN(options.tensors, parse_tensors(args.tensors));
  } else {
    auto bytes = parse_byte_size(args.bytes_per_expert);
    if (!bytes) return bytes.status().with_context("--bytes-per-expert");
    options.tensors = default_tensors(*bytes);
  }
  options.rounds = args.rounds;
  options.window = args.window;
  options.policy = args.policy;
  options.threads = args.threads;
  options.trace_path = args.trace;
  if (args.dist == "zipf")
    options.generate.distribution = LoadDistribution::Zipf;
  else if (args.dist == "lognormal")
    options.generate.distribution = LoadDistribution::Lognormal;
  else
    return error(Code::InvalidArgument, "--dist must be zipf or lognormal, got '" + args.dist + "'");
  options.generate.skew = args.skew;
  options.generate.drift = args.drift < 0 ? default_drift() : args.drift;
  options.generate.seed = args.seed;
  if (args.transport != "shm" && args.transport != "tcp" && args.transport != "loopback")
    return error(Code::InvalidArgument, "--transport must be shm, tcp or loopback, got '" + args.transport + "'");
  if (args.bootstrap != "local" && args.bootstrap != "mpi")
    return error(Code::InvalidArgument, "--bootstrap must be local or mpi, got '" + args.bootstrap + "'");
  options.transport = args.transport;
  options.backend = args.transport == "loopback" ? "loopback" : "ucx";
  options.bootstrap = args.transport == "loopback" ? "threads" : args.bootstrap;
  options.fault_spec = args.inject;
  if (args.timeout < 0) return error(Code::InvalidArgument, "--timeout must be >= 0 (0: automatic)");
  if (args.retries < 0 || args.retries > 100) return error(Code::InvalidArgument, "--retries must be in [0, 100]");
  if (args.threads < 1 || args.threads > 256) return error(Code::InvalidArgument, "--threads must be in [1, 256]");
  options.migrate.timeout_seconds = args.timeout;
  options.migrate.retries = args.retries;
  options.json_path = args.json;
  return options;
}

void set_ucx_transports(const std::string& transport) {
  if (std::getenv("UCX_TLS")) return;  // the user's choice wins
  if (transport == "shm") setenv("UCX_TLS", "posix,sysv,cma,self", 1);
  if (transport == "tcp") setenv("UCX_TLS", "tcp,self", 1);
}

// Test-only hooks (fault matrix, tests/faults, tests/migrate):
//   EPLB_TEST_KILL_RANK_AT_LAYER="R:L"  rank R SIGKILLs itself when it starts
//                                       layer L (first attempt);
//   EPLB_TEST_SIGNAL="R:L:KILL|STOP"    rank R raises SIGKILL or SIGSTOP on
//                                       itself when it starts layer L (first
//                                       attempt): a dead or a frozen rank.
void install_test_hooks(RunOptions& options, int rank) {
  int target_rank = -1, target_layer = -1, signal_number = SIGKILL;
  if (const char* spec = std::getenv("EPLB_TEST_KILL_RANK_AT_LAYER")) {
    if (std::sscanf(spec, "%d:%d", &target_rank, &target_layer) != 2) return;
  } else if (const char* spec = std::getenv("EPLB_TEST_SIGNAL")) {
    char name[8] = {0};
    if (std::sscanf(spec, "%d:%d:%7s", &target_rank, &target_layer, name) != 3) return;
    if (std::string(name) == "STOP") signal_number = SIGSTOP;
    else if (std::string(name) != "KILL") return;
  } else {
    return;
  }
  if (target_rank != rank) return;
  options.migrate.before_attempt = [target_layer, signal_number](int layer, int attempt) {
    if (layer == target_layer && attempt == 0) std::raise(signal_number);
  };
}

Status run_as_rank(ProcessGroup& group, RunOptions options, bool mpi) {
  options.out = stdout;
  // The local launcher says whether the user sees a terminal; mpirun gives
  // ranks a pseudo-terminal even when its own output is a pipe, so under
  // MPI bars need EPLB_RUN_TTY=1.
  const char* tty = std::getenv("EPLB_RUN_TTY");
  options.tty = tty ? std::string(tty) == "1" : (!mpi && isatty(STDOUT_FILENO));
  install_test_hooks(options, group.rank());
  RunSummary summary = run_rank(group, options);
  // Errors every rank agreed on (an aborted layer, a fingerprint or layout
  // mismatch) are printed once, by rank 0; the other ranks only exit with
  // the same code. Errors of a lost rank differ per survivor: all print.
  const Code code = summary.status.code();
  if (group.rank() != 0 && (code == Code::Aborted || code == Code::Mismatch)) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::exit(exit_code_for(summary.status));
  }
  return summary.status;
}

Status run_in_threads(RunOptions options) {
  const int size = options.topology.num_ranks;
  auto groups = make_thread_groups(size);
  static int run_counter = 0;
  options.agent_prefix = "run" + std::to_string(getpid()) + "-" + std::to_string(++run_counter) + "-rank-";
  std::vector<Status> statuses(size);
  std::vector<std::thread> threads;
  options.tty = isatty(STDOUT_FILENO);
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      RunOptions mine = options;
      mine.out = r == 0 ? stdout : nullptr;
      statuses[r] = run_rank(*groups[r], mine).status;
    });
  for (auto& thread : threads) thread.join();
  for (const auto& status : statuses)
    if (!status) return status;
  return Status::ok();
}

Result<std::vector<std::string>> own_command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof()) return error(Code::IoError, "cannot read /proc/self/cmdline");
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  char exe[4096];
  ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (length <= 0 || argv.empty()) return error(Code::IoError, "cannot find this executable (/proc/self/exe)");
  argv[0] = std::string(exe, size_t(length));
  return argv;
}

Status launch(const RunOptions& options) {
  EPLB_ASSIGN_OR_RETURN(auto argv, own_command_line());
  set_ucx_transports(options.transport);
  setenv("EPLB_RUN_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
  // A backstop only: every wait inside the ranks has its own deadline.
  double per_layer = (options.migrate.timeout_seconds > 0 ? options.migrate.timeout_seconds : 30.0) + 20.0;
  double bound = 120.0 + double(options.rounds) * options.topology.num_layers * (options.migrate.retries + 1) * per_layer;
  auto launched = launch_local_ranks(options.topology.num_ranks, argv, Deadline::after_seconds(bound));
  if (!launched) return launched.status();
  return Status::ok();
}

void add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand(
      "run",
      "The main job: rebalance a simulated MoE model over N rank processes for a few rounds of a drifting load\n"
      "trace, moving expert weights between ranks with verified one-sided READs (UCX), and report balance,\n"
      "bytes moved, time and bandwidth per round. Every slot of every rank is verified byte for byte after\n"
      "each round. A failed layer is retried, then the round stops with the layer's old placement intact.");
  run->add_option("--ranks", args->ranks, "rank processes (P); with mpirun: the -np count")->capture_default_str();
  args->ranks_option = run->get_option("--ranks");
  run->add_option("--nodes", args->nodes, "emulated nodes (N); ranks [n*P/N, (n+1)*P/N) form node n")->capture_default_str();
  args->nodes_option = run->get_option("--nodes");
  run->add_option("--preset", args->preset,
                  "a named serving shape (deepseek-v3, qwen3-235b, mixtral-8x7b, tiny); explicit options override it");
  run->add_option("--layers", args->layers, "MoE layers (L)")->capture_default_str();
  args->layers_option = run->get_option("--layers");
  run->add_option("--experts", args->experts, "logical experts per layer (E)")->capture_default_str();
  args->experts_option = run->get_option("--experts");
  run->add_option("--replicas", args->replicas, "physical slots per layer (R >= E, a multiple of P)")->capture_default_str();
  args->replicas_option = run->get_option("--replicas");
  run->add_option("--groups", args->groups, "expert groups (G) for the hierarchical policy")->capture_default_str();
  args->groups_option = run->get_option("--groups");
  run->add_option("--bytes-per-expert", args->bytes_per_expert,
                  "bytes of one expert (all its tensors), e.g. 1MiB, 8MiB, 512KiB; split into the default tensors\n"
                  "gate_up (~2/3), down (~1/3) and scales (1/256, at least 64 B)")
      ->capture_default_str();
  run->add_option("--tensors", args->tensors,
                  "the tensors of one expert as name:bytes,... (e.g. gate_up:2MiB,down:1MiB,scales:8KiB);\n"
                  "overrides --bytes-per-expert");
  run->add_option("--rounds", args->rounds, "rebalancing rounds (one trace window each)")->capture_default_str();
  run->add_option("--policy", args->policy, "placement policy: deepseek, relabel, incremental, balanced")->capture_default_str();
  run->add_option("--trace", args->trace, "load trace file [steps][layers][experts] (.npy, .csv, .json); default: generated");
  run->add_option("--dist", args->dist, "generated load distribution: zipf or lognormal")->capture_default_str();
  run->add_option("--skew", args->skew, "zipf exponent or lognormal sigma of the generated load")->capture_default_str();
  run->add_option("--drift", args->drift, "per-step drift of expert popularity in the generated trace (< 0: the default)")
      ->capture_default_str();
  run->add_option("--seed", args->seed, "seed of the generated trace")->capture_default_str();
  run->add_option("--window", args->window, "trace steps per round (summed into the round's load)")->capture_default_str();
  run->add_option("--transport", args->transport,
                  "shm (UCX over shared memory), tcp (UCX over TCP) or loopback (all ranks as threads of this\n"
                  "process, in-process copies). UCX_TLS is set accordingly unless already set")
      ->capture_default_str();
  run->add_option("--bootstrap", args->bootstrap,
                  "local (this command starts --ranks processes) or mpi (each process started by mpirun is a rank)")
      ->capture_default_str();
  run->add_option("--timeout", args->timeout,
                  "seconds one layer's transfers may take (0: automatic, 5 s + 1 s per 256 MiB read by a rank)")
      ->capture_default_str();
  run->add_option("--retries", args->retries, "extra attempts of a failed layer before the round stops")->capture_default_str();
  run->add_option("--inject", args->inject,
                  "fault spec for the faulty transfer backend, e.g. err=0.01,stall=0.005,corrupt=0.005,delay_ms=5,\n"
                  "disconnect_after=100,seed=7");
  run->add_option("--json", args->json, "write the report (per round and per layer) to this JSON file (rank 0)");
  run->add_option("--threads", args->threads, "threads for the placement policy")->capture_default_str();
  run->callback([args] {
    const bool mpi = args->transport != "loopback" && (args->bootstrap == "mpi" || launched_by_mpirun());
    auto local_env = local_group_options_from_env();
    if (args->transport == "loopback") {
      auto options = build_options(*args, 0);
      if (!options) return set_command_result(options.status());
      return set_command_result(run_in_threads(std::move(options).value()));
    }
    if (mpi) {
      set_ucx_transports(args->transport);
      auto group = make_mpi_group();
      if (!group) return set_command_result(group.status().with_context("MPI bootstrap"));
      auto options = build_options(*args, (*group)->size());
      if (!options) return set_command_result(options.status());
      options->bootstrap = "mpi";
      return set_command_result(run_as_rank(**group, std::move(options).value(), true));
    }
    if (local_env) {
      auto group = make_local_group(*local_env);
      if (!group) return set_command_result(group.status().with_context("local bootstrap"));
      auto options = build_options(*args, (*group)->size());
      if (!options) return set_command_result(options.status());
      return set_command_result(run_as_rank(**group, std::move(options).value(), false));
    }
    auto options = build_options(*args, 0);
    if (!options) return set_command_result(options.status());
    set_command_result(launch(*options));
  });
}

}  // namespace

EPLB_REGISTER_COMMAND(60, add_run);

}  // namespace eplb::cli
