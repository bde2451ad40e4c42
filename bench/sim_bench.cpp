// Throughput of the synthetic data sources and the load-file parsers:
// fill_expert_bytes (GB/s), generate_load_trace, and parsing a DeepSeek-V3
// shaped [58][256] load and a 100-step trace in each format.
#include <benchmark/benchmark.h>

#include <vector>

#include "eplb/placement_io.h"
#include "eplb/sim.h"

namespace {

void BM_FillExpertBytes(benchmark::State& state) {
  std::vector<uint8_t> buffer(size_t(state.range(0)) + 8);
  uint64_t offset = uint64_t(state.range(1));
  for (auto _ : state) {
    eplb::fill_expert_bytes(3, 17, 1, offset, std::span<uint8_t>(buffer.data() + offset % 8, size_t(state.range(0))));
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_FillExpertBytes)->Args({64 << 20, 0})->Args({64 << 20, 3})->Args({4096, 5});

void BM_GenerateLoadTrace(benchmark::State& state) {
  eplb::LoadGenOptions options;  // DeepSeek-V3 shape: 58 layers x 256 experts
  options.num_steps = int(state.range(0));
  for (auto _ : state) {
    auto trace = eplb::generate_load_trace(options);
    benchmark::DoNotOptimize(trace.value().values.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * options.num_steps * 58 * 256);
}
BENCHMARK(BM_GenerateLoadTrace)->Arg(1)->Arg(100)->Unit(benchmark::kMillisecond);

eplb::LoadTrace sample_trace(int steps) {
  eplb::LoadGenOptions options;
  options.num_steps = steps;
  return eplb::generate_load_trace(options).value();
}

void BM_ParseNpy(benchmark::State& state) {
  eplb::LoadTrace trace = sample_trace(int(state.range(0)));
  std::vector<uint8_t> bytes = eplb::encode_npy_float64(
      {size_t(trace.num_steps), size_t(trace.num_layers), size_t(trace.num_experts)}, trace.values);
  for (auto _ : state) benchmark::DoNotOptimize(eplb::parse_npy(bytes, "bench.npy").value().values.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes.size()));
}
BENCHMARK(BM_ParseNpy)->Arg(1)->Arg(100)->Unit(benchmark::kMicrosecond);

std::string json_text(const eplb::LoadTrace& trace) {
  std::string text = "[";
  for (int l = 0; l < trace.num_layers; ++l) {
    text += l ? ",[" : "[";
    for (int e = 0; e < trace.num_experts; ++e) {
      if (e) text += ",";
      text += std::to_string(int64_t(trace.at(0, l, e)));
    }
    text += "]";
  }
  return text + "]";
}

void BM_ParseJson(benchmark::State& state) {
  std::string text = json_text(sample_trace(1));
  for (auto _ : state) benchmark::DoNotOptimize(eplb::parse_load_json(text, "bench.json").value().values.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_ParseJson)->Unit(benchmark::kMicrosecond);

void BM_ParseCsv(benchmark::State& state) {
  std::string text = json_text(sample_trace(1));
  std::string csv;
  for (char c : text) {
    if (c == '[') continue;
    if (c == ']') { if (!csv.empty() && csv.back() != '\n') csv += '\n'; continue; }
    if (c == ',' && !csv.empty() && csv.back() == '\n') continue;
    csv += c;
  }
  for (auto _ : state) benchmark::DoNotOptimize(eplb::parse_load_csv(csv, "bench.csv").value().values.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(csv.size()));
}
BENCHMARK(BM_ParseCsv)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
