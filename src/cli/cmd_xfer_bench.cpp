// eplb xfer-bench: transfer-layer benchmark between two processes, in the
// style of nixlbench. The initiator sweeps block sizes; for each it makes a
// request of `batch` descriptors from prepared lists, posts it, and spins on
// status() until Done, `iterations` times (xfer_bench_row.cpp). Columns:
// block size, batch, GB/s (10^9 bytes/s over the timed loop), average
// latency per request (loop time / requests), and p50 latency and prepare
// (make_request) / post / completion times, average and p99, over every 16th
// request (timed on its own: three clock reads would cost as much as a
// whole 4 KiB READ if every request paid them).
//
// The target is, by default, a second process on this machine: this
// executable re-exec'd with the hidden --serve-fd option over a socketpair.
// With --listen PORT a process serves as target for a remote --peer.
// Target protocol: target sends [u64 buffer address][u64 buffer bytes]
// [metadata]; then serves 'K' (keep-alive, before every row), 'H' (hash a
// range, for --check of WRITE) and 'Q'. Anything else, or silence longer
// than --timeout, ends the target with an error (a non-zero exit).
// --listen binds 127.0.0.1 unless --bind names another local address.
// The target's side, the control socket and the shared setup are in
// xfer_bench.h; this file is the initiator's sequence and the command line.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "options.h"
#include "common/bytes.h"
#include "common/text.h"
#include "eplb/common.h"
#include "eplb/xfer.h"
#include "xfer_bench.h"

namespace eplb::cli {
namespace {

using namespace xfer_bench;
using xfer::Operation;

// "4K..64M" (powers of two) or "4K,1M,64M", each in the byte-size grammar.
Result<std::vector<uint64_t>> parse_sizes(const std::string& text) {
  auto size = [](std::string_view item) { return parse_byte_size(item).status().with_context("--block-sizes"); };
  std::vector<uint64_t> sizes;
  const auto range = text.find("..");
  if (range == std::string::npos) {
    for (std::string_view item : text::split(text, ',')) {
      auto bytes = parse_byte_size(item);
      if (!bytes) return size(item);
      sizes.push_back(*bytes);
    }
    return sizes;
  }
  auto low = parse_byte_size(std::string_view(text).substr(0, range));
  auto high = parse_byte_size(std::string_view(text).substr(range + 2));
  if (!low || !high) return size(!low ? text.substr(0, range) : text.substr(range + 2));
  if (*low > *high) return error(Code::InvalidArgument, "--block-sizes: range '" + text + "' is empty");
  for (uint64_t bytes = *low; bytes <= *high; bytes *= 2) sizes.push_back(bytes);
  return sizes;
}

void print_table(const std::vector<Row>& rows, const BenchOptions& options, const std::string& transports) {
  std::printf("# eplb xfer-bench: %s, backend %s, memory %s, transport %s (%s)\n", options.op.c_str(),
              options.backend.c_str(), options.memory.c_str(), options.transport.c_str(), transports.c_str());
  std::printf("%-10s %6s %7s %9s %12s %12s %21s %21s %21s %6s %12s\n", "block", "batch", "iters", "GB/s",
              "avg lat us", "p50 lat us", "prepare us avg/p99", "post us avg/p99", "completion us avg/p99", "check",
              "memcpy GB/s");
  for (const Row& row : rows)
    std::printf("%-10s %6d %7d %9.3f %12.2f %12.2f %21s %21s %21s %6s %12.3f\n", size_label(row.block).c_str(),
                row.batch, row.iterations, row.gigabytes_per_second, row.average_latency_us, row.median_latency_us,
                fmt::format("{:.2f}/{:.2f}", row.prepare_us, row.prepare_p99_us).c_str(),
                fmt::format("{:.2f}/{:.2f}", row.post_us, row.post_p99_us).c_str(),
                fmt::format("{:.1f}/{:.1f}", row.completion_us, row.completion_p99_us).c_str(), row.check.c_str(),
                row.memcpy_gigabytes_per_second);
}

void print_json(const std::vector<Row>& rows, const BenchOptions& options, const std::string& transports) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& row : rows) {
    out.push_back({{"op", options.op},
                   {"memory", options.memory},
                   {"transport", options.transport},
                   {"transports", transports},
                   {"block_bytes", row.block},
                   {"batch", row.batch},
                   {"iterations", row.iterations},
                   {"gigabytes_per_second", row.gigabytes_per_second},
                   {"average_latency_us", row.average_latency_us},
                   {"median_latency_us", row.median_latency_us},
                   {"prepare_us", row.prepare_us},
                   {"prepare_p99_us", row.prepare_p99_us},
                   {"post_us", row.post_us},
                   {"post_p99_us", row.post_p99_us},
                   {"completion_us", row.completion_us},
                   {"completion_p99_us", row.completion_p99_us},
                   {"check", row.check},
                   {"memcpy_gigabytes_per_second", row.memcpy_gigabytes_per_second}});
  }
  std::printf("%s\n", out.dump(2).c_str());
}

