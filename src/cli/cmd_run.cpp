// cmd_run.cpp - `eplb run`: the main job (include/eplb/app.h). Rebalances a
// simulated MoE model over N rank processes for a few rounds of a drifting
// load trace and moves the expert weights with verified one-sided READs.
//
// Modes: --transport loopback runs all ranks as threads of this process;
// --bootstrap mpi (or being started by mpirun) makes each process one rank;
// otherwise this process is the launcher: it re-executes itself as N rank
// processes (launch_local_ranks) that find each other through EPLB_RANK /
// EPLB_SIZE / EPLB_BOOTSTRAP_DIR. This file turns the options into
// RunOptions, prints rank 0's progress and report, and writes --json.
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <iterator>
#include <mutex>
#include <thread>

#include "command.h"
#include "common/files.h"
#include "common/text.h"
#include "eplb/app.h"
#include "eplb/bootstrap.h"
#include "run_args.h"
#include "run_metrics_file.h"
#include "run_report_rescue.h"

namespace eplb::cli {
namespace {

// Test-only hooks (fault matrix, tests/faults, tests/app):
//   EPLB_TEST_KILL_RANK_AT_LAYER="R:L"  rank R SIGKILLs itself when it starts
//                                       layer L (first attempt);
//   EPLB_TEST_SIGNAL="R:L:KILL|STOP"    rank R raises SIGKILL or SIGSTOP on
//                                       itself when it starts layer L (first
//                                       attempt): a dead or a frozen rank.
void install_test_hooks(RunOptions& options, int rank) {
  const char* kill = std::getenv("EPLB_TEST_KILL_RANK_AT_LAYER");
  const char* signal = std::getenv("EPLB_TEST_SIGNAL");
  if (!kill && !signal) return;
  auto fields = text::split(kill ? kill : signal, ':');
  if (fields.size() != (kill ? 2u : 3u)) return;
  auto target_rank = text::parse_int(fields[0], "hook rank");
  auto target_layer = text::parse_int(fields[1], "hook layer");
  int signal_number = SIGKILL;
  if (!kill && fields[2] == "STOP") signal_number = SIGSTOP;
  else if (!kill && fields[2] != "KILL") return;
  if (!target_rank || !target_layer || *target_rank != rank) return;
  auto previous = options.migrate.before_attempt;
  options.migrate.before_attempt = [layer = int(*target_layer), signal_number, previous](int at, int attempt) {
    if (previous) previous(at, attempt);
    if (at == layer && attempt == 0) std::raise(signal_number);
  };
}

// Test-only: EPLB_TEST_JOIN_DELAY="R:MS" makes rank R wait MS milliseconds
// (at most 10 s) before joining its group, so that a test's forged hello
// arrives first.
void delay_join_for_test(const LocalGroupOptions& options) {
  const char* delay = std::getenv("EPLB_TEST_JOIN_DELAY");
  if (!delay) return;
  auto fields = text::split(delay, ':');
  if (fields.size() != 2) return;
  auto rank = text::parse_int(fields[0], "hook rank");
  auto milliseconds = text::parse_int_in(fields[1], "hook delay", 0, 10000);
  if (rank && milliseconds && *rank == options.rank)
    std::this_thread::sleep_for(std::chrono::milliseconds(*milliseconds));
}

// --json: created (its directory checked) before any work, each round
// appended as it ends, renamed into place when the run ends, whether it
// completed or stopped. A rank killed before the end leaves
// "<path>.tmp.<pid>" holding the head and the rounds so far (not valid JSON).
class JsonReport {
 public:
  static Result<std::unique_ptr<JsonReport>> open(const std::string& path) {
    if (path.empty()) return std::unique_ptr<JsonReport>();
    auto file = files::AtomicFile::create(path);
    if (!file) return file.status().with_context("--json");
    return std::make_unique<JsonReport>(std::move(file).value());
  }
  explicit JsonReport(files::AtomicFile file) : file_(std::move(file)) {}

