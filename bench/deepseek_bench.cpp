// deepseek_bench - a full `deepseek` rebalance (all layers) for the serving
// shapes of issue 2, on 1 and 2 threads, with the heap memory one call
// allocates (counted by replacing the global operator new).
//
// Cases (58 layers, 256 experts, 288 slots, 8 groups):
//   v3_hierarchical  4 nodes, 32 ranks  (8 % 4 == 0: hierarchical)
//   v3_one_node      1 node,  32 ranks  (8 % 1 == 0: hierarchical with one node)
//   v3_36_ranks      3 nodes, 36 ranks  (8 % 3 != 0: global variant)
//
// Extra mode for bench/deepseek.sh:
//   deepseek_bench --dump DIR   writes DIR/load.json and DIR/<case>.json
//                               (phy2log, log2phy, logcnt) and exits.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>

#include "eplb/policy.h"
#include "eplb/sim.h"

// ---- allocation counting ---------------------------------------------------
namespace {
std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_allocated_bytes{0};
}  // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  g_allocated_bytes.fetch_add(size, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace eplb {
namespace {

struct BenchCase {
  const char* name;
  Topology topology;
};

const BenchCase kCases[] = {
    {"v3_hierarchical", {58, 256, 288, 8, 4, 32}},
    {"v3_one_node", {58, 256, 288, 8, 1, 32}},
    {"v3_36_ranks", {58, 256, 288, 8, 3, 36}},
};

// The DeepSeek-V3-shaped load `eplb rebalance` generates by default.
const LoadMatrix& deepseek_v3_load() {
  static const LoadMatrix load = [] {
    LoadGenOptions options;  // 58 layers, 256 experts, zipf, seed 0
    auto trace = generate_load_trace(options);
    if (!trace.is_ok()) {
      std::fprintf(stderr, "deepseek_bench: %s\n", trace.status().to_string().c_str());
      std::exit(1);
    }
    return trace->sum(0, trace->num_steps);
  }();
  return load;
}

void BM_DeepSeek(benchmark::State& state) {
  const BenchCase& bench_case = kCases[state.range(0)];
  const int threads = int(state.range(1));
  const LoadMatrix& load = deepseek_v3_load();
  uint64_t allocations = 0, bytes = 0;
  for (auto _ : state) {
    uint64_t allocations_before = g_allocations.load(), bytes_before = g_allocated_bytes.load();
    auto placement = deepseek_placement(load, bench_case.topology, threads);
    allocations = g_allocations.load() - allocations_before;
    bytes = g_allocated_bytes.load() - bytes_before;
    if (!placement.is_ok()) {
      state.SkipWithError(placement.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(placement->phy2log_data().data());
  }
  state.SetLabel(std::string(bench_case.name) + " " + bench_case.topology.to_string());
  state.counters["allocs_per_call"] = double(allocations);
  state.counters["alloc_bytes_per_call"] = double(bytes);
  state.counters["input_bytes"] = double(load.values.size() * sizeof(double));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_kib"] = double(usage.ru_maxrss);
}

BENCHMARK(BM_DeepSeek)
    ->ArgNames({"case", "threads"})
    ->ArgsProduct({{0, 1, 2}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

nlohmann::json rows(std::span<const int32_t> values, size_t width) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < values.size(); i += width)
    out.push_back(std::vector<int32_t>(values.begin() + i, values.begin() + i + width));
  return out;
}

int dump(const std::string& dir) {
  const LoadMatrix& load = deepseek_v3_load();
  nlohmann::json load_rows = nlohmann::json::array();
  for (int l = 0; l < load.num_layers; ++l) {
    auto row = load.layer(l);
    load_rows.push_back(std::vector<double>(row.begin(), row.end()));
  }
  std::ofstream(dir + "/load.json") << load_rows.dump();
  for (const BenchCase& bench_case : kCases) {
    auto placement = deepseek_placement(load, bench_case.topology, 1);
    if (!placement.is_ok()) {
      std::fprintf(stderr, "deepseek_bench: %s\n", placement.status().to_string().c_str());
      return 1;
    }
    const Placement& p = *placement;
    nlohmann::json log2phy = nlohmann::json::array();
    for (int l = 0; l < p.num_layers(); ++l) {
      std::span<const int32_t> layer(p.log2phy_data().data() + size_t(l) * p.num_experts() * p.max_replicas(),
                                     size_t(p.num_experts()) * p.max_replicas());
      log2phy.push_back(rows(layer, size_t(p.max_replicas())));
    }
    nlohmann::json out = {{"phy2log", rows(p.phy2log_data(), size_t(p.num_slots()))},
                          {"log2phy", log2phy},
                          {"logcnt", rows(p.logcnt_data(), size_t(p.num_experts()))}};
    std::ofstream(dir + "/" + bench_case.name + ".json") << out.dump();
  }
  return 0;
}

}  // namespace
}  // namespace eplb

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--dump") == 0) return eplb::dump(argv[2]);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