// Starts this executable again as the target, over a socketpair. The
// arguments are built before fork(): the child only calls execv.
Result<Target> fork_target(const BenchOptions& options, uint64_t bytes) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return error(Code::IoError, "socketpair failed");
  ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  std::vector<std::string> args = {"eplb",           "xfer-bench",
                                   "--serve-fd",     fmt::format("{}", fds[1]),
                                   "--serve-bytes",  fmt::format("{}", bytes),
                                   "--transport",    options.transport,
                                   "--backend",      options.backend,
                                   "--memory",       options.memory,
                                   "--target-poll-ms", fmt::format("{}", options.target_poll_ms),
                                   "--timeout",      fmt::format("{}", options.timeout_seconds)};
  if (options.target_spin) args.push_back("--target-spin");
  if (options.target_cpu >= 0) args.insert(args.end(), {"--cpu", fmt::format("{}", options.target_cpu)});
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return error(Code::IoError, "fork failed");
  if (pid == 0) {
    ::execv("/proc/self/exe", const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  ::close(fds[1]);
  Target target;
  target.fd = fds[0];
  target.pid = pid;
  return target;
}

// Says goodbye to the target and reaps a forked one (bounded).
Status finish(Target& target, Status status) {
  if (target.fd >= 0) {
    (void)send_message(target.fd, 'Q', {});
    ::close(target.fd);
  }
  if (target.pid <= 0) return status;
  int child_status = 0;
  const Deadline deadline = Deadline::after_seconds(10);
  while (::waitpid(target.pid, &child_status, WNOHANG) == 0) {
    if (deadline.expired()) {
      ::kill(target.pid, SIGKILL);
      ::waitpid(target.pid, &child_status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

Status check_options(const BenchOptions& options) {
  EPLB_TRY(check_transport(options.transport));
  if (options.memory != "ucx" && options.memory != "user")
    return error(Code::InvalidArgument, "--memory must be ucx or user, got '" + options.memory + "'");
  if (options.batch < 1 || options.batch > 65536) return error(Code::InvalidArgument, "--batch must be 1..65536");
  if (options.iterations < 0) return error(Code::InvalidArgument, "--iterations must be >= 0 (0: automatic)");
  if (options.warmup < 0) return error(Code::InvalidArgument, "--warmup must be >= 0");
  if (options.op != "read" && options.op != "write")
    return error(Code::InvalidArgument, "--op must be read or write, got '" + options.op + "'");
  if (options.target_cpu >= 0 && (!options.peer.empty() || options.listen_port > 0))
    return error(Code::InvalidArgument,
                 "--target-cpu pins the forked target; with --listen/--peer use --cpu on each side");
  EPLB_TRY(check_cpu(options.target_cpu, "--target-cpu"));  // applied by the target itself
  EPLB_TRY(check_duration(options.timeout_seconds, "--timeout"));
  EPLB_TRY(check_duration(options.listen_timeout_seconds, "--listen-timeout"));
  return Status::ok();
}

// The target's greeting: its buffer and its transfer metadata.
Status greet_target(const BenchOptions& options, Target& target, uint64_t bytes, std::vector<uint8_t>& metadata) {
  set_io_timeout(target.fd, options.timeout_seconds);
  char type = 0;
  std::vector<uint8_t> hello;
  if (!receive_message(target.fd, &type, &hello) || type != 'M' || hello.size() < 16)
    return error(Code::RemoteDisconnect, "xfer-bench: the target did not send its metadata within " +
                                             format_seconds(options.timeout_seconds) + " (--timeout)");
  bytes::Reader reader(hello);
  target.address = reader.u64();
  target.bytes = reader.u64();
  if (target.bytes < bytes)
    return error(Code::Mismatch, fmt::format("xfer-bench: the target registered {}, this run needs {} (start it "
                                             "with the same --block-sizes and --batch)",
                                             format_bytes(target.bytes), format_bytes(bytes)));
  metadata.assign(hello.begin() + 16, hello.end());
  return Status::ok();
}

// The initiator's side once the target is there: every row, then the output.
Status measure(const BenchOptions& options, Target& target, const std::vector<uint64_t>& sizes, uint64_t bytes) {
  std::vector<uint8_t> metadata;
  EPLB_TRY(greet_target(options, target, bytes, metadata));
  EPLB_ASSIGN_OR_RETURN(auto agent, make_agent(options, "xfer-bench-initiator"));
  EPLB_ASSIGN_OR_RETURN(Buffer local, make_buffer(options, *agent, bytes));
  auto name = agent->load_metadata(metadata);
  if (!name) return name.status().with_context("xfer-bench: target metadata");
  target.name = *name;
  const Operation op = options.op == "read" ? Operation::Read : Operation::Write;
  std::vector<Row> rows;
  Status measured;
  for (size_t i = 0; i < sizes.size() && measured.is_ok(); ++i) {
    // A keep-alive before every row: the target gives up on an initiator
    // silent for longer than --timeout.
    if (!send_message(target.fd, 'K', {})) {
      measured = error(Code::RemoteDisconnect, "xfer-bench: the target closed the control socket");
      break;
    }
    auto row = run_row(options, *agent, target, op, sizes[i], local.data);
    if (row) rows.push_back(*row);
    else measured = row.status();
  }
  const std::string transports = agent->transports();
  agent.reset();  // deregisters before a heap buffer is freed
  EPLB_TRY(measured);
  if (options.json) print_json(rows, options, transports);
  else print_table(rows, options, transports);
  return Status::ok();
}

Status run_bench(const BenchOptions& options) {
  EPLB_TRY(check_options(options));
  EPLB_ASSIGN_OR_RETURN(auto sizes, parse_sizes(options.block_sizes));
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  if (largest * static_cast<uint64_t>(options.batch) > (16ull << 30))
    return error(Code::InvalidArgument, "block size x batch exceeds 16 GiB");
  const uint64_t bytes = largest * static_cast<uint64_t>(options.batch);
  EPLB_TRY(pin_to_cpu(options.cpu, "--cpu"));
  if (options.listen_port > 0) {
    EPLB_ASSIGN_OR_RETURN(std::string secret, listen_secret());
    EPLB_ASSIGN_OR_RETURN(int fd,
                          accept_one(options.bind_address, options.listen_port, options.listen_timeout_seconds));
    Status served = serve(options, fd, bytes, secret);
    ::close(fd);
    return served;
  }
  Target target;
  if (!options.peer.empty()) {
    EPLB_TRY(check_peer(options.peer));
    EPLB_ASSIGN_OR_RETURN(std::string secret, peer_secret());
    EPLB_ASSIGN_OR_RETURN(target.fd, connect_to(options.peer));
    if (!send_secret(target.fd, secret)) {
      ::close(target.fd);
      return error(Code::RemoteDisconnect, fmt::format("xfer-bench: cannot send the secret to {}", options.peer));
    }
  } else {
    EPLB_ASSIGN_OR_RETURN(target, fork_target(options, bytes));
  }
  return finish(target, measure(options, target, sizes, bytes));
}

void add_workload_options(CLI::App& command, BenchOptions& options) {
  command.add_option("--op", options.op, "read (pull from the target) or write (push to it)")->capture_default_str();
  command.add_option("--block-sizes", options.block_sizes,
                     "block sizes: a power-of-two range LOW..HIGH or a list A,B,C, each a byte size (4096, 4K,\n"
                     "1MiB, 1.5M; units are powers of 1024)")
      ->capture_default_str();
  command.add_option("--batch", options.batch, "descriptors per request (each one block)")->capture_default_str();
  command.add_option("--iterations", options.iterations,
                     "timed requests per block size (0: automatic, ~1 GiB moved, 20..2000)")
      ->capture_default_str();
  command.add_option("--warmup", options.warmup, "untimed requests before each block size")->capture_default_str();
  command.add_option("--transport", options.transport,
                     "shm (UCX transports posix,sysv,cma,self), tcp (tcp,self on device lo), or env (UCX's own choice); "
                     "a UCX_TLS or UCX_NET_DEVICES in the environment wins")
      ->capture_default_str();
  command.add_option("--backend", options.backend, "transfer backend: ucx or loopback")->capture_default_str();
  command.add_option("--memory", options.memory,
                     "ucx: buffers allocated by the backend (shared-memory segments peers map directly); "
                     "user: heap buffers registered with register_memory")
      ->capture_default_str();
  command.add_flag("--reuse-request", options.reuse_request,
                   "make one request per block size and repost it every iteration (NIXL's pattern for "
                   "repeated transfers); default: make_request + post + release every iteration");
  command.add_flag("--through-ucx", options.through_ucx,
                   "with --backend ucx: every READ/WRITE goes through ucp_get_nbx/ucp_put_nbx, as ucx_perftest "
                   "measures it; default: peer memory UCX maps into this process (shared memory) is copied with "
                   "one memcpy inside post()");
  command.add_flag("!--no-yield", options.yield,
                   "spin without sched_yield() between polls (default yields, kinder to a shared machine)");
}

void add_target_options(CLI::App& command, BenchOptions& options) {
  command.add_flag("--target-spin", options.target_spin,
                   "the target progresses continuously even with --transport shm --memory ucx, where the "
                   "initiator reads and writes its memory without it (default: it then sleeps on its control "
                   "socket and progresses every --target-poll-ms)");
  command.add_option("--target-poll-ms", options.target_poll_ms,
                     "when the target need not progress (shm, --memory ucx): milliseconds it sleeps between "
                     "progress calls; 1 is what ucx_perftest's server does, and its wake-ups slow the initiator")
      ->check(integer_in(1, 1000))
      ->capture_default_str();
  command.add_option("--cpu", options.cpu,
                     "pin this process to this CPU (the initiator, or the target with --listen; -1: no pinning)")
      ->capture_default_str();
  command.add_option("--target-cpu", options.target_cpu, "pin the forked target to this CPU (-1: no pinning)")
      ->capture_default_str();
  command.add_option("--peer", options.peer, "HOST:PORT of a target started with --listen (default: fork one)");
  command.add_option("--listen", options.listen_port,
                     "serve as the target for one --peer on this TCP port (1-65535), on --bind's address")
      ->check(integer_in(1, 65535));
  command.add_option("--bind", options.bind_address,
                     "the local IPv4 address --listen binds; 0.0.0.0 serves every interface. The target serves only\n"
                     "a client that proves EPLB_XFER_BENCH_SECRET (64 hex digits; unset, the target makes one and\n"
                     "prints it): set it in the --peer side's environment")
      ->capture_default_str();
  command.add_option("--listen-timeout", options.listen_timeout_seconds,
                     "seconds (at most 86400) --listen waits for its --peer to connect")
      ->capture_default_str();
  command.add_option("--timeout", options.timeout_seconds,
                     "deadline in seconds (at most 86400) for each request, and for each message between initiator\n"
                     "and target")
      ->capture_default_str();
}

// The hidden --serve-fd mode: serve as the forked target.
Status serve_forked(const BenchOptions& options, uint64_t serve_bytes) {
  if (serve_bytes == 0) return error(Code::InvalidArgument, "--serve-fd needs --serve-bytes");
  EPLB_TRY(check_transport(options.transport));
  EPLB_TRY(pin_to_cpu(options.cpu, "--cpu"));
  return serve(options, options.serve_fd, serve_bytes);
}

void add_xfer_bench(CLI::App& app) {
  auto* command = app.add_subcommand(
      "xfer-bench",
      "Benchmark the transfer layer between two processes (nixlbench-style columns).\n"
      "By default forks a target process on this machine; --listen/--peer run across machines.");
  static BenchOptions options;
  static uint64_t serve_bytes = 0;
  add_workload_options(*command, options);
  add_target_options(*command, options);
  command->add_flag("--check", options.check, "verify the transferred bytes of every block size");
  command->add_flag("--json", options.json, "print the rows as JSON instead of a table");
  command->add_option("--serve-fd", options.serve_fd, "internal: serve as the forked target on this descriptor")
      ->group("");
  command->add_option("--serve-bytes", serve_bytes, "internal: bytes the forked target registers")->group("");
  command->callback([] {
    set_command_result(options.serve_fd >= 0 ? serve_forked(options, serve_bytes) : run_bench(options));
  });
}

EPLB_REGISTER_COMMAND(90, add_xfer_bench);

}  // namespace
}  // namespace eplb::cli
