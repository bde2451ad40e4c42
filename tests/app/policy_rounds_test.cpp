// Every policy driving the migration executor over a drifting trace, in one
// process: ranks are threads, transfers go through the loopback backend, the
// rows hold sim's synthetic expert bytes. After every round every slot on
// every rank holds its mapped expert byte for byte. A policy that fails is
// a test failure.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "eplb/app.h"
#include "eplb/policy.h"

namespace eplb {
namespace {

std::atomic<int> agent_counter{0};

struct RankResult {
  Status setup;
  Status rounds;
  Status verified;
  Placement final_placement;
};

// Runs `targets` as consecutive rounds on topology.num_ranks threads.
std::vector<RankResult> run_rounds(const Topology& topology, const std::vector<Placement>& targets) {
  auto groups = make_thread_groups(topology.num_ranks);
  std::vector<RankResult> results(size_t(topology.num_ranks));
  const std::string prefix = "policy-rounds-" + std::to_string(agent_counter++) + "-";
  const StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), {{"w", 4096}, {"s", 64}});
  std::vector<std::thread> threads;
  for (int r = 0; r < topology.num_ranks; ++r)
    threads.emplace_back([&, r] {
      RankResult& result = results[size_t(r)];
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * topology.slots_per_rank());
      result.setup = !agent ? agent.status() : store.status();
      if (!result.setup) return;
      Placement current = default_placement(topology);
      fill_simulated(**store, current);
      auto migrator = Migrator::create(*groups[r], **agent, **store, topology, {}, Deadline::after_seconds(20));
      if (!migrator) {
        result.setup = migrator.status();
        return;
      }
      for (const auto& target : targets) {
        result.rounds = (*migrator)->migrate(current, target).status;
        if (!result.rounds) break;
      }
      result.final_placement = current;
      result.verified = verify_simulated(**store, current);
    });
  for (auto& thread : threads) thread.join();
  return results;
}

class PolicyRounds : public ::testing::TestWithParam<int> {};

TEST_P(PolicyRounds, EveryPolicyOverADriftingTraceMovesByteForByte) {
  const int ranks = GetParam();
  Topology topology{3, 16, 24, 4, 2, ranks};
  LoadGenOptions generate;
  generate.num_layers = topology.num_layers;
  generate.num_experts = topology.num_experts;
  generate.num_steps = 40;
  generate.seed = 3;
  auto trace = generate_load_trace(generate);
  ASSERT_TRUE(trace) << trace.status().to_string();
  for (const std::string& name : policy_names()) {
    SCOPED_TRACE(name);
    auto policy = make_policy(name);
    ASSERT_TRUE(policy) << policy.status().to_string();
    std::vector<Placement> targets;
    Placement current = default_placement(topology);
    for (int round = 0; round < 4; ++round) {
      auto next = (*policy)->place(trace->sum(round * 10, 10), topology, current, PolicyOptions{});
      ASSERT_TRUE(next) << "round " << round << ": " << next.status().to_string();
      targets.push_back(*next);
      current = *next;
    }
    auto results = run_rounds(topology, targets);
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_TRUE(results[r].setup) << "rank " << r << ": " << results[r].setup.to_string();
      EXPECT_TRUE(results[r].rounds) << "rank " << r << ": " << results[r].rounds.to_string();
      EXPECT_TRUE(results[r].verified) << "rank " << r << ": " << results[r].verified.to_string();
      EXPECT_EQ(results[r].final_placement.phy2log_data(), targets.back().phy2log_data()) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PolicyRounds, ::testing::Values(2, 4));

}  // namespace
}  // namespace eplb
