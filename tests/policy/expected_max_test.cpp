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

// Two normals of unequal means and spreads: Clark's closed form
// mu1 Phi(a) + mu2 Phi(-a) + theta phi(a), theta^2 = s1^2 + s2^2, a = (mu1 - mu2) / theta.
TEST(ExpectedMax, UnequalNormalsMatchClark) {
  const double mu1 = 100, mu2 = 95, s1 = 2, s2 = 30;
  const double theta = std::sqrt(s1 * s1 + s2 * s2), a = (mu1 - mu2) / theta;
  auto Phi = [](double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); };
  const double clark = mu1 * Phi(a) + mu2 * Phi(-a) + theta * std::exp(-a * a / 2) / std::sqrt(2 * std::numbers::pi);
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{mu1, mu2}, std::vector<double>{s1, s2}), clark, 1e-3);
}

// A constant among normals: E[max(N(0,1), 0)] = 1 / sqrt(2 pi); E[max(N(0,1), -1)] = phi(1) - Phi(-1).
TEST(ExpectedMax, ConstantsAmongNormals) {
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{0, 0}, std::vector<double>{1, 0}),
              1 / std::sqrt(2 * std::numbers::pi), 1e-3);
  const double phi1 = std::exp(-0.5) / std::sqrt(2 * std::numbers::pi), Phi_minus1 = 0.5 * std::erfc(1 / std::sqrt(2.0));
  EXPECT_NEAR(expected_max_of_normals(std::vector<double>{0, -1}, std::vector<double>{1, 0}), phi1 - Phi_minus1, 1e-3);
}

// E[max] scales with its inputs, also for loads whose squares overflow a double.
TEST(ExpectedMax, ScalesWithItsInputs) {
  const std::vector<double> mean{3, 4, 2}, spread{1, 0.5, 2};
  const double base = expected_max_of_normals(mean, spread);
  std::vector<double> mean7 = mean, spread7 = spread;
  for (double& v : mean7) v *= 7;
  for (double& v : spread7) v *= 7;
  EXPECT_NEAR(expected_max_of_normals(mean7, spread7), 7 * base, 1e-9 * 7 * base);

  const Topology topology{1, 3, 4, 1, 1, 2};
  const std::vector<int32_t> phy2log{0, 1, 0, 2};
  const std::vector<double> load{8, 4, 4}, huge{8e200, 4e200, 4e200};
  const double small = layer_expected_max_load(phy2log, load, topology, 0.1);
  const double big = layer_expected_max_load(phy2log, huge, topology, 0.1);
  ASSERT_TRUE(std::isfinite(big));
  EXPECT_NEAR(big / 1e200, small, 1e-9 * small);
  EXPECT_EQ(layer_expected_max_load(phy2log, std::vector<double>{0, 0, 0}, topology, 0.1), 0.0);
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

  std::vector<int32_t> unchanged = phy2log;
  EXPECT_EQ(recount_toward_greedy(unchanged, load, topology, 0), 0);
  EXPECT_EQ(unchanged, phy2log);

  // Surplus replicas are taken first from ranks that do not hold the hot
  // expert yet: expert 0's replica on rank 0 (rank 2 holds 7), then expert
  // 1's on rank 3 (rank 0 now holds 7).
  std::vector<int32_t> limited = phy2log;
  EXPECT_EQ(recount_toward_greedy(limited, load, topology, 2), 2);
  EXPECT_EQ(limited, (std::vector<int32_t>{7, 1, 2, 3, 4, 5, 6, 7, 0, 7, 2, 3}));

  EXPECT_EQ(recount_toward_greedy(phy2log, load, topology, 100), 4);
  std::vector<int> count(8, 0);
  for (int32_t e : phy2log) ++count[size_t(e)];
  EXPECT_EQ(count, target);
  for (int rank = 0; rank < 4; ++rank)  // 5 replicas of the hot expert reach all 4 ranks
    EXPECT_NE(std::find(phy2log.begin() + rank * 3, phy2log.begin() + rank * 3 + 3, 7), phy2log.begin() + rank * 3 + 3)
        << "rank " << rank;
  // Already at the greedy counts: nothing to do.
  EXPECT_EQ(recount_toward_greedy(phy2log, load, topology, 100), 0);
}

}  // namespace
}  // namespace eplb
