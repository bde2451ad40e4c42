// xfer_bench_row.cpp - one row of `eplb xfer-bench`: for one block size,
// `iterations` timed requests of `batch` descriptors (make_request, post,
// spin on status() until Done, release), the memcpy reference, and the
// optional --check of the transferred bytes (see xfer_bench.h).
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/bytes.h"
#include "xfer_bench.h"

namespace eplb::cli::xfer_bench {
namespace {

using xfer::Agent;
using xfer::Operation;
using xfer::RequestState;

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

// Per-iteration times (microseconds) of the timed loop.
struct Samples {
  std::vector<double> prepare, post, completion, whole;
  void clear() { prepare.clear(), post.clear(), completion.clear(), whole.clear(); }
  // Allocated and touched before the timed loop: no allocation and no page
  // fault inside it (a fault every 128 pushes made 4 KiB READs' average
  // latency 0.68 us against a 0.12 us median on this VM).
  void reserve(size_t n) {
    for (std::vector<double>* values : {&prepare, &post, &completion, &whole}) values->assign(n, 0.0), values->clear();
  }
};

// The request the loop reposts with --reuse-request, or the one it makes now.
struct Requests {
  xfer::DescriptorListId local = 0, remote = 0;
  std::optional<xfer::RequestId> reused;
  double made_us = 0;
};

std::string label(const BenchOptions& options, Operation op, uint64_t block) {
  return fmt::format("{} of {} x {}", xfer::operation_name(op), size_label(block), options.batch);
}

// Every kLatencyStride-th request of the timed loop is timed on its own
// (three clock reads, about 0.04 us each on this class of VM, as much as
// a whole 4 KiB READ); the others are counted only by the loop's clock.
constexpr int kLatencyStride = 16;

// One request: make (unless reused), post, spin on status() until Done with
// a deadline, release (unless reused). With `sample`, its times go to
// `samples`.
Status timed_request(const BenchOptions& options, Agent& agent, Operation op, uint64_t block, Requests& requests,
                     Samples& samples, bool sample) {
  std::optional<Stopwatch> step;
  if (sample) step.emplace();
  const auto elapsed = [&step] { return step ? step->seconds() : 0.0; };
  // --reuse-request: the request made for the first iteration is reposted
  // (NIXL's pattern for repeated transfers); its make_request counts once.
  const bool make = !options.reuse_request || !requests.reused;
  if (make) {
    const Stopwatch making;
    EPLB_ASSIGN_OR_RETURN(xfer::RequestId made, agent.make_request(op, requests.local, {}, requests.remote, {}));
    requests.reused = made;
    requests.made_us = making.seconds() * 1e6;
  }
  const xfer::RequestId request = *requests.reused;
  const double prepared = make ? elapsed() : 0.0;
  EPLB_TRY(agent.post(request));
  const double post_done = elapsed();
  xfer::RequestStatus status = agent.status(request);
  // The deadline is set when the first status says InProgress: a READ
  // that UCX completed inside post() then costs no clock read for it.
  std::optional<Deadline> deadline;
  if (status.state == RequestState::InProgress) deadline = Deadline::after_seconds(options.timeout_seconds);
  for (unsigned spins = 0; status.state == RequestState::InProgress; ++spins) {
    if ((spins & 255) == 255 && deadline->expired()) {
      (void)agent.release(request);
      return error(Code::Timeout, fmt::format("{} did not complete in {}", label(options, op, block),
                                              format_seconds(options.timeout_seconds)));
    }
    // Yield between polls: on a shared machine the target (which may
    // have to serve the request) gets the core sooner.
    if (options.yield) sched_yield();
    status = agent.status(request);
  }
  const double finished = elapsed();
  if (status.state == RequestState::Failed) {
    (void)agent.release(request);
    return status.failure;
  }
  if (!options.reuse_request) {
    EPLB_TRY(agent.release(request));
    requests.reused.reset();
  }
  if (!sample) return Status::ok();
  if (make) samples.prepare.push_back(prepared * 1e6);
  samples.post.push_back((post_done - prepared) * 1e6);
  samples.completion.push_back((finished - post_done) * 1e6);
  samples.whole.push_back(finished * 1e6);
  return Status::ok();
}

// --check: READ the block once more (the memcpy reference overwrote it) and
// compare with the pattern, or ask the target to hash what was written.
Status check_bytes(const BenchOptions& options, Agent& agent, Target& target, Operation op, uint64_t block,
                   const Requests& requests, uint8_t* local, Row& row) {
  const uint64_t bytes_per_request = block * static_cast<uint64_t>(options.batch);
  bool ok = true;
  if (op == Operation::Read) {
    EPLB_ASSIGN_OR_RETURN(xfer::RequestId request, agent.make_request(op, requests.local, {}, requests.remote, {}));
    EPLB_TRY(agent.post(request));
    EPLB_TRY(agent.wait({&request, 1}, Deadline::after_seconds(options.timeout_seconds)));
    EPLB_TRY(agent.release(request));
    for (uint64_t i = 0; i < bytes_per_request && ok; ++i) ok = local[i] == pattern_byte(i);
  } else {
    // The last timed request wrote this same pattern.
    fill_pattern(local, bytes_per_request, block);
    bytes::Writer range;
    range.u64(0);
    range.u64(bytes_per_request);
    char type = 0;
    std::vector<uint8_t> reply;
    if (!send_message(target.fd, 'H', range.take_vector()) || !receive_message(target.fd, &type, &reply) ||
        type != 'h' || reply.size() != 8)
      return error(Code::IoError, "xfer-bench: target did not answer the check");
    ok = bytes::load<uint64_t>(reply.data()) == bytes::checksum(std::span<const uint8_t>(local, bytes_per_request));
  }
  row.check = ok ? "ok" : "MISMATCH";
  if (ok) return Status::ok();
  return error(Code::Mismatch, label(options, op, block) + ": bytes differ after the transfer");
}

void summarize(const Samples& samples, double seconds, uint64_t bytes_per_request, Row& row) {
  row.gigabytes_per_second = static_cast<double>(bytes_per_request) * row.iterations / seconds / 1e9;
  row.average_latency_us = seconds / row.iterations * 1e6;
  row.median_latency_us = percentile50(samples.whole);
  row.prepare_us = average(samples.prepare);
  row.prepare_p99_us = percentile99(samples.prepare);
  row.post_us = average(samples.post);
  row.post_p99_us = percentile99(samples.post);
  row.completion_us = average(samples.completion);
  row.completion_p99_us = percentile99(samples.completion);
}

}  // namespace

std::string size_label(uint64_t bytes) {
  if (bytes % (1ull << 30) == 0) return fmt::format("{}G", bytes >> 30);
  if (bytes % (1ull << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes % (1ull << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

Result<Row> run_row(const BenchOptions& options, Agent& agent, Target& target, Operation op, uint64_t block,
                    uint8_t* local) {
  Row row;
  row.block = block;
  row.batch = options.batch;
  const uint64_t bytes_per_request = block * static_cast<uint64_t>(options.batch);
  row.iterations = options.iterations > 0
                       ? options.iterations
                       : static_cast<int>(std::clamp<uint64_t>((1ull << 30) / bytes_per_request, 20, 2000));
  std::vector<xfer::Descriptor> locals, remotes;
  for (int i = 0; i < options.batch; ++i) {
    locals.push_back({reinterpret_cast<uint64_t>(local) + i * block, block, 0});
    remotes.push_back({target.address + i * block, block, 0});
  }
  Requests requests;
  EPLB_ASSIGN_OR_RETURN(requests.local, agent.prepare_local(locals));
  EPLB_ASSIGN_OR_RETURN(requests.remote, agent.prepare_remote(target.name, remotes));
  if (options.check && op == Operation::Read) std::memset(local, 0, bytes_per_request);
  if (options.check && op == Operation::Write) fill_pattern(local, bytes_per_request, block);
  Samples samples;
  samples.reserve(static_cast<size_t>(options.warmup + row.iterations));
  Stopwatch timed_loop;
  for (int iteration = 0; iteration < options.warmup + row.iterations; ++iteration) {
    if (iteration == options.warmup) {
      timed_loop.reset();
      samples.clear();
    }
    const bool sample = (iteration - options.warmup) % kLatencyStride == 0;
    EPLB_TRY(timed_request(options, agent, op, block, requests, samples, sample));
  }
  const double seconds = timed_loop.seconds();
  if (options.reuse_request) {
    EPLB_TRY(agent.release(*requests.reused));
    samples.prepare.assign(1, requests.made_us);  // the one make_request of this block size
  }
  summarize(samples, seconds, bytes_per_request, row);
  row.memcpy_gigabytes_per_second = memcpy_reference(local, bytes_per_request, row.iterations);
  if (options.check) EPLB_TRY(check_bytes(options, agent, target, op, block, requests, local, row));
  EPLB_TRY(agent.release_descriptor_list(requests.local));
  EPLB_TRY(agent.release_descriptor_list(requests.remote));
  return row;
}

}  // namespace eplb::cli::xfer_bench
