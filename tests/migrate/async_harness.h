// async_harness.h - async rounds (Migrator::start) over loopback with
// threads as ranks, for the async tests (copy and swap commits): a serving
// loop per rank steps in lockstep (a std::barrier stands in for
// all-to-all), calls commit_ready before every step and checks, at every
// step, that every slot holds the expert the mapping in force says. Several
// targets run as consecutive rounds, the step count running on.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <map>
#include <random>
#include <thread>

#include "eplb/bootstrap.h"
#include "eplb/migrate_async.h"
#include "expert_content.h"

namespace eplb::testing {

inline std::atomic<int> async_agent_counter{0};

inline Placement shuffled_placement(const Topology& topology, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> phy2log;
  for (int l = 0; l < topology.num_layers; ++l) {
    std::vector<int32_t> layer;
    for (int e = 0; e < topology.num_experts; ++e) layer.push_back(e);
    while (int(layer.size()) < topology.num_slots) layer.push_back(int32_t(rng() % topology.num_experts));
    std::shuffle(layer.begin(), layer.end(), rng);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots, phy2log))
      .value();
}

// Ok, or the first remembered checksum that does not match its live row.
inline Status remembered_sums_match(const ExpertStore& store) {
  for (int l = 0; l < store.layout().num_layers(); ++l)
    for (int s = 0; s < store.slots_per_rank(); ++s)
      for (int t = 0; t < int(store.layout().layers[l].size()); ++t) {
        auto cached = store.cached_checksum(l, s, t);
        if (cached && *cached != store.checksum(l, s, t))
          return error(Code::Mismatch, "layer " + std::to_string(l) + " local slot " + std::to_string(s) +
                                           " tensor " + std::to_string(t) + ": remembered checksum is stale");
      }
  return Status::ok();
}

// One rank's results; failure, report and commit_steps are the last round's.
struct AsyncRank {
  Status setup, failure, verified, checksums;
  RoundReport report;
  Placement final_placement;
  std::map<int, int64_t> commit_steps;  // layer -> serving step of its commit
  std::vector<std::vector<int>> live_buffers;  // [round][layer] store.live_buffer after the round
  int inconsistent_steps = 0;
  int rounds_run = 0;
  int retries = 0;  // over all rounds
  int64_t steps = 0;
};

struct Scenario {
  Topology topology;
  uint64_t row_bytes = 4096;
  std::string fault_spec;
  MigrateOptions options;      // options.commit == Swap: the store gets spare buffers
  int64_t abort_at_step = -1;  // rank 0 calls abort() at this step
  int64_t first_step = 0;      // the serving steps' first number (they run on across rounds)
  int first_call_delay_ms = 0;  // every rank sleeps this long after start() before its first commit_ready
};

// One rank's serving loop while one round runs; `step` runs on.
inline void serve(AsyncMigration& handle, ExpertStore& store, Placement& current, std::barrier<>& steps,
                  std::atomic<int>& ranks_done, int ranks, const Scenario& scenario, int rank, int64_t& step,
                  AsyncRank& out) {
  bool finished = false;
  // The step cap (same on every rank: steps run in lockstep) bounds a hung
  // round at >= 60 s; a loaded machine may need far more than 20000 steps.
  for (const int64_t end = step + 300000; step < end; ++step) {
    steps.arrive_and_wait();
    if (ranks_done.load() == ranks) break;
    steps.arrive_and_wait();  // everybody read ranks_done before anyone adds to it
    if (rank == 0 && step == scenario.abort_at_step) handle.abort();
    auto committed = handle.commit_ready(step);
    if (!committed && out.failure.is_ok()) out.failure = committed.status();
    if (committed)
      for (int layer : *committed) out.commit_steps[layer] = step;
    if (!verify_rows(store, current)) ++out.inconsistent_steps;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the forward pass
    out.steps = step + 1;
    if (!finished && handle.done()) {
      finished = true;
      ranks_done.fetch_add(1);
    }
  }
}

