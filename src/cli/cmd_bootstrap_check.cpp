// eplb bootstrap-check: forms the process group and shows who is in it.
//
// Every rank contributes "host, pid, IPv4 addresses" to an allgather; rank 0
// prints one line per rank, then the mean latency of barrier and allgather
// over --rounds rounds, and every rank votes that it saw the same table.
// Started by mpirun it uses MPI; started by `eplb bootstrap-check --ranks N`
// it launches N local ranks of itself; started by an eplb launcher it joins
// that local group.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "command.h"
#include "options.h"
#include "eplb/bootstrap.h"

namespace eplb::cli {
namespace {

struct BootstrapCheckOptions {
  std::string bootstrap = "auto";
  int ranks = 2;
  double timeout = 30;
  int rounds = 100;
  size_t bytes = 64;
};

std::string host_description() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string addresses;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* entry = list; entry; entry = entry->ifa_next) {
      if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {};
      auto* address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr);
      ::inet_ntop(AF_INET, &address->sin_addr, text, sizeof text);
      if (std::string(text).starts_with("127.")) continue;
      if (!addresses.empty()) addresses += ",";
      addresses += std::string(entry->ifa_name) + "=" + text;
    }
    ::freeifaddrs(list);
  }
  if (addresses.empty()) addresses = "(loopback only)";
  return fmt::format("{}\t{}\t{}", host, ::getpid(), addresses);
}

Result<std::unique_ptr<ProcessGroup>> join_group(const std::string& bootstrap, double timeout) {
  if (bootstrap == "mpi") return make_mpi_group(timeout, kExitTimeout);
  EPLB_ASSIGN_OR_RETURN(LocalGroupOptions options, launched_group_options());
  options.connect_timeout_seconds = timeout;
  return make_local_group(options);
}

Status run_rank(const BootstrapCheckOptions& options, const std::string& bootstrap) {
  EPLB_ASSIGN_OR_RETURN(auto group, join_group(bootstrap, options.timeout));
  const int rank = group->rank();
  const int size = group->size();
  EPLB_ASSIGN_OR_RETURN(auto table, group->allgather(host_description(), Deadline::after_seconds(options.timeout)));
  if (rank == 0) {
    std::printf("bootstrap-check: %d rank%s over %s\n", size, size == 1 ? "" : "s", group->backend_name().c_str());
    std::printf("%-5s %-20s %-8s %s\n", "rank", "host", "pid", "IPv4 addresses");
    for (int r = 0; r < size; ++r) {
      std::string line = table[r];
      std::string host = line.substr(0, line.find('\t'));
      std::string rest = line.substr(line.find('\t') + 1);
      std::string pid = rest.substr(0, rest.find('\t'));
      std::string addresses = rest.substr(rest.find('\t') + 1);
      std::printf("%-5d %-20s %-8s %s\n", r, host.c_str(), pid.c_str(), addresses.c_str());
    }
    std::fflush(stdout);
  }
  Stopwatch barrier_time;
  for (int round = 0; round < options.rounds; ++round)
    EPLB_TRY(group->barrier(Deadline::after_seconds(options.timeout)));
  double barrier_seconds = barrier_time.seconds();
  std::string payload(options.bytes, static_cast<char>('a' + rank % 26));
  Stopwatch allgather_time;
  for (int round = 0; round < options.rounds; ++round) {
    EPLB_ASSIGN_OR_RETURN(auto all, group->allgather(payload, Deadline::after_seconds(options.timeout)));
    for (int r = 0; r < size; ++r)
      if (all[r] != std::string(options.bytes, static_cast<char>('a' + r % 26)))
        return error(Code::Mismatch, fmt::format("allgather round {}: wrong bytes from rank {}", round, r));
  }
  double allgather_seconds = allgather_time.seconds();
  // Every rank confirms it saw the same table.
  std::string digest;
  for (const auto& entry : table) digest += entry + "\n";
  EPLB_ASSIGN_OR_RETURN(auto digests, group->allgather(digest, Deadline::after_seconds(options.timeout)));
  bool same = true;
  for (const auto& other : digests) same = same && other == digest;
  std::vector<std::string> reasons;
  EPLB_ASSIGN_OR_RETURN(bool agreed, group->vote(same, same ? "" : "saw a different table",
                                                 Deadline::after_seconds(options.timeout), &reasons));
  if (rank == 0 && options.rounds > 0) {
    std::printf("barrier:   %s per round (%d rounds)\n", format_seconds(barrier_seconds / options.rounds).c_str(),
                options.rounds);
    std::printf("allgather: %s per round of %s per rank (%d rounds)\n",
                format_seconds(allgather_seconds / options.rounds).c_str(), format_bytes(options.bytes).c_str(),
                options.rounds);
  }
  if (!agreed) {
    for (int r = 0; r < size; ++r)
      if (!reasons[r].empty()) return error(Code::Mismatch, fmt::format("rank {} {}", r, reasons[r]));
  }
  if (rank == 0) std::printf("vote: all %d ranks agree\n", size);
  return Status::ok();
}

