// memcpy_bench: single-thread memcpy bandwidth, the peer that
// bench/migrate_bandwidth.sh compares `eplb run` against. Copies `--bytes`
// (default 1 GiB) in rows of `--row` bytes (default 8 MiB, one expert)
// between two page-faulted buffers of at most 1 GiB that are cycled through,
// so the working set exceeds the caches as the migration's does.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

uint64_t total_bytes = uint64_t(1) << 30;
uint64_t row_bytes = uint64_t(8) << 20;

void BM_memcpy(benchmark::State& state) {
  uint64_t buffer_bytes = std::min<uint64_t>(total_bytes, uint64_t(1) << 30);
  buffer_bytes = std::max(buffer_bytes / row_bytes, uint64_t(1)) * row_bytes;
  std::vector<char> source(buffer_bytes, 1), destination(buffer_bytes, 2);
  for (auto _ : state) {
    uint64_t copied = 0, offset = 0;
    while (copied < total_bytes) {
      uint64_t length = std::min(row_bytes, total_bytes - copied);
      std::memcpy(destination.data() + offset, source.data() + offset, length);
      benchmark::DoNotOptimize(destination.data());
      copied += length;
      offset = (offset + row_bytes) % buffer_bytes;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(total_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--bytes=", 0) == 0)
      total_bytes = std::strtoull(arg.c_str() + 8, nullptr, 10);
    else if (arg.rfind("--row=", 0) == 0)
      row_bytes = std::strtoull(arg.c_str() + 6, nullptr, 10);
    else
      rest.push_back(argv[i]);
  }
  if (total_bytes == 0 || row_bytes == 0) return 2;
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
  int rest_count = int(rest.size());
  benchmark::Initialize(&rest_count, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
