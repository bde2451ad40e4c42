// xfer_bench_target.cpp - setup shared by both sides of `eplb xfer-bench`
// (transport, agent, buffers, CPU pinning) and the target's serve loop (see
// xfer_bench.h).
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/bytes.h"
#include "xfer_bench.h"

namespace eplb::cli::xfer_bench {

using xfer::Agent;
using xfer::AgentConfig;

// --- transport ---------------------------------------------------------------

Status check_transport(const std::string& transport) {
  if (transport == "shm" || transport == "tcp" || transport == "env") return Status::ok();
  return error(Code::InvalidArgument, "--transport must be shm, tcp or env, got '" + transport + "'");
}

Result<std::unique_ptr<Agent>> make_agent(const BenchOptions& options, const std::string& name) {
  AgentConfig config;
  config.name = name;
  config.backend = options.backend;
  config.copy_mapped_memory = !options.through_ucx;
  if (options.transport == "shm") config.transports = "posix,sysv,cma,self";
  if (options.transport == "tcp") {
    config.transports = "tcp,self";
    config.net_devices = "lo";
  }
  return Agent::create(config);
}

// --- buffers -------------------------------------------------------------------

Result<Buffer> make_buffer(const BenchOptions& options, Agent& agent, size_t bytes) {
  Buffer buffer;
  buffer.size = bytes;
  if (options.memory == "ucx") {
    EPLB_ASSIGN_OR_RETURN(xfer::AllocatedRegion region, agent.allocate_memory(bytes));
    buffer.data = static_cast<uint8_t*>(region.address);
  } else {
    buffer.heap.resize(bytes);
    buffer.data = buffer.heap.data();
    EPLB_ASSIGN_OR_RETURN(xfer::RegionId region, agent.register_memory({buffer.data, bytes}));
    (void)region;
  }
  return buffer;
}

// A CPU number given to --cpu / --target-cpu (`what`): -1 or an existing CPU.
Status check_cpu(int cpu, const char* what) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  if (cpu < -1 || cpu >= CPU_SETSIZE || (cpus > 0 && cpu >= cpus)) {
    return error(Code::InvalidArgument,
                 fmt::format("{} {} does not exist (this machine has {} CPUs, numbered from 0; -1: no pinning)",
                             std::string(what), cpu, cpus));
  }
  return Status::ok();
}

// Pins the calling process to one CPU (`what` names it in the error).
Status pin_to_cpu(int cpu, const char* what) {
  EPLB_TRY(check_cpu(cpu, what));
  if (cpu < 0) return Status::ok();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    return error(Code::InvalidArgument, fmt::format("cannot pin to {} {}: {}", what, cpu, std::strerror(errno)));
  }
  return Status::ok();
}

// --- target side ---------------------------------------------------------------

// busy: progress continuously (TCP and software-emulated RMA need the
// target's progress). Otherwise the peer reads and writes this memory
// without the target's CPU (UCX-allocated memory on shared memory), and the
// target sleeps on its control socket, progressing every `poll_ms`
// milliseconds (UCX keepalive): a spinning target would take CPU and memory
// bandwidth from the initiator on a small machine, and even waking once a
// millisecond, as ucx_perftest's server does in a get/put test, lined up
// with 1 MiB copies ~75 us slower in latency dumps on a 2-vCPU VM.
namespace {

// One message from the initiator: 'K' (keep-alive), 'H' (hash a range) or
// 'Q'. False when the session ends ('Q'); a malformed message, a peer that
// vanished without 'Q', or an unknown type is an error.
Result<bool> answer(int fd, const Buffer& buffer) {
  char type = 0;
  std::vector<uint8_t> payload;
  if (!receive_message(fd, &type, &payload))
    return error(Code::RemoteDisconnect,
                 "xfer-bench target: the initiator closed the control socket without 'Q', or sent a truncated or "
                 "oversized message");
  if (type == 'Q') return false;
  if (type == 'K') return true;
  if (type != 'H' || payload.size() != 16)
    return error(Code::ParseError, fmt::format("xfer-bench target: malformed control message (type 0x{:02x}, {} "
                                               "bytes; expected 'K', 'Q', or 'H' with 16 bytes)",
                                               uint8_t(type), payload.size()));
  bytes::Reader range(payload);
  const uint64_t offset = range.u64(), length = range.u64();
  const bool inside = range.ok() && offset <= buffer.size && length <= buffer.size - offset;
  bytes::Writer reply;
  reply.u64(inside ? bytes::checksum(std::span<const uint8_t>(buffer.data + offset, length)) : 0);
  if (!send_message(fd, 'h', reply.take_vector()))
    return error(Code::RemoteDisconnect, "xfer-bench target: cannot answer 'H'");
  return true;
}

// Until 'Q'. An initiator silent for longer than `idle_seconds` (it sends a
// keep-alive before every row) is a Timeout.
Status serve_loop(Agent& agent, int fd, const Buffer& buffer, bool busy, int poll_ms, double idle_seconds) {
  Deadline idle = Deadline::after_seconds(idle_seconds);
  for (;;) {
    if (idle.expired())
      return error(Code::Timeout, fmt::format("xfer-bench target: no message from the initiator for {} (--timeout)",
                                              format_seconds(idle_seconds)));
    if (busy) {
      const Stopwatch slice;
      while (slice.seconds() < 1e-3) {
        for (int i = 0; i < 64; ++i) agent.progress();
        sched_yield();
      }
    } else {
      agent.progress();
    }
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, busy ? 0 : poll_ms) <= 0) continue;
    EPLB_ASSIGN_OR_RETURN(bool more, answer(fd, buffer));
    if (!more) return Status::ok();
    idle = Deadline::after_seconds(idle_seconds);
  }
}

}  // namespace

// Serves one initiator on `fd` until 'Q'.
Status serve(const BenchOptions& options, int fd, uint64_t buffer_bytes, const std::string& raw_secret) {
  set_io_timeout(fd, options.timeout_seconds);  // the loop polls before it reads; a message must then follow
  if (!raw_secret.empty()) EPLB_TRY(check_secret(fd, raw_secret, options.timeout_seconds));
  EPLB_ASSIGN_OR_RETURN(auto agent, make_agent(options, "xfer-bench-target"));
  EPLB_ASSIGN_OR_RETURN(Buffer buffer, make_buffer(options, *agent, buffer_bytes));
  fill_pattern(buffer.data, buffer.size, 0);
  EPLB_ASSIGN_OR_RETURN(auto metadata, agent->export_metadata());
  bytes::Writer hello;
  hello.u64(reinterpret_cast<uint64_t>(buffer.data));
  hello.u64(buffer.size);
  hello.raw(std::span<const uint8_t>(metadata));
  if (!send_message(fd, 'M', hello.take_vector())) return error(Code::IoError, "xfer-bench target: cannot send metadata");
  const bool busy = options.target_spin || options.transport != "shm" || options.memory != "ucx";
  Status served = serve_loop(*agent, fd, buffer, busy, options.target_poll_ms, options.timeout_seconds);
  agent.reset();  // deregisters before a heap buffer is freed
  return served;
}

}  // namespace eplb::cli::xfer_bench