Status run(const BootstrapCheckOptions& options) {
  std::string bootstrap = options.bootstrap;
  if (bootstrap == "auto") {
    if (launched_by_mpirun()) bootstrap = "mpi";
    else if (std::getenv("EPLB_RANK")) bootstrap = "local";
    else bootstrap = "launch";
  }
  if (bootstrap == "local" && !std::getenv("EPLB_RANK")) bootstrap = "launch";
  if (bootstrap == "launch") {
    if (options.ranks < 1) return error(Code::InvalidArgument, "--ranks must be at least 1");
    std::error_code ec;
    std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return error(Code::IoError, "cannot find the eplb executable: " + ec.message());
    LaunchOptions launch;
    launch.size = options.ranks;
    launch.argv = {self,     "bootstrap-check",         "--bootstrap", "local",
                   "--timeout", fmt::format("{}", options.timeout), "--rounds",   fmt::format("{}", options.rounds),
                   "--bytes",   fmt::format("{}", options.bytes)};
    launch.deadline = Deadline::after_seconds(options.timeout * 4 + 10);
    launch.echo_exit_codes = {kExitTimeout, kExitPeerLost};
    return launch_status(launch_local_ranks(launch));
  }
  return run_rank(options, bootstrap);
}

void add_bootstrap_check(CLI::App& app) {
  auto options = std::make_shared<BootstrapCheckOptions>();
  CLI::App* command = app.add_subcommand(
      "bootstrap-check",
      "Form the process group and show every rank's host, pid and IPv4 addresses, with barrier and\n"
      "allgather latency. Examples:\n"
      "  eplb bootstrap-check --ranks 4                      (4 local ranks over Unix sockets)\n"
      "  mpirun -np 4 eplb bootstrap-check                   (MPI; also across hosts)\n"
      "  scripts/netns_mpirun.sh -n 4 build/eplb bootstrap-check (two emulated hosts)");
  command
      ->add_option("--bootstrap", options->bootstrap,
                   "auto: mpi when started by mpirun, local when started by an eplb launcher, otherwise launch "
                   "--ranks local ranks; or force local / mpi")
      ->check(CLI::IsMember({"auto", "local", "mpi"}))
      ->capture_default_str();
  command->add_option("--ranks", options->ranks, "number of local ranks to launch (when not under mpirun)")
      ->check(integer_in(1, 1024))
      ->capture_default_str();
  command->add_option("--timeout", options->timeout, "seconds allowed for joining and for every collective")
      ->check(duration_seconds())
      ->capture_default_str();
  command->add_option("--rounds", options->rounds, "barrier and allgather rounds timed for the latency lines")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  command->add_option("--bytes", options->bytes, "bytes each rank contributes per timed allgather round")
      ->check(CLI::Range(0, 64 << 20))
      ->capture_default_str();
  command->callback([options] { set_command_result(run(*options)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(90, add_bootstrap_check);

}  // namespace eplb::cli
