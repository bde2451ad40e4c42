// The swap commit (CommitMode::Swap) of async rounds, over loopback with
// threads as ranks (async_harness.h): byte-exact rows and the same commit
// step on every rank, buffers that flip back and forth over rounds, the
// checksum cache following the swap, aborted and failed layers leaving the
// live buffer and the mapping old, and memory that cannot swap refused.
#include "async_harness.h"

namespace eplb {
namespace {

using testing::expect_consistent;
using testing::run_async;
using testing::Scenario;
using testing::shuffled_placement;

Scenario swap_scenario(Topology topology) {
  Scenario scenario;
  scenario.topology = topology;
  scenario.options.commit = CommitMode::Swap;
  return scenario;
}

TEST(AsyncSwap, RoundsCommitByteExactAtTheSameStepAndFlipBuffers) {
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    Scenario scenario = swap_scenario({4, 16, 24, 4, 2, ranks});
    std::vector<Placement> targets;
    for (uint64_t seed = 1; seed <= 4; ++seed) targets.push_back(shuffled_placement(scenario.topology, seed));
    auto results = run_async(scenario, targets);
    expect_consistent(results);
    for (const auto& result : results) {
      ASSERT_EQ(result.rounds_run, 4);
      EXPECT_TRUE(result.failure) << result.failure.to_string();
      EXPECT_EQ(mapping_hash(result.final_placement), mapping_hash(targets.back()));
      EXPECT_EQ(result.report.layers_committed(), scenario.topology.num_layers);
    }
    // Some layer of some rank went to buffer 1 and back to buffer 0.
    bool flipped_back = false;
    for (const auto& result : results)
      for (int l = 0; l < scenario.topology.num_layers; ++l)
        for (size_t round = 1; round < result.live_buffers.size(); ++round)
          flipped_back = flipped_back || (result.live_buffers[round - 1][l] == 1 && result.live_buffers[round][l] == 0);
    EXPECT_TRUE(flipped_back);
  }
}

TEST(AsyncSwap, CorruptionIsRetriedIntoTheSpare) {
  Scenario scenario = swap_scenario({3, 8, 12, 2, 2, 2});
  scenario.fault_spec = "corrupt=0.3,seed=3";
  scenario.options.retries = 8;
  const Placement target = shuffled_placement(scenario.topology, 2);
  auto results = run_async(scenario, {target, default_placement(scenario.topology)});
  expect_consistent(results);
  EXPECT_TRUE(results[0].report.status) << results[0].report.status.to_string();
  EXPECT_GT(results[0].retries, 0);
  EXPECT_EQ(mapping_hash(results[0].final_placement), mapping_hash(default_placement(scenario.topology)));
}

// A layer that fails for good discards its spare: live rows, live buffer
// and mapping stay as they were on every rank.
TEST(AsyncSwap, FailedLayerLeavesLiveBufferAndMappingOld) {
  Scenario scenario = swap_scenario({3, 8, 12, 2, 2, 2});
  scenario.fault_spec = "stall=1";
  scenario.options.retries = 1;
  scenario.options.timeout_seconds = 0.2;
  auto results = run_async(scenario, shuffled_placement(scenario.topology, 3));
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_FALSE(result.failure);
    EXPECT_EQ(result.failure.code(), Code::Aborted);
    EXPECT_EQ(mapping_hash(result.final_placement), mapping_hash(default_placement(scenario.topology)));
    EXPECT_EQ(result.live_buffers.back(), std::vector<int>(3, 0));
  }
}

TEST(AsyncSwap, AbortKeepsUncommittedLayersOnTheirOldBuffer) {
  Scenario scenario = swap_scenario({6, 8, 12, 2, 2, 2});
  scenario.abort_at_step = 0;
  const Placement target = shuffled_placement(scenario.topology, 4);
  auto results = run_async(scenario, target);
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_FALSE(result.failure);
    EXPECT_EQ(result.failure.code(), Code::Aborted);
    EXPECT_LT(result.report.layers_committed(), scenario.topology.num_layers);
    for (const auto& layer : result.report.layers) {
      if (!layer.committed) {
        EXPECT_EQ(result.live_buffers.back()[size_t(layer.layer)], 0) << "layer " << layer.layer;
      }
    }
  }
}

