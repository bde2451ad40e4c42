// Planner speed on a DeepSeek-V3-shaped change (58 layers, 256 experts, 288
// slots, 32 ranks, 4 nodes). Target (issue 4): plan_migration < 1 ms.
//   BM_PlanMigration/random    old = default placement, new = a seeded random valid placement
//   BM_PlanMigration/similar   old = default placement, new = ~10% of slots changed
//   BM_PlanMigrationBuildOnly  the same, freeing the returned plan outside the timing
//   BM_SlotsChanged/...        the reference in the same run: placement::slots_changed,
//                              the bare diff of the two mappings (a floor, not a planner)
// plan_bench --profile N: N plans of the random change (for callgrind / perf).
// The timed region includes building and destroying the returned plan.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "eplb/placement.h"
#include "eplb/plan.h"
#include "keep_freed_memory.h"

namespace {

using eplb::Placement;
using eplb::Topology;

const Topology kDeepSeek{58, 256, 288, 8, 4, 32};

// Every expert once plus R - E random extra replicas, shuffled.
Placement random_placement(const Topology& topology, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> phy2log;
  for (int l = 0; l < topology.num_layers; ++l) {
    std::vector<int32_t> layer(size_t(topology.num_slots));
    for (int s = 0; s < topology.num_slots; ++s)
      layer[size_t(s)] = s < topology.num_experts
                             ? s
                             : int32_t(std::uniform_int_distribution<int>(0, topology.num_experts - 1)(rng));
    for (size_t i = layer.size(); i > 1; --i)
      std::swap(layer[i - 1], layer[std::uniform_int_distribution<size_t>(0, i - 1)(rng)]);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots,
                                           std::move(phy2log)))
      .value();
}

// ~`fraction` of every layer's slots changed by swapping random slot pairs
// holding different experts (stays valid: replica counts are unchanged).
Placement similar_placement(const Placement& base, double fraction, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> phy2log = base.phy2log_data();
  const int slots = base.num_slots();
  std::uniform_int_distribution<int> pick(0, slots - 1);
  for (int l = 0; l < base.num_layers(); ++l) {
    int32_t* layer = phy2log.data() + size_t(l) * size_t(slots);
    int changed = 0;
    while (changed < int(fraction * slots)) {
      int a = pick(rng), b = pick(rng);
      if (layer[a] == layer[b]) continue;
      std::swap(layer[a], layer[b]);
      changed += 2;
    }
  }
  return std::move(Placement::from_phy2log(base.num_layers(), base.num_experts(), slots, std::move(phy2log))).value();
}

// The fastest repetition: on a shared machine the least disturbed estimate.
double min_of(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::min_element(values.begin(), values.end());
}

const Placement& old_placement() {
  static const Placement placement = eplb::default_placement(kDeepSeek);
  return placement;
}
const Placement& new_placement(int kind) {
  static const Placement random = random_placement(kDeepSeek, 20260101);
  static const Placement similar = similar_placement(old_placement(), 0.10, 20260102);
  return kind == 0 ? random : similar;
}

void BM_PlanMigration(benchmark::State& state) {
  const Placement& before = old_placement();
  const Placement& after = new_placement(int(state.range(0)));
  eplb::PlanStats stats;
  for (auto _ : state) {
    auto plan = eplb::plan_migration(before, after, kDeepSeek);
    if (!plan.is_ok()) {
      state.SkipWithError(plan.status().to_string().c_str());
      return;
    }
    stats = plan->stats;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["slots_kept"] = double(stats.slots_kept);
  state.counters["local_copy"] = double(stats.slots_local_copy);
  state.counters["read_intra"] = double(stats.slots_read_intra_node);
  state.counters["read_inter"] = double(stats.slots_read_inter_node);
  state.counters["requests"] = double(stats.requests);
  state.counters["descriptors"] = double(stats.descriptors);
  state.SetLabel(int(state.range(0)) == 0 ? "random" : "similar");
}
BENCHMARK(BM_PlanMigration)
    ->ArgName("random0_similar1")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->ComputeStatistics("min", min_of);

// The same call with the destruction of the returned plan outside the timed
// region: what planning costs before the caller frees the plan.
void BM_PlanMigrationBuildOnly(benchmark::State& state) {
  const Placement& before = old_placement();
  const Placement& after = new_placement(int(state.range(0)));
  std::optional<eplb::Result<eplb::MigrationPlan>> plan;
  for (auto _ : state) {
    plan.emplace(eplb::plan_migration(before, after, kDeepSeek));
    benchmark::DoNotOptimize(*plan);
    state.PauseTiming();
    plan.reset();
    state.ResumeTiming();
  }
  state.SetLabel(int(state.range(0)) == 0 ? "random" : "similar");
}
BENCHMARK(BM_PlanMigrationBuildOnly)
    ->ArgName("random0_similar1")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->ComputeStatistics("min", min_of);

void BM_PlanLayer(benchmark::State& state) {
  const Placement& before = old_placement();
  const Placement& after = new_placement(int(state.range(0)));
  for (auto _ : state) {
    auto plan = eplb::plan_layer(before.layer_phy2log(0), after.layer_phy2log(0), kDeepSeek, 0);
    benchmark::DoNotOptimize(plan);
  }
  state.SetLabel(int(state.range(0)) == 0 ? "random" : "similar");
}
BENCHMARK(BM_PlanLayer)
    ->ArgName("random0_similar1")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->ComputeStatistics("min", min_of);

void BM_SlotsChanged(benchmark::State& state) {
  const Placement& before = old_placement();
  const Placement& after = new_placement(int(state.range(0)));
  for (auto _ : state) {
    auto changed = eplb::slots_changed(before, after);
    benchmark::DoNotOptimize(changed);
  }
  state.SetLabel(int(state.range(0)) == 0 ? "random" : "similar");
}
BENCHMARK(BM_SlotsChanged)
    ->ArgName("random0_similar1")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->ComputeStatistics("min", min_of);

// N plans of the random change, for callgrind / perf.
int profile(int calls) {
  int64_t requests = 0;
  for (int i = 0; i < calls; ++i)
    requests += eplb::plan_migration(old_placement(), new_placement(0), kDeepSeek).value().stats.requests;
  std::printf("%d plans (%lld requests)\n", calls, static_cast<long long>(requests));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  eplb::bench::keep_freed_memory();
  if (argc == 3 && std::string(argv[1]) == "--profile") return profile(std::atoi(argv[2]));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
