// deepseek_bench - a full `deepseek` rebalance (all layers) of the four
// serving shapes of issue 16, on 1 and 2 threads (Google Benchmark), with
// the heap memory one call allocates (counted by replacing operator new).
//
// Cases (58 layers, 256 experts, 8 groups; loads round(rand^4 * 1000) + 1):
//   v3_4_nodes    288 slots, 4 nodes, 32 ranks  (hierarchical)
//   v3_1_node     288 slots, 1 node,  32 ranks  (hierarchical with one node)
//   v3_36_ranks   288 slots, 3 nodes, 36 ranks  (global: 8 % 3 != 0)
//   v3_64_ranks   320 slots, 8 nodes, 64 ranks  (hierarchical, one group per node)
//
// Other modes (bench/deepseek.sh uses the first two):
//   deepseek_bench --dump DIR        writes DIR/load.json and DIR/<case>.json
//                                    (phy2log, log2phy, logcnt) and exits
//   deepseek_bench --scale [REPS]    the scale table (bench/deepseek_scale.h)
//   deepseek_bench --profile CASE N  N calls of case CASE (0-3) on one
//                                    thread, for callgrind / perf
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "deepseek_scale.h"
#include "eplb/policy.h"

namespace eplb::bench {
namespace {

struct BenchCase {
  const char* name;
  Topology topology;
};

const BenchCase kCases[] = {
    {"v3_4_nodes", {58, 256, 288, 8, 4, 32}},
    {"v3_1_node", {58, 256, 288, 8, 1, 32}},
    {"v3_36_ranks", {58, 256, 288, 8, 3, 36}},
    {"v3_64_ranks", {58, 256, 320, 8, 8, 64}},
};

const LoadMatrix& bench_load() {
  static const LoadMatrix load = issue_load(58, 256, 16);
  return load;
}

void BM_DeepSeek(benchmark::State& state) {
  const BenchCase& bench_case = kCases[state.range(0)];
  const int threads = int(state.range(1));
  const LoadMatrix& load = bench_load();
  HeapUse heap;
  for (auto _ : state) {
    HeapMeter meter;
    auto placement = deepseek_placement(load, bench_case.topology, threads);
    heap = meter.read();
    if (!placement.is_ok()) {
      state.SkipWithError(placement.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(placement->phy2log_data().data());
  }
  state.SetLabel(std::string(bench_case.name) + " " + bench_case.topology.to_string());
  state.counters["allocs_per_call"] = double(heap.allocations);
  state.counters["alloc_bytes_per_call"] = double(heap.bytes);
  state.counters["peak_extra_bytes"] = double(heap.peak_extra);
  state.counters["input_bytes"] = double(load.values.size() * sizeof(double));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_kib"] = double(usage.ru_maxrss);
}

double min_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

BENCHMARK(BM_DeepSeek)
    ->ArgNames({"case", "threads"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of)
    ->ComputeStatistics("max", max_of);

nlohmann::json rows(std::span<const int32_t> values, size_t width) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < values.size(); i += width)
    out.push_back(std::vector<int32_t>(values.begin() + i, values.begin() + i + width));
  return out;
}

nlohmann::json placement_json(const Placement& p) {
  nlohmann::json log2phy = nlohmann::json::array();
  const size_t layer_width = size_t(p.num_experts()) * p.max_replicas();
  for (int l = 0; l < p.num_layers(); ++l)
    log2phy.push_back(rows({p.log2phy_data().data() + l * layer_width, layer_width}, size_t(p.max_replicas())));
  return {{"phy2log", rows(p.phy2log_data(), size_t(p.num_slots()))},
          {"log2phy", log2phy},
          {"logcnt", rows(p.logcnt_data(), size_t(p.num_experts()))}};
}

int dump(const std::string& dir) {
  const LoadMatrix& load = bench_load();
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
    std::ofstream(dir + "/" + bench_case.name + ".json") << placement_json(*placement).dump();
  }
  return 0;
}

int profile(int which, int calls) {
  if (which < 0 || which > 3 || calls < 1) {
    std::fprintf(stderr, "deepseek_bench: --profile CASE(0-3) CALLS(>= 1)\n");
    return 2;
  }
  size_t checksum = 0;
  timespec cpu_start{}, cpu_end{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_start);
  Stopwatch watch;
  for (int i = 0; i < calls; ++i)
    checksum += size_t(deepseek_placement(bench_load(), kCases[which].topology, 1).value().max_replicas());
  const double wall = watch.seconds();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_end);
  const double cpu = double(cpu_end.tv_sec - cpu_start.tv_sec) + 1e-9 * double(cpu_end.tv_nsec - cpu_start.tv_nsec);
  std::printf("%d calls of %s: %.1f us per call, %.1f us CPU (checksum %zu)\n", calls, kCases[which].name,
              wall * 1e6 / calls, cpu * 1e6 / calls, checksum);
  return 0;
}

}  // namespace
}  // namespace eplb::bench

int main(int argc, char** argv) {
  using namespace eplb::bench;
  keep_freed_memory();
  if (argc == 3 && std::strcmp(argv[1], "--dump") == 0) return dump(argv[2]);
  if (argc == 4 && std::strcmp(argv[1], "--profile") == 0) return profile(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc >= 2 && std::strcmp(argv[1], "--scale") == 0) return scale_table(argc > 2 ? std::atoi(argv[2]) : 5);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