Status create_with(ExpertStore& store, const Topology& topology, CommitMode mode) {
  auto groups = make_thread_groups(1);
  xfer::AgentConfig config;
  config.name = "swap-refusal-" + std::to_string(testing::async_agent_counter++);
  config.backend = "loopback";
  auto agent = xfer::Agent::create(config);
  if (!agent) return agent.status();
  MigrateOptions options;
  options.commit = mode;
  return Migrator::create(*groups[0], **agent, store, topology, options, Deadline::after_seconds(5)).status();
}

TEST(AsyncSwap, MemoryWithoutSpareBuffersIsRefused) {
  const Topology topology{1, 4, 4, 1, 1, 1};
  const StoreLayout layout = StoreLayout::uniform(1, 4, {{"w", 64}});
  std::vector<uint8_t> engine(4 * 64), engine_spare(4 * 64);
  auto adopted = ExpertStore::adopt(layout, 0, {{TensorMemory{engine.data(), 0, false}}});
  auto adopted_spare = ExpertStore::adopt(layout, 0, {{TensorMemory{engine.data(), 0, false}}},
                                          {{TensorMemory{engine_spare.data(), 0, false}}});
  auto plain = ExpertStore::create_arena(layout, 0);
  auto spare = ExpertStore::create_arena(layout, 0, nullptr, true);
  ASSERT_TRUE(adopted && plain && spare && adopted_spare);
  for (ExpertStore* store : {adopted->get(), plain->get()}) {
    Status refused = create_with(*store, topology, CommitMode::Swap);
    EXPECT_EQ(refused.code(), Code::InvalidArgument);
    EXPECT_NE(refused.message().find("swap commit needs a spare buffer per layer"), std::string::npos)
        << refused.to_string();
  }
  EXPECT_EQ((*adopted)->spare_bytes(), 0u);
  EXPECT_EQ((*spare)->spare_bytes(), 4096u);  // one page-aligned layer
  EXPECT_TRUE(create_with(**spare, topology, CommitMode::Swap));
  EXPECT_TRUE(create_with(**spare, topology, CommitMode::Copy));
  // The engine's own second buffers (adopt with spare): both registered, 256 B of spares.
  EXPECT_EQ((*adopted_spare)->spare_bytes(), 4u * 64);
  EXPECT_EQ((*adopted_spare)->regions().size(), 3u);  // live, spare, staging
  EXPECT_TRUE(create_with(**adopted_spare, topology, CommitMode::Swap));
}

TEST(AsyncSwap, AdoptedSpareMemoryMustMatchTheLayout) {
  const StoreLayout layout = StoreLayout::uniform(2, 4, {{"w", 64}});
  std::vector<uint8_t> engine(2 * 4 * 64);
  std::vector<std::vector<TensorMemory>> live{{TensorMemory{engine.data(), 0, false}},
                                              {TensorMemory{engine.data() + 256, 0, false}}};
  auto one_layer = ExpertStore::adopt(layout, 0, live, {{TensorMemory{engine.data(), 0, false}}});
  ASSERT_FALSE(one_layer);
  EXPECT_NE(one_layer.status().message().find("spare memory lists 1 layers, the layout has 2"), std::string::npos)
      << one_layer.status().to_string();
  auto null_spare = ExpertStore::adopt(layout, 0, live, {{TensorMemory{}}, {TensorMemory{}}});
  ASSERT_FALSE(null_spare);
  EXPECT_NE(null_spare.status().message().find("spare memory of layer 0 tensor 'w' is null"), std::string::npos)
      << null_spare.status().to_string();
}

}  // namespace
}  // namespace eplb