// The rounds of one rank after set-up; stops after a failed round.
inline void run_rank_rounds(Migrator& migrator, ExpertStore& store, Placement& current,
                            const std::vector<Placement>& targets, std::barrier<>& steps,
                            std::vector<std::atomic<int>>& ranks_done, const Scenario& scenario, int rank,
                            AsyncRank& result) {
  int64_t step = scenario.first_step;
  for (size_t round = 0; round < targets.size(); ++round) {
    auto handle = migrator.start(current, targets[round]);
    if (!handle) {
      result.setup = handle.status();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(scenario.first_call_delay_ms));
    result.failure = Status::ok();
    result.commit_steps.clear();
    serve(**handle, store, current, steps, ranks_done[round], scenario.topology.num_ranks, scenario, rank, step,
          result);
    if (result.failure.is_ok()) result.failure = (*handle)->poll();
    result.report = (*handle)->report();
    result.rounds_run += 1;
    result.retries += result.report.retries();
    result.live_buffers.emplace_back();
    for (int l = 0; l < scenario.topology.num_layers; ++l) result.live_buffers.back().push_back(store.live_buffer(l));
    if (!result.failure.is_ok() || !result.report.status.is_ok()) return;
  }
}

// Runs `targets` as consecutive async rounds on topology.num_ranks threads.
inline std::vector<AsyncRank> run_async(const Scenario& scenario, const std::vector<Placement>& targets) {
  const Topology& topology = scenario.topology;
  auto groups = make_thread_groups(topology.num_ranks);
  std::vector<AsyncRank> results(size_t(topology.num_ranks));
  const std::string prefix = "async-test-" + std::to_string(async_agent_counter++) + "-";
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), {{"w", scenario.row_bytes}});
  const bool spare = scenario.options.commit == CommitMode::Swap;
  std::barrier steps(topology.num_ranks);
  std::vector<std::atomic<int>> ranks_done(targets.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < topology.num_ranks; ++r)
    threads.emplace_back([&, r] {
      AsyncRank& result = results[size_t(r)];
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      config.fault_spec = scenario.fault_spec;
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * topology.slots_per_rank(), nullptr, spare);
      Placement current = default_placement(topology);
      if (agent && store) fill_rows(**store, current);
      auto migrator = agent && store ? Migrator::create(*groups[size_t(r)], **agent, **store, topology,
                                                        scenario.options, Deadline::after_seconds(20))
                                     : Result<std::unique_ptr<Migrator>>(error(Code::Internal, "set-up"));
      result.setup = migrator.status();
      if (migrator) run_rank_rounds(**migrator, **store, current, targets, steps, ranks_done, scenario, r, result);
      if (migrator && result.setup) {
        result.final_placement = current;
        result.verified = verify_rows(**store, current);
        result.checksums = remembered_sums_match(**store);
      }
      steps.arrive_and_drop();
    });
  for (auto& thread : threads) thread.join();
  return results;
}

inline std::vector<AsyncRank> run_async(const Scenario& scenario, const Placement& target) {
  return run_async(scenario, std::vector<Placement>{target});
}

inline void expect_consistent(const std::vector<AsyncRank>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].setup) << "rank " << r << ": " << results[r].setup.to_string();
    EXPECT_TRUE(results[r].verified) << "rank " << r << ": " << results[r].verified.to_string();
    EXPECT_TRUE(results[r].checksums) << "rank " << r << ": " << results[r].checksums.to_string();
    EXPECT_EQ(results[r].inconsistent_steps, 0) << "rank " << r;
    EXPECT_EQ(results[r].rounds_run, results[0].rounds_run) << "rank " << r;
    EXPECT_TRUE(results[r].final_placement == results[0].final_placement) << "rank " << r;
    EXPECT_EQ(results[r].commit_steps, results[0].commit_steps) << "rank " << r << " committed at other steps";
  }
}

}  // namespace eplb::testing
