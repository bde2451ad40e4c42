// memcpy_bench: single-thread memcpy bandwidth, DRAM to DRAM, the peer that
// bench/migrate_bandwidth.sh and bench/python_migrate.py compare migration
// against. Copies `--bytes` (default 1 GiB) in rows of `--row` bytes
// (default 8 MiB, one expert) from one buffer to another distinct one, each
// `--bytes` large but at least 4x the last-level cache and at most 2 GiB
// (then cycled), page-faulted before timing: every row is a fresh address
// on both sides, as in a migration round, so the copy runs DRAM to DRAM.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

uint64_t total_bytes = uint64_t(1) << 30;
uint64_t row_bytes = uint64_t(8) << 20;
constexpr uint64_t kMaxBuffer = uint64_t(2) << 30;

uint64_t last_level_cache_bytes() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return uint64_t(std::max({l3, l2, 32L << 20}));
}

// An anonymous mapping written once (faulted in), unmapped on scope exit.
struct Buffer {
  explicit Buffer(uint64_t size, int fill) : bytes(size) {
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = mapped == MAP_FAILED ? nullptr : static_cast<char*>(mapped);
    if (data) std::memset(data, fill, bytes);
  }
  ~Buffer() {
    if (data) munmap(data, bytes);
  }
  uint64_t bytes;
  char* data;
};

void BM_memcpy(benchmark::State& state) {
  uint64_t buffer_bytes = std::min(std::max(total_bytes, 4 * last_level_cache_bytes()), kMaxBuffer);
  buffer_bytes = std::max(buffer_bytes / row_bytes, uint64_t(1)) * row_bytes;
  Buffer source(buffer_bytes, 1), destination(buffer_bytes, 2);
  if (!source.data || !destination.data) {
    state.SkipWithError("cannot map two buffers of --bytes each");
    return;
  }
  for (auto _ : state) {
    uint64_t copied = 0, offset = 0;
    while (copied < total_bytes) {
      uint64_t length = std::min(row_bytes, total_bytes - copied);
      std::memcpy(destination.data + offset, source.data + offset, length);
      benchmark::DoNotOptimize(destination.data);
      copied += length;
      offset = (offset + row_bytes) % buffer_bytes;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(total_bytes));
  state.counters["buffer_bytes"] = double(buffer_bytes);
  state.counters["llc_bytes"] = double(last_level_cache_bytes());
}

}  // namespace

int main(int argc, char** argv) {
  char* rest[256];
  int rest_count = 0;
  for (int i = 0; i < argc && rest_count < 256; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--bytes=", 0) == 0)
      total_bytes = std::strtoull(arg.c_str() + 8, nullptr, 10);
    else if (arg.rfind("--row=", 0) == 0)
      row_bytes = std::strtoull(arg.c_str() + 6, nullptr, 10);
    else
      rest[rest_count++] = argv[i];
  }
  if (total_bytes == 0 || row_bytes == 0) return 2;
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::Initialize(&rest_count, rest);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
