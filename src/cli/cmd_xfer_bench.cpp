// eplb xfer-bench: transfer-layer benchmark between two processes, in the
// style of nixlbench. The initiator sweeps block sizes; for each it makes a
// request of `batch` descriptors from prepared lists, posts it, and spins on
// status() until Done, `iterations` times. Columns: block size, batch,
// GB/s (10^9 bytes/s over the timed loop), average latency per request,
// and prepare (make_request) / post / completion times, average and p99.
//
// The target is, by default, a second process on this machine: this
// executable re-exec'd with the hidden --serve-fd option over a socketpair.
// With --listen PORT a process serves as target for a remote --peer.
// Target protocol: target sends [u64 buffer address][u64 buffer bytes]
// [metadata]; then serves 'H' (hash a range, for --check of WRITE) and 'Q'.
// The target's side, the control socket and the shared setup are in
// xfer_bench.h; this file is the initiator and the command line.
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "eplb/common.h"
#include "eplb/xfer.h"
#include "xfer_bench.h"

namespace eplb::cli {
namespace {

using namespace xfer_bench;
using xfer::Agent;
using xfer::AgentConfig;
using xfer::Descriptor;
using xfer::Operation;
using xfer::RequestState;

// --- sizes ---------------------------------------------------------------

Result<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return error(Code::InvalidArgument, "empty block size");
  size_t used = 0;
  uint64_t value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (...) {
    return error(Code::InvalidArgument, "bad block size '" + text + "' (examples: 4096, 4K, 1M, 64M)");
  }
  const std::string unit = text.substr(used);
  uint64_t scale = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") scale = 1ull << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") scale = 1ull << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") scale = 1ull << 30;
  else if (!unit.empty() && unit != "B") return error(Code::InvalidArgument, "bad unit in block size '" + text + "'");
  if (value == 0 || value > (1ull << 34) / scale) return error(Code::InvalidArgument, "block size '" + text + "' out of range");
  return value * scale;
}

