// layer_tools.h expected_max_of_normals / layer_expected_max_load (the
// cost-aware policy's score) against known answers, and balanced.h
// recount_toward_greedy (the counts its candidates start from).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "../../src/policy/balanced.h"
#include "../../src/policy/layer_tools.h"

namespace eplb {
namespace {

using policies::expected_max_of_normals;
using policies::layer_expected_max_load;
using policies::recount_toward_greedy;

TEST(ExpectedMax, KnownAnswers) {
  EXPECT_EQ(expected_max_of_normals({}, {}), 0.0);
  // No spread: the largest mean.
  const std::vector<double> means{3, 7, 5}, none{0, 0, 0};
  EXPECT_DOUBLE_EQ(expected_max_of_normals(means, none), 7.0);
  // One normal: its mean.
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{3}, std::vector<double>{2}), 3.0, 1e-3);
  // Two iid N(mu, s^2): mu + s / sqrt(pi).
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{10, 10}, std::vector<double>{2, 2}),
              10 + 2 / std::sqrt(std::numbers::pi), 1e-3);
  // 32 iid standard normals: 2.0697 (the expected largest of 32).
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>(32, 0.0), std::vector<double>(32, 1.0)), 2.0697, 2e-3);
  // A rank far below the others changes nothing.
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{10, 10, -100}, std::vector<double>{2, 2, 1}),
              10 + 2 / std::sqrt(std::numbers::pi), 1e-3);
}

TEST(ExpectedMax, LayerSpreadAndColocatedReplicas) {
  // 2 ranks x 2 slots, experts 0..2 with loads 8, 4, 4.
  const Topology topology{1, 3, 4, 1, 1, 2};
  const std::vector<double> load{8, 4, 4};
  // Expert 0 twice on rank 0 (one share of 8), experts 1 and 2 on rank 1: both ranks load 8.
  const std::vector<int32_t> colocated{0, 0, 1, 2};
  // Expert 0's replicas on both ranks: each rank 4 + 4.
  const std::vector<int32_t> spread{0, 1, 0, 2};
  EXPECT_DOUBLE_EQ(layer_expected_max_load(colocated, load, topology, 0), 8.0);
  EXPECT_DOUBLE_EQ(layer_expected_max_load(spread, load, topology, 0), 8.0);
  // sigma 0.1: rank 0 of `colocated` is N(8, 0.8^2), rank 1 N(8, 0.1^2 (16 + 16)).
  const double s0 = 0.8, s1 = 0.1 * std::sqrt(32.0);
  // E[max] of two independent normals with equal means: mean + sqrt((s0^2 + s1^2) / (2 pi)).
  EXPECT_NEAR(layer_expected_max_load(colocated, load, topology, 0.1),
              8 + std::sqrt((s0 * s0 + s1 * s1) / (2 * std::numbers::pi)), 1e-3);
  EXPECT_NEAR(layer_expected_max_load(spread, load, topology, 0.1),
              8 + std::sqrt((2 * s1 * s1) / (2 * std::numbers::pi)), 1e-3);
  EXPECT_GT(layer_expected_max_load(colocated, load, topology, 0.1),
            layer_expected_max_load(spread, load, topology, 0.1));
}

TEST(RecountTowardGreedy, MovesCountsWithinTheLimit) {
  // 4 ranks x 3 slots, 8 experts; expert 7 is hot, experts 0-3 hold the 4 redundant slots.
  const Topology topology{1, 8, 12, 1, 1, 4};
  const std::vector<double> load{1, 1, 1, 1, 1, 1, 1, 40};
  std::vector<int32_t> phy2log{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3};
  const std::vector<int> target = policies::greedy_replica_counts(load, topology.num_slots);
  ASSERT_EQ(target[7], 5);  // all 4 redundant slots go to the hot expert

  std::vector<int32_t> limited = phy2log;
  EXPECT_EQ(recount_toward_greedy(limited, load, topology, 1), 1);
  EXPECT_EQ(std::count(limited.begin(), limited.end(), 7), 2);

  EXPECT_EQ(recount_toward_greedy(phy2log, load, topology, 100), 4);
  std::vector<int> count(8, 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  EXPECT_EQ(count, target);
  // Already at the greedy counts: nothing to do.
  EXPECT_EQ(recount_toward_greedy(phy2log, load, topology, 100), 0);
}

}  // namespace
}  // namespace eplb