  void head(const RunOptions& options, const RunLabels& labels, const RunSummary& summary) {
    if (began_) return;
    began_ = true;
    keep(file_.append(render_json_head(options, labels, summary)));
  }
  void round(const RoundSummary& round) { keep(file_.append(render_json_round(round, rounds_++ == 0))); }
  Status finish(const RunOptions& options, const RunLabels& labels, const RunSummary& summary) {
    head(options, labels, summary);
    keep(file_.append(render_json_tail(summary)));
    if (written_) keep(file_.commit());
    return written_.with_context("--json");
  }

 private:
  void keep(Status status) {
    if (written_ && !status) written_ = std::move(status);
  }
  files::AtomicFile file_;
  Status written_;
  bool began_ = false;
  int rounds_ = 0;
};

// The files rank 0 writes: --json and --metrics (either may be absent).
struct RankFiles {
  std::unique_ptr<JsonReport> report;
  std::unique_ptr<MetricsFile> metrics;
  static Result<RankFiles> open(const RunArgs& args) {
    RankFiles files;
    EPLB_ASSIGN_OR_RETURN(files.report, JsonReport::open(args.json));
    EPLB_ASSIGN_OR_RETURN(files.metrics, MetricsFile::open(args.metrics));
    return files;
  }
};

// What rank 0 shows while the run goes, and the report at the end. Rounds
// leave as they end (a table row, a JSON line, the metrics rewritten): no
// rank keeps them all.
class RankOutput {
 public:
  RankOutput(const RunOptions& options, const RunLabels& labels, bool printing, bool terminal, RankFiles files = {})
      : options_(options), labels_(labels), printing_(printing),
        progress_(terminal, options.rounds, options.topology.num_layers), report_(std::move(files.report)),
        metrics_(std::move(files.metrics)) {}

  void attach(RunOptions& options) {
    options.keep_all_rounds = false;
    if (!printing_) return;
    options.on_ready = [this](const RunSummary& summary) {
      print(render_banner(options_, labels_, summary));
      if (report_) report_->head(options_, labels_, summary);
      if (metrics_) metrics_->ready();
    };
    options.migrate.on_layer_done = [this](const LayerReport& layer) { print(progress_.layer_done(layer)); };
    options.on_round_done = [this](const RoundSummary& round) {
      print(progress_.round_done(round));
      table_ += render_table_row(round);
      if (report_) report_->round(round);
      if (metrics_) metrics_->round(round);
    };
  }
  // The table, and --json; every rank states its committed state when the
  // run stopped. A stopped run keeps its own status (and exit code) even if
  // its report could not be written; that failure gets a line of its own.
  Status finish(const RunSummary& summary) {
    if (!summary.all_verified && !summary.final_state.empty())
      std::fprintf(stderr, "eplb: %s\n", summary.final_state.c_str());
    if (!printing_) return summary.status;
    if (!table_.empty()) print(render_table_header() + table_ + render_table_end(options_, summary));
    Status written = metrics_ ? metrics_->finish() : Status::ok();
    if (report_) {
      Status reported = report_->finish(options_, labels_, summary);
      if (written) written = reported;
    }
    if (written || !summary.status) {
      if (!written) std::fprintf(stderr, "eplb: the report was not written: %s\n", written.to_string().c_str());
      return summary.status;
    }
    return written;
  }