// "4K..64M" (powers of two) or "4K,1M,64M".
Result<std::vector<uint64_t>> parse_sizes(const std::string& text) {
  std::vector<uint64_t> sizes;
  const auto range = text.find("..");
  if (range != std::string::npos) {
    EPLB_ASSIGN_OR_RETURN(uint64_t low, parse_size(text.substr(0, range)));
    EPLB_ASSIGN_OR_RETURN(uint64_t high, parse_size(text.substr(range + 2)));
    if (low > high) return error(Code::InvalidArgument, "block size range '" + text + "' is empty");
    for (uint64_t size = low; size <= high; size *= 2) sizes.push_back(size);
    return sizes;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    EPLB_ASSIGN_OR_RETURN(uint64_t size, parse_size(item));
    sizes.push_back(size);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

std::string size_label(uint64_t bytes) {
  if (bytes % (1ull << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// --- initiator side --------------------------------------------------------------

struct Row {
  uint64_t block = 0;
  int batch = 0;
  int iterations = 0;
  double gigabytes_per_second = 0;
  double average_latency_us = 0;
  double median_latency_us = 0;  // p50 of prepare + post + completion
  double prepare_us = 0, prepare_p99_us = 0;
  double post_us = 0, post_p99_us = 0;
  double completion_us = 0, completion_p99_us = 0;
  std::string check = "-";
  double memcpy_gigabytes_per_second = 0;  // reference: local memcpy of the same bytes
};

// Local memcpy of `bytes` from a scratch buffer into `destination`, as a
// reference for what a copy costs on this machine at this moment.
double memcpy_reference(uint8_t* destination, uint64_t bytes, int iterations) {
  std::vector<uint8_t> source(bytes, 0x5a);
  std::memcpy(destination, source.data(), bytes);  // warm
  const Stopwatch clock;
  for (int i = 0; i < iterations; ++i) {
    std::memcpy(destination, source.data(), bytes);
    asm volatile("" ::: "memory");
  }
  return static_cast<double>(bytes) * iterations / clock.seconds() / 1e9;
}

double average(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

double percentile50(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

double percentile99(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(values.size()))) - 1;
  return values[std::min(index, values.size() - 1)];
}

struct Target {
  int fd = -1;
  pid_t pid = -1;  // forked child, if any
  uint64_t address = 0;
  uint64_t bytes = 0;
  std::string name;
};

Result<Row> run_row(const BenchOptions& options, Agent& agent, Target& target, Operation op, uint64_t block,
                    uint8_t* local) {
  Row row;
  row.block = block;
  row.batch = options.batch;
  const uint64_t bytes_per_request = block * static_cast<uint64_t>(options.batch);
  row.iterations = options.iterations > 0
                       ? options.iterations
                       : static_cast<int>(std::clamp<uint64_t>((1ull << 30) / bytes_per_request, 20, 2000));

  std::vector<Descriptor> locals, remotes;
  for (int i = 0; i < options.batch; ++i) {
    locals.push_back({reinterpret_cast<uint64_t>(local) + i * block, block, 0});
    remotes.push_back({target.address + i * block, block, 0});
  }
  EPLB_ASSIGN_OR_RETURN(auto local_list, agent.prepare_local(locals));
  EPLB_ASSIGN_OR_RETURN(auto remote_list, agent.prepare_remote(target.name, remotes));
  if (options.check) {
    if (op == Operation::Read) std::memset(local, 0, bytes_per_request);
    else fill_pattern(local, bytes_per_request, block);
  }

  std::vector<double> prepare, post, completion, whole;
  std::optional<xfer::RequestId> reused;
  double made_us = 0;
  const int total = options.warmup + row.iterations;
  Stopwatch timed_loop;
  for (int iteration = 0; iteration < total; ++iteration) {
    if (iteration == options.warmup) {
      timed_loop.reset();
      prepare.clear();
      post.clear();
      completion.clear();
      whole.clear();
    }
    const Stopwatch step;
    // --reuse-request: the request made for the first iteration is reposted
    // (NIXL's pattern for repeated transfers); its make_request counts once.
    const bool make = !options.reuse_request || !reused;
    if (make) {
      auto made = agent.make_request(op, local_list, {}, remote_list, {});
      if (!made) return made.status();
      reused = *made;
      made_us = step.seconds() * 1e6;
    }
    const std::optional<xfer::RequestId> request = reused;
    const double prepared = make ? step.seconds() : 0.0;
    Status posted = agent.post(*request);
    if (!posted) return posted;
    const double post_done = step.seconds();
    xfer::RequestStatus status = agent.status(*request);
    // The deadline is set when the first status says InProgress: a READ
    // that UCX completed inside post() then costs no clock read for it.
    std::optional<Deadline> deadline;
    if (status.state == RequestState::InProgress) deadline = Deadline::after_seconds(options.timeout_seconds);
    for (unsigned spins = 0; status.state == RequestState::InProgress; ++spins) {
      if ((spins & 255) == 255 && deadline->expired()) {
        (void)agent.release(*request);
        return error(Code::Timeout, std::string(xfer::operation_name(op)) + " of " + size_label(block) + " x " +
                                        std::to_string(options.batch) + " did not complete in " +
                                        format_seconds(options.timeout_seconds));
      }
      // Yield between polls: on a shared machine the target (which may
      // have to serve the request) gets the core sooner.
      if (options.yield) sched_yield();
      status = agent.status(*request);
    }
    const double finished = step.seconds();
    if (status.state == RequestState::Failed) {
      (void)agent.release(*request);
      return status.failure;
    }
    if (!options.reuse_request) {
      EPLB_TRY(agent.release(*request));
      reused.reset();
    }
    if (make) prepare.push_back(prepared * 1e6);
    post.push_back((post_done - prepared) * 1e6);
    completion.push_back((finished - post_done) * 1e6);
    whole.push_back(finished * 1e6);
  }
  const double seconds = timed_loop.seconds();
  if (options.reuse_request) {
    EPLB_TRY(agent.release(*reused));
    prepare.assign(1, made_us);  // the one make_request of this block size
  }
  row.gigabytes_per_second = static_cast<double>(bytes_per_request) * row.iterations / seconds / 1e9;
  row.average_latency_us = seconds / row.iterations * 1e6;
  row.median_latency_us = percentile50(whole);
  row.prepare_us = average(prepare);
  row.prepare_p99_us = percentile99(prepare);
  row.post_us = average(post);
  row.post_p99_us = percentile99(post);
  row.completion_us = average(completion);
  row.completion_p99_us = percentile99(completion);

  row.memcpy_gigabytes_per_second = memcpy_reference(local, bytes_per_request, row.iterations);
  if (options.check) {
    if (op == Operation::Read) {  // the reference copy overwrote the data: read once more
      auto request = agent.make_request(op, local_list, {}, remote_list, {});
      if (!request) return request.status();
      EPLB_TRY(agent.post(*request));
      const xfer::RequestId id = *request;
      EPLB_TRY(agent.wait({&id, 1}, Deadline::after_seconds(options.timeout_seconds)));
      EPLB_TRY(agent.release(*request));
    } else {
      fill_pattern(local, bytes_per_request, block);
      // WRITE checked below against what the last timed request wrote (the same pattern).
    }
    bool ok = true;
    if (op == Operation::Read) {
      for (uint64_t i = 0; i < bytes_per_request && ok; ++i) ok = local[i] == pattern_byte(i);
    } else {
      std::vector<uint8_t> range;
      put_u64(range, 0);
      put_u64(range, bytes_per_request);
      char type = 0;
      std::vector<uint8_t> reply;
      if (!send_message(target.fd, 'H', range) || !receive_message(target.fd, &type, &reply) || type != 'h') {
        return error(Code::IoError, "xfer-bench: target did not answer the check");
      }
      ok = get_u64(reply, 0) == fnv1a(local, bytes_per_request);
    }
    row.check = ok ? "ok" : "MISMATCH";
    if (!ok) {
      return error(Code::Mismatch, std::string(xfer::operation_name(op)) + " of " + size_label(block) + " x " +
                                       std::to_string(options.batch) + ": bytes differ after the transfer");
    }
  }
  EPLB_TRY(agent.release_descriptor_list(local_list));
  EPLB_TRY(agent.release_descriptor_list(remote_list));
  return row;
}

void print_table(const std::vector<Row>& rows, const BenchOptions& options) {
  std::printf("# eplb xfer-bench: %s, backend %s, memory %s, transport %s (UCX_TLS=%s)\n", options.op.c_str(),
              options.backend.c_str(), options.memory.c_str(), options.transport.c_str(),
              std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "default");
  std::printf("%-10s %6s %7s %9s %12s %12s %21s %21s %21s %6s %12s\n", "block", "batch", "iters", "GB/s",
              "avg lat us", "p50 lat us",
              "prepare us avg/p99", "post us avg/p99", "completion us avg/p99", "check", "memcpy GB/s");
  for (const Row& row : rows) {
    char prepare[32], post[32], completion[32];
    std::snprintf(prepare, sizeof(prepare), "%.2f/%.2f", row.prepare_us, row.prepare_p99_us);
    std::snprintf(post, sizeof(post), "%.2f/%.2f", row.post_us, row.post_p99_us);
    std::snprintf(completion, sizeof(completion), "%.1f/%.1f", row.completion_us, row.completion_p99_us);
    std::printf("%-10s %6d %7d %9.3f %12.2f %12.2f %21s %21s %21s %6s %12.3f\n", size_label(row.block).c_str(),
                row.batch, row.iterations, row.gigabytes_per_second, row.average_latency_us, row.median_latency_us,
                prepare, post, completion,
                row.check.c_str(), row.memcpy_gigabytes_per_second);
  }
}

void print_json(const std::vector<Row>& rows, const BenchOptions& options) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& row : rows) {
    out.push_back({{"op", options.op},
                   {"memory", options.memory},
                   {"transport", options.transport},
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
  const std::string fd = std::to_string(fds[1]), buffer = std::to_string(bytes);
  const std::string cpu = std::to_string(options.target_cpu), poll_ms = std::to_string(options.target_poll_ms);
  const std::string timeout = std::to_string(options.timeout_seconds);
  std::vector<const char*> argv = {"eplb",         "xfer-bench",           "--serve-fd", fd.c_str(),
                                   "--serve-bytes", buffer.c_str(),        "--transport", options.transport.c_str(),
                                   "--backend",     options.backend.c_str(), "--memory",  options.memory.c_str(),
                                   "--target-poll-ms", poll_ms.c_str(), "--timeout", timeout.c_str()};
  if (options.target_spin) argv.push_back("--target-spin");
  if (options.target_cpu >= 0) {
    argv.push_back("--cpu");
    argv.push_back(cpu.c_str());
  }
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

Status run_bench(const BenchOptions& options) {
  EPLB_TRY(apply_transport(options.transport));
  if (options.memory != "ucx" && options.memory != "user") {
    return error(Code::InvalidArgument, "--memory must be ucx or user, got '" + options.memory + "'");
  }
  if (options.batch < 1 || options.batch > 65536) return error(Code::InvalidArgument, "--batch must be 1..65536");
  if (options.iterations < 0) return error(Code::InvalidArgument, "--iterations must be >= 0 (0: automatic)");
  if (options.warmup < 0) return error(Code::InvalidArgument, "--warmup must be >= 0");
  if (options.op != "read" && options.op != "write") {
    return error(Code::InvalidArgument, "--op must be read or write, got '" + options.op + "'");
  }
  const Operation op = options.op == "read" ? Operation::Read : Operation::Write;
  EPLB_ASSIGN_OR_RETURN(auto sizes, parse_sizes(options.block_sizes));
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  if (largest * static_cast<uint64_t>(options.batch) > (16ull << 30)) {
    return error(Code::InvalidArgument, "block size x batch exceeds 16 GiB");
  }
  const uint64_t bytes = largest * static_cast<uint64_t>(options.batch);
  if (options.target_cpu >= 0 && (!options.peer.empty() || options.listen_port > 0)) {
    return error(Code::InvalidArgument, "--target-cpu pins the forked target; with --listen/--peer use --cpu on each side");
  }
  EPLB_TRY(check_cpu(options.target_cpu, "--target-cpu"));  // applied by the target itself
  EPLB_TRY(pin_to_cpu(options.cpu, "--cpu"));

  if (options.listen_port > 0) {
    EPLB_ASSIGN_OR_RETURN(int fd, accept_one(options.listen_port, options.listen_timeout_seconds));
    Status served = serve(options, fd, bytes);
    ::close(fd);
    return served;
  }

  Target target;
  if (!options.peer.empty()) {
    EPLB_ASSIGN_OR_RETURN(target.fd, connect_to(options.peer));
  } else {
    EPLB_ASSIGN_OR_RETURN(target, fork_target(options, bytes));
  }
  auto finish = [&target](Status status) {
    if (target.fd >= 0) {
      (void)send_message(target.fd, 'Q', {});
      ::close(target.fd);
    }
    if (target.pid > 0) {
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
    }
    return status;
  };

  set_io_timeout(target.fd, options.timeout_seconds);
  char type = 0;
  std::vector<uint8_t> hello;
  if (!receive_message(target.fd, &type, &hello) || type != 'M' || hello.size() < 16) {
    return finish(error(Code::RemoteDisconnect, "xfer-bench: the target did not send its metadata within " +
                                                    format_seconds(options.timeout_seconds) + " (--timeout)"));
  }
  target.address = get_u64(hello, 0);
  target.bytes = get_u64(hello, 8);
  if (target.bytes < bytes) {
    return finish(error(Code::Mismatch, "xfer-bench: the target registered " + format_bytes(target.bytes) +
                                            ", this run needs " + format_bytes(bytes) +
                                            " (start it with the same --block-sizes and --batch)"));
  }
  auto agent = make_agent(options, "xfer-bench-initiator");
  if (!agent) return finish(agent.status());
  auto local = make_buffer(options, **agent, bytes);
  if (!local) return finish(local.status());
  auto name = (*agent)->load_metadata(std::span<const uint8_t>(hello).subspan(16));
  if (!name) return finish(name.status().with_context("xfer-bench: target metadata"));
  target.name = *name;

  std::vector<Row> rows;
  for (uint64_t block : sizes) {
    auto row = run_row(options, **agent, target, op, block, local->data);
    if (!row) return finish(row.status());
    rows.push_back(*row);
  }
  agent->reset();
  if (options.json) print_json(rows, options);
  else print_table(rows, options);
  return finish(Status::ok());
}

void add_xfer_bench(CLI::App& app) {
  auto* command = app.add_subcommand(
      "xfer-bench",
      "Benchmark the transfer layer between two processes (nixlbench-style columns).\n"
      "By default forks a target process on this machine; --listen/--peer run across machines.");
  static BenchOptions options;
  command->add_option("--op", options.op, "read (pull from the target) or write (push to it)")
      ->capture_default_str();
  command->add_option("--block-sizes", options.block_sizes,
                      "block sizes: a power-of-two range LOW..HIGH or a list A,B,C (units K, M, G)")
      ->capture_default_str();
  command->add_option("--batch", options.batch, "descriptors per request (each one block)")->capture_default_str();
  command->add_option("--iterations", options.iterations,
                      "timed requests per block size (0: automatic, ~1 GiB moved, 20..2000)")
      ->capture_default_str();
  command->add_option("--warmup", options.warmup, "untimed requests before each block size")->capture_default_str();
  command->add_option("--transport", options.transport,
                      "shm (UCX_TLS=posix,sysv,cma,self), tcp (UCX_TLS=tcp,self on lo), or env (keep UCX_TLS)")
      ->capture_default_str();
  command->add_option("--backend", options.backend, "transfer backend: ucx or loopback")->capture_default_str();
  command->add_option("--memory", options.memory,
                      "ucx: buffers allocated by the backend (shared-memory segments peers map directly); "
                      "user: heap buffers registered with register_memory")
      ->capture_default_str();
  command->add_flag("--reuse-request", options.reuse_request,
                    "make one request per block size and repost it every iteration (NIXL's pattern for "
                    "repeated transfers); default: make_request + post + release every iteration");
  command->add_flag("--target-spin", options.target_spin,
                    "the target progresses continuously even with --transport shm --memory ucx, where the "
                    "initiator reads and writes its memory without it (default: it then sleeps on its control "
                    "socket and progresses every --target-poll-ms)");
  command->add_option("--target-poll-ms", options.target_poll_ms,
                      "when the target need not progress (shm, --memory ucx): milliseconds it sleeps between "
                      "progress calls; 1 is what ucx_perftest's server does, and its wake-ups slow the initiator")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  command->add_flag("!--no-yield", options.yield,
                    "spin without sched_yield() between polls (default yields, kinder to a shared machine)");
  command->add_option("--cpu", options.cpu,
                      "pin this process to this CPU (the initiator, or the target with --listen; -1: no pinning)")
      ->capture_default_str();
  command->add_option("--target-cpu", options.target_cpu, "pin the forked target to this CPU (-1: no pinning)")
      ->capture_default_str();
  command->add_option("--peer", options.peer, "HOST:PORT of a target started with --listen (default: fork one)");
  command->add_option("--listen", options.listen_port, "serve as the target for one --peer on this TCP port");
  command->add_option("--listen-timeout", options.listen_timeout_seconds,
                      "seconds --listen waits for its --peer to connect")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--timeout", options.timeout_seconds,
                      "deadline in seconds for each request, and for each message between initiator and target")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--check", options.check, "verify the transferred bytes of every block size");
  command->add_flag("--json", options.json, "print the rows as JSON instead of a table");
  static uint64_t serve_bytes = 0;
  command->add_option("--serve-fd", options.serve_fd, "internal: serve as the forked target on this descriptor")
      ->group("");
  command->add_option("--serve-bytes", serve_bytes, "internal: bytes the forked target registers")->group("");
  command->callback([] {
    BenchOptions effective = options;
    if (effective.serve_fd >= 0) {
      if (serve_bytes == 0) {
        set_command_result(error(Code::InvalidArgument, "--serve-fd needs --serve-bytes"));
        return;
      }
      Status transport = apply_transport(effective.transport);
      if (!transport) {
        set_command_result(transport);
        return;
      }
      Status pinned = pin_to_cpu(effective.cpu, "--cpu");
      set_command_result(pinned ? serve(effective, effective.serve_fd, serve_bytes) : pinned);
      return;
    }
    set_command_result(run_bench(effective));
  });
}

EPLB_REGISTER_COMMAND(90, add_xfer_bench);

}  // namespace
}  // namespace eplb::cli
