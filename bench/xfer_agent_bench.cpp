// Agent-side overhead of a request with prepared descriptor lists, over the
// loopback backend (the backend work is a memmove of the bytes):
//   make_request + post + wait + release, for N descriptors of 64 B.
// The memmove of 64 B x N is the "peer" cost measured in the same run
// (BM_MemmoveOnly) so the table shows what the Agent adds.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "eplb/xfer.h"

namespace {

using namespace eplb::xfer;

struct Pair {
  std::vector<uint8_t> local_buffer = std::vector<uint8_t>(1 << 20), remote_buffer = std::vector<uint8_t>(1 << 20);
  std::unique_ptr<Agent> initiator, target;
  DescriptorListId local = 0, remote = 0;

  explicit Pair(int descriptors) {
    initiator = std::move(Agent::create({.name = "initiator", .backend = "loopback"})).value();
    target = std::move(Agent::create({.name = "target", .backend = "loopback"})).value();
    (void)initiator->register_memory({local_buffer.data(), local_buffer.size()});
    (void)target->register_memory({remote_buffer.data(), remote_buffer.size()});
    (void)initiator->load_metadata(*target->export_metadata());
    std::vector<Descriptor> l, r;
    for (int i = 0; i < descriptors; ++i) {
      l.push_back({reinterpret_cast<uintptr_t>(local_buffer.data()) + i * 128, 64, 0});
      r.push_back({reinterpret_cast<uintptr_t>(remote_buffer.data()) + i * 128, 64, 0});
    }
    local = *initiator->prepare_local(l);
    remote = *initiator->prepare_remote("target", r);
  }
};

void BM_MakePostWaitRelease(benchmark::State& state) {
  Pair pair(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto request = pair.initiator->make_request(Operation::Read, pair.local, {}, pair.remote, {});
    RequestId id = *request;
    (void)pair.initiator->post(id);
    (void)pair.initiator->wait({&id, 1}, eplb::Deadline::after_seconds(1));
    (void)pair.initiator->release(id);
  }
}
BENCHMARK(BM_MakePostWaitRelease)->Arg(1)->Arg(16)->Arg(128);

void BM_MakeAndPostOnly(benchmark::State& state) {
  Pair pair(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto request = pair.initiator->make_request(Operation::Read, pair.local, {}, pair.remote, {});
    RequestId id = *request;
    (void)pair.initiator->post(id);
    state.PauseTiming();
    (void)pair.initiator->wait({&id, 1}, eplb::Deadline::after_seconds(1));
    (void)pair.initiator->release(id);
    state.ResumeTiming();
  }
}
BENCHMARK(BM_MakeAndPostOnly)->Arg(16);

void BM_MemmoveOnly(benchmark::State& state) {
  Pair pair(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    for (int i = 0; i < state.range(0); ++i)
      std::memmove(pair.local_buffer.data() + i * 128, pair.remote_buffer.data() + i * 128, 64);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_MemmoveOnly)->Arg(1)->Arg(16)->Arg(128);

}  // namespace

BENCHMARK_MAIN();
