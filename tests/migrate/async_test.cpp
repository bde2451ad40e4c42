// The async round (Migrator::start) over loopback with threads as ranks: a
// serving loop per rank steps in lockstep (a std::barrier stands in for
// all-to-all), calls commit_ready before every step and checks, at every
// step, that every slot holds the expert the mapping in force says. Every
// rank must commit each layer at the same step, and a failed round must
// leave committed layers new and the rest old on every rank.
#include <atomic>
#include <barrier>
#include <gtest/gtest.h>
#include <map>
#include <random>
#include <thread>

#include "eplb/bootstrap.h"
#include "eplb/migrate_async.h"
#include "expert_content.h"

namespace eplb {
namespace {

std::atomic<int> agent_counter{0};

Placement shuffled_placement(const Topology& topology, uint64_t seed) {
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

struct AsyncRank {
  Status setup, failure, verified;
  RoundReport report;
  Placement final_placement;
  std::map<int, int64_t> commit_steps;  // layer -> serving step of its commit
  int inconsistent_steps = 0;
  int64_t steps = 0;
};

struct Scenario {
  Topology topology;
  uint64_t row_bytes = 4096;
  std::string fault_spec;
  MigrateOptions options;
  int64_t abort_at_step = -1;  // rank 0 calls abort() at this step
};

// One rank's serving loop while its round runs.
void serve(AsyncMigration& handle, ExpertStore& store, Placement& current, std::barrier<>& steps,
           std::atomic<int>& ranks_done, int ranks, const Scenario& scenario, int rank, AsyncRank& out) {
  bool finished = false;
  for (int64_t step = 0; step < 20000; ++step) {
    steps.arrive_and_wait();
    if (ranks_done.load() == ranks) break;
    steps.arrive_and_wait();  // everybody read ranks_done before anyone adds to it
    if (rank == 0 && step == scenario.abort_at_step) handle.abort();
    auto committed = handle.commit_ready(step);
    if (!committed && out.failure.is_ok()) out.failure = committed.status();
    if (committed)
      for (int layer : *committed) out.commit_steps[layer] = step;
    if (!testing::verify_rows(store, current)) ++out.inconsistent_steps;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the forward pass
    out.steps = step + 1;
    if (!finished && handle.done()) {
      finished = true;
      ranks_done.fetch_add(1);
    }
  }
}

std::vector<AsyncRank> run_async(const Scenario& scenario, const Placement& target) {
  const Topology& topology = scenario.topology;
  auto groups = make_thread_groups(topology.num_ranks);
  std::vector<AsyncRank> results(size_t(topology.num_ranks));
  const std::string prefix = "async-test-" + std::to_string(agent_counter++) + "-";
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), {{"w", scenario.row_bytes}});
  std::barrier steps(topology.num_ranks);
  std::atomic<int> ranks_done{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < topology.num_ranks; ++r)
    threads.emplace_back([&, r] {
      AsyncRank& result = results[size_t(r)];
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      config.fault_spec = scenario.fault_spec;
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * topology.slots_per_rank());
      Placement current = default_placement(topology);
      if (agent && store) testing::fill_rows(**store, current);
      auto migrator = agent && store ? Migrator::create(*groups[size_t(r)], **agent, **store, topology,
                                                        scenario.options, Deadline::after_seconds(20))
                                     : Result<std::unique_ptr<Migrator>>(error(Code::Internal, "set-up"));
      auto handle = migrator ? (*migrator)->start(current, target)
                             : Result<std::unique_ptr<AsyncMigration>>(migrator.status());
      result.setup = handle.status();
      if (!handle) {
        steps.arrive_and_drop();
        return;
      }
      serve(**handle, **store, current, steps, ranks_done, topology.num_ranks, scenario, r, result);
      if (result.failure.is_ok()) result.failure = (*handle)->poll();
      result.report = (*handle)->report();
      result.final_placement = current;
      result.verified = testing::verify_rows(**store, current);
      steps.arrive_and_drop();
    });
  for (auto& thread : threads) thread.join();
  return results;
}

void expect_consistent(const std::vector<AsyncRank>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].setup) << "rank " << r << ": " << results[r].setup.to_string();
    EXPECT_TRUE(results[r].verified) << "rank " << r << ": " << results[r].verified.to_string();
    EXPECT_EQ(results[r].inconsistent_steps, 0) << "rank " << r;
    EXPECT_TRUE(results[r].final_placement == results[0].final_placement) << "rank " << r;
    EXPECT_EQ(results[r].commit_steps, results[0].commit_steps) << "rank " << r << " committed at other steps";
  }
}

