// The async round (Migrator::start), copy commits, over loopback with
// threads as ranks (async_harness.h). Every rank must commit each layer at
// the same step, and a failed round must leave committed layers new and the
// rest old on every rank.
#include <sched.h>

#include "async_harness.h"

namespace eplb {
namespace {

using testing::expect_consistent;
using testing::run_async;
using testing::Scenario;
using testing::shuffled_placement;

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

// A handle learns the serving step from its first commit_ready: a vote
// reached before that call waits for it instead of casting step 0 (steps run
// on across rounds here and start at 1000; the progress threads vote while
// the serving threads sleep). Before the fix: "layer 0 was to commit at
// step 2, the serving thread is at step 1000".
TEST(AsyncMigration, StepsNeedNotStartAtZeroAndTheFirstCallMayComeLate) {
  Scenario scenario;
  scenario.topology = {2, 8, 12, 2, 2, 2};
  scenario.first_step = 1000;
  scenario.first_call_delay_ms = 300;
  const std::vector<Placement> targets = {shuffled_placement(scenario.topology, 6),
                                          shuffled_placement(scenario.topology, 7)};
  auto results = run_async(scenario, targets);
  expect_consistent(results);
  for (const auto& result : results) {
    EXPECT_EQ(result.rounds_run, 2);
    EXPECT_TRUE(result.failure) << result.failure.to_string();
    EXPECT_TRUE(result.report.status) << result.report.status.to_string();
    EXPECT_EQ(mapping_hash(result.final_placement), mapping_hash(targets.back()));
    for (auto [layer, step] : result.commit_steps) EXPECT_GT(step, 1000) << "layer " << layer;
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

// The progress thread runs as batch work (MigrateOptions::batch_progress_
// thread), so waking it does not preempt the serving thread; off, it keeps
// the caller's policy. before_attempt runs on the progress thread.
TEST(AsyncMigration, ProgressThreadRunsAsBatchWorkUnlessAskedNot) {
  for (const bool batch : {true, false}) {
    Scenario scenario;
    scenario.topology = {2, 4, 8, 2, 1, 2};
    scenario.options.batch_progress_thread = batch;
    std::atomic<int> attempts{0}, batch_attempts{0};
    scenario.options.before_attempt = [&](int, int) {
      attempts += 1;
      if (sched_getscheduler(0) == SCHED_BATCH) batch_attempts += 1;
    };
    auto results = run_async(scenario, shuffled_placement(scenario.topology, 5));
    expect_consistent(results);
    EXPECT_TRUE(results[0].report.status) << results[0].report.status.to_string();
    ASSERT_GT(attempts.load(), 0) << "batch " << batch;
    EXPECT_EQ(batch_attempts.load(), batch ? attempts.load() : 0) << "batch " << batch;
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

// Issue 29, item 2: a serving thread that stalls longer than the deadline
// after a layer was voted. Before, rank 0 committed the layer at the agreed
// step and rank 1, whose progress thread gave up waiting, kept it old, even
// after the handle closed. Now a voted commit is owed: rank 1 runs it at
// its first commit_ready from the agreed step on, or when the handle
// closes, and every rank ends with the same layers new.
TEST(AsyncMigration, ALateServingThreadStillCommitsWhatTheVoteAgreed) {
  Topology topology{4, 8, 12, 2, 2, 2};
  const Placement target = shuffled_placement(topology, 9);
  auto groups = make_thread_groups(2);
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), {{"w", 4096}});
  struct Outcome {
    Status setup, failure, verified;
    Placement final_placement;
    int committed = 0;
  };
  std::vector<Outcome> outcomes(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Outcome& out = outcomes[size_t(r)];
      xfer::AgentConfig config;
      config.name = "late-serving-" + std::to_string(testing::async_agent_counter++) + "-" + std::to_string(r);
      config.backend = "loopback";
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * topology.slots_per_rank());
      Placement current = default_placement(topology);
      testing::fill_rows(**store, current);
      MigrateOptions options;
      options.collective_timeout_seconds = 1.0;  // how long a progress thread waits for its serving thread
      auto migrator = Migrator::create(*groups[size_t(r)], **agent, **store, topology, options,
                                       Deadline::after_seconds(20));
      out.setup = migrator.status();
      if (!migrator) return;
      {
        auto handle = (*migrator)->start(current, target, /*lead_steps=*/2);
        bool stalled = false;
        Stopwatch clock;
        for (int64_t step = 0; !(*handle)->done() && clock.seconds() < 30; ++step) {
          auto committed = (*handle)->commit_ready(step);
          if (!committed && out.failure.is_ok()) out.failure = committed.status();
          if (committed && !committed->empty() && r == 1 && !stalled) {
            stalled = true;  // rank 1's serving loop stops for 2.5 s after its first commit
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (out.failure.is_ok()) out.failure = (*handle)->poll();
        out.committed = (*handle)->report().layers_committed();
      }  // the handle closes: an owed commit runs here at the latest
      out.final_placement = current;
      out.verified = testing::verify_rows(**store, current);
    });
  for (auto& thread : threads) thread.join();
  for (const Outcome& out : outcomes) {
    ASSERT_TRUE(out.setup) << out.setup.to_string();
    EXPECT_FALSE(out.failure) << "the stall must stop the round; committed " << out.committed;
    EXPECT_TRUE(out.verified) << out.verified.to_string();
  }
  EXPECT_TRUE(outcomes[0].final_placement == outcomes[1].final_placement)
      << "the ranks ended with different layers new";
  EXPECT_EQ(outcomes[0].committed, outcomes[1].committed);
  EXPECT_GE(outcomes[0].committed, 2);  // the first commit and the one voted during the stall
}

}  // namespace
}  // namespace eplb