 private:
  void print(const std::string& text) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  const RunOptions& options_;
  const RunLabels& labels_;
  bool printing_;
  RunProgress progress_;
  std::unique_ptr<JsonReport> report_;
  std::unique_ptr<MetricsFile> metrics_;
  std::string table_;
};

Status run_as_rank(ProcessGroup& group, RunOptions options, const RunLabels& labels, const RunArgs& args, bool mpi) {
  // The local launcher says whether the user sees a terminal; mpirun gives
  // ranks a pseudo-terminal even when its own output is a pipe, so under
  // MPI bars need EPLB_RUN_TTY=1.
  const char* tty = std::getenv("EPLB_RUN_TTY");
  const bool terminal = tty ? std::string(tty) == "1" : (!mpi && isatty(STDOUT_FILENO));
  install_test_hooks(options, group.rank());
  RankFiles files;
  if (group.rank() == 0) {
    auto opened = RankFiles::open(args);
    if (opened) files = std::move(opened).value();
    else options.precondition = opened.status();
  }
  RankOutput output(options, labels, group.rank() == 0, terminal, std::move(files));
  output.attach(options);
  Status status = output.finish(run_rank(group, options));
  // Errors every rank agreed on (an aborted layer, a fingerprint or layout
  // mismatch) are printed once, by rank 0; the other ranks only exit with
  // the same code. Errors of a lost rank differ per survivor: all print.
  if (group.rank() != 0 && (status.code() == Code::Aborted || status.code() == Code::Mismatch)) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::exit(exit_code_for(status));
  }
  return status;
}

Status run_in_threads(RunOptions options, const RunLabels& labels, const RunArgs& args) {
  EPLB_ASSIGN_OR_RETURN(RankFiles files, RankFiles::open(args));
  const int size = options.topology.num_ranks;
  auto groups = make_thread_groups(size);
  auto serving_groups = make_thread_groups(size);  // --async: the serving loop's own collectives
  static int run_counter = 0;
  options.agent_name_prefix = fmt::format("run{}-{}-rank-", getpid(), ++run_counter);
  std::vector<Status> statuses(size);
  std::vector<std::thread> threads;
  const bool terminal = isatty(STDOUT_FILENO);
  std::mutex stderr_lines;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      RunOptions mine = options;
      if (mine.serving.async) mine.serving_group = serving_groups[r].get();
      RankOutput output(mine, labels, r == 0, terminal, r == 0 ? std::move(files) : RankFiles{});
      output.attach(mine);
      RunSummary summary = run_rank(*groups[r], mine);
      std::lock_guard lock(stderr_lines);
      statuses[r] = output.finish(summary);
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
  for (std::string_view arg : text::split(all, '\0'))
    if (!arg.empty()) argv.emplace_back(arg);
  char exe[4096];
  ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (length <= 0 || argv.empty()) return error(Code::IoError, "cannot find this executable (/proc/self/exe)");
  argv[0] = std::string(exe, size_t(length));
  return argv;
}

// The launcher: every option, the trace file and the --json and --metrics
// paths are checked once here, before any rank starts.
void launch(const RunOptions& options, const RunArgs& args) {
  if (Status valid = validate_run_options(options); !valid) return set_command_result(valid);
  if (auto probe = RankFiles::open(args); !probe) return set_command_result(probe.status());
  LaunchOptions launch_options;
  auto argv = own_command_line();
  if (!argv) return set_command_result(argv.status());
  launch_options.argv = std::move(argv).value();
  setenv("EPLB_RUN_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
  // A backstop only: every wait inside the ranks has its own deadline
  // (Deadline saturates: a huge product is "never", not an overflow).
  double per_layer = (options.migrate.timeout_seconds > 0 ? options.migrate.timeout_seconds : 30.0) + 20.0;
  launch_options.size = options.topology.num_ranks;
  launch_options.deadline = Deadline::after_seconds(
      120.0 + double(options.rounds) * options.topology.num_layers * (options.migrate.retries + 1) * per_layer);
  launch_options.echo_exit_codes = {kExitTimeout, kExitPeerLost};
  LaunchResult launched = launch_local_ranks(launch_options);
  // Rank 0 gone before it renamed its report (a forwarded signal, a kill):
  // the rounds so far are put in place, marked interrupted.
  if (!launched.pids.empty()) {
    Status rescued = rescue_report(args.json, launched.pids[0], launched.status);
    if (!rescued) std::fprintf(stderr, "eplb: %s\n", rescued.to_string().c_str());
    // A --metrics rewrite cut short leaves its temporary file; the file in place is whole.
    if (!args.metrics.empty()) ::unlink(files::temporary_path(args.metrics, launched.pids[0]).c_str());
  }
  set_launch_result(launched);
}

// Refuses, before any rank allocates, a run whose ranks on this machine
// would not fit in its memory (or, over UCX, in /dev/shm).
Status admit_on_this_machine(const RunOptions& options, int local_ranks, bool over_ucx) {
  const Topology& topology = options.topology;
  auto machine = read_machine_memory();
  if (!machine) return machine.status();
  RankMemory per_rank = rank_memory(StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), options.tensors),
                                    options.serving.commit == "swap");
  return admit_memory(per_rank, local_ranks, over_ucx, *machine);
}