TEST(AsyncMigration, EveryRankCommitsEachLayerAtTheSameStep) {
  Scenario scenario;
  scenario.topology = {4, 16, 24, 4, 2, 4};
  const Placement target = shuffled_placement(scenario.topology, 1);
  auto results = run_async(scenario, target);
  expect_consistent(results);
  for (const auto& result : results) {
    EXPECT_TRUE(result.failure) << result.failure.to_string();
    EXPECT_TRUE(result.report.status) << result.report.status.to_string();
    EXPECT_TRUE(result.final_placement == target);
    EXPECT_EQ(result.report.layers_committed(), scenario.topology.num_layers);
  }
  // Commits happen at distinct steps, D = 2 steps at least after step 0.
  int64_t previous = -1;
  for (auto [layer, step] : results[0].commit_steps) {
    EXPECT_GE(step, 2) << "layer " << layer;
    EXPECT_GT(step, previous) << "layer " << layer;
    previous = step;
  }
}

TEST(AsyncMigration, CorruptionIsRetriedInTheBackground) {
  Scenario scenario;
  scenario.topology = {3, 8, 12, 2, 2, 2};
  scenario.fault_spec = "corrupt=0.3,seed=3";
  scenario.options.retries = 8;
  const Placement target = shuffled_placement(scenario.topology, 2);
  auto results = run_async(scenario, target);
  expect_consistent(results);
  EXPECT_TRUE(results[0].report.status) << results[0].report.status.to_string();
  EXPECT_GT(results[0].report.retries(), 0);
  EXPECT_TRUE(results[0].final_placement == target);
}

TEST(AsyncMigration, StallSurfacesAtCommitReadyAndKeepsOldLayersOld) {
  Scenario scenario;
  scenario.topology = {3, 8, 12, 2, 2, 2};
  scenario.fault_spec = "stall=1";
  scenario.options.retries = 1;
  scenario.options.timeout_seconds = 0.2;
  Stopwatch clock;
  auto results = run_async(scenario, shuffled_placement(scenario.topology, 3));
  EXPECT_LT(clock.seconds(), 15.0);
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_FALSE(result.failure);
    EXPECT_EQ(result.failure.code(), Code::Aborted);
    EXPECT_NE(result.failure.message().find("still in progress at the deadline"), std::string::npos)
        << result.failure.message();
    EXPECT_TRUE(result.final_placement == default_placement(scenario.topology));
  }
}

TEST(AsyncMigration, VanishedPeerStopsTheRoundWithCommittedLayersAlike) {
  Scenario scenario;
  scenario.topology = {4, 8, 12, 2, 2, 2};
  scenario.fault_spec = "disconnect_after=2";
  scenario.options.retries = 2;
  auto results = run_async(scenario, shuffled_placement(scenario.topology, 5));
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_FALSE(result.failure);
    EXPECT_NE(result.failure.message().find("peer vanished"), std::string::npos) << result.failure.message();
    EXPECT_GE(result.report.layers_committed(), 1);
    EXPECT_LT(result.report.layers_committed(), scenario.topology.num_layers);
    EXPECT_EQ(int(result.commit_steps.size()), result.report.layers_committed());
  }
}

TEST(AsyncMigration, AbortStopsEveryRankAtTheNextVote) {
  Scenario scenario;
  scenario.topology = {6, 8, 12, 2, 2, 2};
  scenario.abort_at_step = 0;
  auto results = run_async(scenario, shuffled_placement(scenario.topology, 4));
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_FALSE(result.failure);
    EXPECT_EQ(result.failure.code(), Code::Aborted);
    EXPECT_NE(result.failure.message().find("rank 0 asked to abort"), std::string::npos) << result.failure.message();
    EXPECT_LT(result.report.layers_committed(), scenario.topology.num_layers);
  }
}

TEST(AsyncMigration, BadArgumentsAreRefused) {
  Topology topology{1, 4, 4, 1, 1, 1};
  auto groups = make_thread_groups(1);
  xfer::AgentConfig config;
  config.name = "async-args";
  config.backend = "loopback";
  auto agent = xfer::Agent::create(config);
  ASSERT_TRUE(agent);
  auto store = ExpertStore::create_arena(StoreLayout::uniform(1, 4, {{"w", 64}}), 0);
  ASSERT_TRUE(store);
  auto migrator = Migrator::create(*groups[0], **agent, **store, topology, {}, Deadline::after_seconds(5));
  ASSERT_TRUE(migrator);
  Placement current = default_placement(topology);
  EXPECT_EQ((*migrator)->start(current, current, 0).status().code(), Code::InvalidArgument);
  auto handle = (*migrator)->start(current, current);
  ASSERT_TRUE(handle);
  EXPECT_EQ((*handle)->commit_ready(0, 0).status().code(), Code::InvalidArgument);
  ASSERT_TRUE((*handle)->commit_ready(1));
  EXPECT_EQ((*handle)->commit_ready(1).status().code(), Code::InvalidArgument);
}

}  // namespace
}  // namespace eplb
