// async_stall_bench: what a serving loop sees during a migration round,
// sync against async (copy commits), ranks as threads over the loopback
// backend. Sync: serving waits for the whole round (stall = round time).
// Async: serving steps in lockstep (1 ms of "forward pass" each) and the
// stall is the time spent inside commit_ready. Rounds alternate A -> B
// (sync) and B -> A (async): the same bytes move in both directions.
// Prints medians and min-max over the repetitions and the ratio.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <numeric>
#include <random>
#include <thread>

#include "eplb/bootstrap.h"
#include "eplb/migrate_async.h"

namespace {
using namespace eplb;

Placement shuffled(const Topology& topology, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> phy2log;
  for (int l = 0; l < topology.num_layers; ++l) {
    std::vector<int32_t> layer(size_t(topology.num_slots));
    for (int s = 0; s < topology.num_slots; ++s) layer[size_t(s)] = s % topology.num_experts;
    std::shuffle(layer.begin(), layer.end(), rng);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots, phy2log))
      .value();
}

struct Sample {
  double sync_seconds = 0, stall_total = 0, stall_max = 0;
  int64_t steps = 0;
};

// Rank r's async round with a lockstep serving loop; stall measured on every rank.
void serve_async(Migrator& migrator, Placement& current, const Placement& target, std::barrier<>& steps,
                 std::atomic<int>& done, int ranks, Sample& sample) {
  auto handle = std::move(migrator.start(current, target)).value();
  bool finished = false;
  for (int64_t step = 0;; ++step) {
    steps.arrive_and_wait();
    if (done.load() == ranks) break;
    steps.arrive_and_wait();
    Stopwatch stall;
    auto committed = handle->commit_ready(step);
    const double seconds = stall.seconds();
    sample.stall_total += seconds;
    sample.stall_max = std::max(sample.stall_max, seconds);
    if (!committed) fmt::print(stderr, "async round failed: {}\n", committed.status().to_string());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    sample.steps = step + 1;
    if (!finished && handle->done()) {
      finished = true;
      done.fetch_add(1);
    }
  }
}

std::vector<Sample> run(const Topology& topology, uint64_t row_bytes, int repetitions) {
  auto groups = make_thread_groups(topology.num_ranks);
  const StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), {{"w", row_bytes}});
  const Placement a = shuffled(topology, 1), b = shuffled(topology, 2);
  std::vector<Sample> rank0(static_cast<size_t>(repetitions));
  std::barrier sync_point(topology.num_ranks), steps(topology.num_ranks);
  std::vector<std::atomic<int>> done(static_cast<size_t>(repetitions));  // ranks whose async round of repetition i ended
  std::vector<std::thread> threads;
  for (int r = 0; r < topology.num_ranks; ++r)
    threads.emplace_back([&, r] {
      xfer::AgentConfig config;
      config.name = fmt::format("async-stall-{}", r);
      config.backend = "loopback";
      auto agent = std::move(xfer::Agent::create(config)).value();
      auto store = std::move(ExpertStore::create_arena(layout, r * topology.slots_per_rank())).value();
      auto migrator = std::move(Migrator::create(*groups[size_t(r)], *agent, *store, topology, {},
                                                 Deadline::after_seconds(30))).value();
      Placement current = a;
      for (int i = 0; i < repetitions; ++i) {
        Sample sample;
        sync_point.arrive_and_wait();
        RoundReport report = migrator->migrate(current, b);
        sample.sync_seconds = report.seconds;
        sync_point.arrive_and_wait();
        serve_async(*migrator, current, a, steps, done[size_t(i)], topology.num_ranks, sample);
        sync_point.arrive_and_wait();
        if (r == 0) rank0[size_t(i)] = sample;
      }
    });
  for (auto& thread : threads) thread.join();
  return rank0;
}

std::string median_spread(std::vector<double> values, double scale) {
  std::sort(values.begin(), values.end());
  return fmt::format("{:.2f} ({:.2f}-{:.2f})", values[values.size() / 2] * scale, values.front() * scale,
                     values.back() * scale);
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const Topology topology{8, 64, 80, 8, 2, 4};
  const uint64_t row_bytes = 256 << 10;
  auto samples = run(topology, row_bytes, repetitions);
  std::vector<double> sync, stall, stall_max, ratio;
  for (const auto& s : samples) {
    sync.push_back(s.sync_seconds);
    stall.push_back(s.stall_total);
    stall_max.push_back(s.stall_max);
    ratio.push_back(s.stall_total / s.sync_seconds);
  }
  fmt::print("async_stall_bench: {} ({} KiB rows), {} repetitions, rank 0, loopback threads\n",
             topology.to_string(), row_bytes >> 10, repetitions);
  fmt::print("{:<34} {}\n", "sync round (serving blocked), ms", median_spread(sync, 1e3));
  fmt::print("{:<34} {}\n", "async copy: stall total, ms", median_spread(stall, 1e3));
  fmt::print("{:<34} {}\n", "async copy: stall max per call, ms", median_spread(stall_max, 1e3));
  fmt::print("{:<34} {}\n", "async stall / sync round", median_spread(ratio, 1.0));
  return 0;
}