// mpirun's count of the ranks on this host (OpenMPI), 1 when unknown.
int mpi_local_ranks() {
  const char* text = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  auto parsed = text::parse_int_in(text ? text : "1", "OMPI_COMM_WORLD_LOCAL_SIZE", 1, 4096);
  return parsed ? int(*parsed) : 1;
}

// --async: a second group of the same ranks for the serving loop, so that
// its per-step barrier never shares a collective sequence with the
// migration's votes (under mpirun: a communicator of its own).
Result<std::unique_ptr<ProcessGroup>> serving_group_for(bool mpi, const Result<LocalGroupOptions>& local) {
  if (mpi) {
    auto group = make_mpi_group(30, kExitTimeout);
    if (!group) return group.status().with_context("MPI bootstrap of the serving group");
    return group;
  }
  if (!local) return local.status();
  auto group = make_local_group(*local, "serving");
  if (!group) return group.status().with_context("local bootstrap of the serving group");
  return group;
}

void run_command(const RunArgs& args) {
  const bool loopback = args.transport == "loopback";
  const bool mpi = !loopback && (args.bootstrap == "mpi" || launched_by_mpirun());
  if (loopback || (!mpi && !local_group_options_from_env())) {
    auto options = build_run_options(args, 0);
    if (!options) return set_command_result(options.status());
    if (Status admitted = admit_on_this_machine(*options, options->topology.num_ranks, !loopback); !admitted)
      return set_command_result(admitted);
    if (!loopback) return launch(*options, args);
    if (Status valid = validate_run_options(*options); !valid) return set_command_result(valid);
    return set_command_result(run_in_threads(std::move(options).value(), run_labels(args, false), args));
  }
  auto local = launched_group_options();
  if (!mpi && local) delay_join_for_test(*local);
  auto group = mpi ? make_mpi_group(30, kExitTimeout) : make_local_group(*local);
  if (!group) return set_command_result(group.status().with_context(mpi ? "MPI bootstrap" : "local bootstrap"));
  auto options = build_run_options(args, (*group)->size());
  if (!options) return set_command_result(options.status());
  std::unique_ptr<ProcessGroup> serving_group;
  if (options->serving.async) {
    auto serving = serving_group_for(mpi, local);
    if (!serving) return set_command_result(serving.status());
    serving_group = std::move(serving).value();
    options->serving_group = serving_group.get();
  }
  if (mpi) {
    if (Status admitted = admit_on_this_machine(*options, mpi_local_ranks(), true); !admitted)
      return set_command_result(admitted);
  }
  set_command_result(run_as_rank(**group, std::move(options).value(), run_labels(args, mpi), args, mpi));
}

void add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand(
      "run",
      "The main job: rebalance a simulated MoE model over N rank processes for a few rounds of a drifting load\n"
      "trace, moving expert weights between ranks with verified one-sided READs (UCX), and report balance,\n"
      "bytes moved, time and bandwidth per round. Every slot of every rank is verified byte for byte after\n"
      "each round. A failed layer is retried, then the round stops with the layer's old placement intact.");
  add_run_options(*run, *args);
  run->callback([args] { run_command(*args); });
}

}  // namespace

EPLB_REGISTER_COMMAND(60, add_run);

}  // namespace eplb::cli
