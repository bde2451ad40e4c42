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

}  // namespace
}  // namespace eplb
