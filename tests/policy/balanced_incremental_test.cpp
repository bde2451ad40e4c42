// balanced: the worst case for greedy, never worse than deepseek in sample.
// incremental: hand cases.
#include <gtest/gtest.h>

#include "../../src/policy/balanced.h"
#include "eplb/policy.h"
#include "policy_support.h"

namespace eplb {
namespace {

using policy_tests::max_rank_load;
using policy_tests::read_json;
using policy_tests::skewed_load;
using policy_tests::test_shapes;

struct WorstCase {
  Topology topology;
  LoadMatrix load;
};

WorstCase worst_case() {
  auto example = read_json("greedy_worst_case.json");
  WorstCase w;
  const auto& rows = example["load"];
  w.load = LoadMatrix(int(rows.size()), int(rows[0].size()));
  for (int e = 0; e < w.load.num_experts; ++e) w.load.at(0, e) = rows[0][size_t(e)].get<double>();
  w.topology = Topology{1, w.load.num_experts, example["num_replicas"].get<int>(), example["num_groups"].get<int>(),
                        example["num_nodes"].get<int>(), example["num_ranks"].get<int>()};
  return w;
}

TEST(Balanced, BeatsGreedyOnItsWorstCase) {
  WorstCase w = worst_case();
  Placement greedy = deepseek_placement(w.load, w.topology).value();
  EXPECT_NEAR(max_rank_load(greedy, w.load, w.topology, 0), 232.0, 1e-9);
  auto placed = make_policy("balanced").value()->place(w.load, w.topology, default_placement(w.topology), {});
  ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
  ASSERT_TRUE(placed->validate_against(w.topology).is_ok());
  double max = max_rank_load(*placed, w.load, w.topology, 0);
  EXPECT_LE(max, 200.0);
  EXPECT_GE(max, 196.66);  // the optimum under an even split is 196.67
}

TEST(Balanced, WorstCaseWithAntiAffinity) {
  WorstCase w = worst_case();
  PolicyOptions options;
  options.anti_affinity = true;
  auto placed = make_policy("balanced").value()->place(w.load, w.topology, default_placement(w.topology), options);
  ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
  EXPECT_FALSE(policy_tests::has_duplicate_on_a_rank(*placed, w.topology));
  EXPECT_LE(max_rank_load(*placed, w.load, w.topology, 0), 200.0);
}

TEST(Balanced, NeverWorseThanDeepseekInSampleOnAnyLayer) {
  auto balanced = make_policy("balanced").value();
  for (const Topology& topology : test_shapes()) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, seed, 0.4 * double(seed));
      Placement greedy = deepseek_placement(load, topology).value();
      auto placed = balanced->place(load, topology, default_placement(topology), {});
      ASSERT_TRUE(placed.is_ok());
      auto mine = balancedness(*placed, load, topology), theirs = balancedness(greedy, load, topology);
      for (int l = 0; l < topology.num_layers; ++l)
        EXPECT_GE(mine.per_layer[size_t(l)], theirs.per_layer[size_t(l)])
            << topology.to_string() << " seed " << seed << " layer " << l;
    }
  }
}

TEST(Balanced, PackingHelpers) {
  std::vector<double> load{600, 560, 120, 120, 20, 10, 10, 10};
  EXPECT_EQ(policies::greedy_replica_counts(load, 16), (std::vector<int>{5, 5, 1, 1, 1, 1, 1, 1}));
  Topology topology{1, 8, 16, 1, 1, 8};
  std::vector<int> count{5, 3, 2, 2, 1, 1, 1, 1};
  std::vector<int32_t> packed = policies::pack_replicas(load, count, topology, false);
  ASSERT_EQ(packed.size(), 16u);
  Placement placement = Placement::from_phy2log(1, 8, 16, packed).value();
  LoadMatrix matrix(1, 8);
  matrix.values = load;
  EXPECT_NEAR(max_rank_load(placement, matrix, topology, 0), 560.0 / 3 + 10, 1e-9);
}

// Incremental hand cases.

TEST(Incremental, NoChangeWhenAlreadyBalanced) {
  // 8 experts, 16 slots, 8 ranks: the default placement gives every expert
  // two replicas and every rank the same load.
  Topology topology{1, 8, 16, 1, 1, 8};
  LoadMatrix load(1, 8);
  for (int e = 0; e < 8; ++e) load.at(0, e) = 100;
  Placement current = default_placement(topology);
  auto placed = make_policy("incremental").value()->place(load, topology, current, {});
  ASSERT_TRUE(placed.is_ok());
  EXPECT_EQ(placed->phy2log_data(), current.phy2log_data());
}

TEST(Incremental, SingleHotExpertGainsAReplica) {
  // 8 experts, 12 slots on 4 ranks: experts 0..3 have two replicas, expert 5
  // (one replica) is hot. One slot of budget: a cold redundant replica is
  // re-targeted to expert 5.
  Topology topology{1, 8, 12, 1, 1, 4};
  LoadMatrix load(1, 8);
  for (int e = 0; e < 8; ++e) load.at(0, e) = e == 5 ? 100 : 10;
  Placement current = default_placement(topology);
  ASSERT_EQ(current.logcnt(0, 5), 1);
  PolicyOptions options;
  options.budget = 1;
  auto placed = make_policy("incremental").value()->place(load, topology, current, options);
  ASSERT_TRUE(placed.is_ok());
  EXPECT_EQ(placed->logcnt(0, 5), 2);
  EXPECT_EQ(slots_changed(current, *placed)[0], 1);
  EXPECT_LT(max_rank_load(*placed, load, topology, 0), max_rank_load(current, load, topology, 0));
}

TEST(Incremental, HighMoveThresholdStopsEarly) {
  Topology topology{1, 8, 12, 1, 1, 4};
  LoadMatrix load(1, 8);
  for (int e = 0; e < 8; ++e) load.at(0, e) = e == 5 ? 100 : 10;
  Placement current = default_placement(topology);
  PolicyOptions options;
  options.budget = 12;
  options.move_threshold = 0.9;  // no move lowers the score by 90%
  auto placed = make_policy("incremental").value()->place(load, topology, current, options);
  ASSERT_TRUE(placed.is_ok());
  EXPECT_EQ(placed->phy2log_data(), current.phy2log_data());
}

TEST(Incremental, ImprovesASkewedLayerWithinBudget) {
  Topology topology{4, 64, 72, 8, 4, 8};
  LoadMatrix load = skewed_load(4, 64, 9, 1.5);
  Placement current = default_placement(topology);
  PolicyOptions options;
  options.budget = 0.25;
  auto placed = make_policy("incremental").value()->place(load, topology, current, options);
  ASSERT_TRUE(placed.is_ok());
  auto before = balancedness(current, load, topology), after = balancedness(*placed, load, topology);
  for (int l = 0; l < 4; ++l) EXPECT_GT(after.per_layer[size_t(l)], before.per_layer[size_t(l)]) << "layer " << l;
  for (int changed : slots_changed(current, *placed)) EXPECT_LE(changed, 18);
}

}  // namespace
}  // namespace eplb
