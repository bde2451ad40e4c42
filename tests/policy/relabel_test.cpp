// relabel: deepseek's rank contents, renumbered onto ranks to keep experts
// in place. Same rank loads as deepseek, never more slots moved, and an
// optimal assignment (checked against brute force on small shapes).
#include <gtest/gtest.h>

#include <numeric>

#include "../../src/policy/hungarian.h"
#include "../../src/policy/relabel.h"
#include "eplb/policy.h"
#include "policy_support.h"

namespace eplb {
namespace {

using policy_tests::skewed_load;
using policy_tests::sorted_rank_loads;
using policy_tests::test_shapes;

int total_changed(const Placement& a, const Placement& b) {
  auto changed = slots_changed(a, b);
  return std::accumulate(changed.begin(), changed.end(), 0);
}

TEST(Relabel, SameRankLoadsAsDeepseekAndNeverMoreSlotsMoved) {
  auto relabel = make_policy("relabel").value();
  for (const Topology& topology : test_shapes()) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(topology.to_string() + " seed " + std::to_string(seed));
      LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, seed);
      // Currents: the default placement, and deepseek's for a drifted load.
      LoadMatrix drifted = load;
      for (size_t i = 0; i < drifted.values.size(); i += 3) drifted.values[i] *= 1.5;
      for (const Placement& current :
           {default_placement(topology), deepseek_placement(drifted, topology).value()}) {
        Placement fresh = deepseek_placement(load, topology).value();
        auto placed = relabel->place(load, topology, current, PolicyOptions{});
        ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
        ASSERT_TRUE(placed->validate_against(topology).is_ok());
        EXPECT_EQ(placed->logcnt_data(), fresh.logcnt_data());
        for (int l = 0; l < topology.num_layers; ++l) {
          auto mine = sorted_rank_loads(*placed, load, topology, l), theirs = sorted_rank_loads(fresh, load, topology, l);
          for (size_t r = 0; r < mine.size(); ++r) EXPECT_NEAR(mine[r], theirs[r], 1e-9 * (1 + theirs[r]));
        }
        // Each rank holds exactly the multiset of one of deepseek's ranks.
        const int per_rank = topology.slots_per_rank();
        for (int l = 0; l < topology.num_layers; ++l) {
          std::vector<std::vector<int>> mine, theirs;
          for (int r = 0; r < topology.num_ranks; ++r) {
            std::vector<int> a, b;
            for (int i = 0; i < per_rank; ++i) {
              a.push_back(placed->phy2log(l, r * per_rank + i));
              b.push_back(fresh.phy2log(l, r * per_rank + i));
            }
            std::sort(a.begin(), a.end());
            std::sort(b.begin(), b.end());
            mine.push_back(a);
            theirs.push_back(b);
          }
          std::sort(mine.begin(), mine.end());
          std::sort(theirs.begin(), theirs.end());
          EXPECT_EQ(mine, theirs);
        }
        EXPECT_LE(total_changed(current, *placed), total_changed(current, fresh));
        EXPECT_DOUBLE_EQ(balancedness(*placed, load, topology).sum_balancedness,
                         balancedness(fresh, load, topology).sum_balancedness);
      }
    }
  }
}

TEST(Relabel, KeepsNodeContentsWholeInTheHierarchicalCase) {
  Topology topology{2, 16, 24, 4, 2, 8};
  LoadMatrix load = skewed_load(2, 16, 5);
  Placement fresh = deepseek_placement(load, topology).value();
  Placement current = deepseek_placement(skewed_load(2, 16, 6), topology).value();
  auto placed = make_policy("relabel").value()->place(load, topology, current, PolicyOptions{});
  ASSERT_TRUE(placed.is_ok());
  const int per_node = topology.num_slots / topology.num_nodes;
  for (int l = 0; l < 2; ++l) {
    std::vector<std::vector<int>> mine, theirs;
    for (int n = 0; n < topology.num_nodes; ++n) {
      std::vector<int> a, b;
      for (int i = 0; i < per_node; ++i) {
        a.push_back(placed->phy2log(l, n * per_node + i));
        b.push_back(fresh.phy2log(l, n * per_node + i));
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      mine.push_back(a);
      theirs.push_back(b);
    }
    std::sort(mine.begin(), mine.end());
    std::sort(theirs.begin(), theirs.end());
    EXPECT_EQ(mine, theirs) << "layer " << l;
  }
}

TEST(Relabel, RankAssignmentIsOptimal) {
  // 5 ranks, one node: relabel must keep as many slots as the best of all
  // 120 rank permutations (each followed by keeping surviving experts in place).
  Topology topology{1, 10, 15, 1, 1, 5};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> fresh(15), old(15);
    for (auto& e : fresh) e = int32_t(rng() % 10);
    for (auto& e : old) e = int32_t(rng() % 10);
    std::vector<int32_t> result = policies::relabel_layer(fresh, old, topology, false);
    int kept = 0;
    for (int s = 0; s < 15; ++s) kept += result[size_t(s)] == old[size_t(s)];
    // Brute force: overlap of multisets for every permutation.
    std::vector<int> perm{0, 1, 2, 3, 4};
    int best = 0;
    do {
      int total = 0;
      for (int a = 0; a < 5; ++a) {
        std::vector<int> x(fresh.begin() + 3 * a, fresh.begin() + 3 * a + 3);
        std::vector<int> y(old.begin() + 3 * perm[a], old.begin() + 3 * perm[a] + 3);
        std::sort(x.begin(), x.end());
        std::sort(y.begin(), y.end());
        std::vector<int> common;
        std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
        total += int(common.size());
      }
      best = std::max(best, total);
    } while (std::next_permutation(perm.begin(), perm.end()));
    EXPECT_EQ(kept, best) << "seed " << seed;
    // Same multiset of rank contents as fresh.
    std::vector<int32_t> a = result, b = fresh;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
  }
}

TEST(Relabel, IdenticalContentsCostNothing) {
  Topology topology{1, 8, 16, 1, 1, 8};
  LoadMatrix load = skewed_load(1, 8, 3);
  Placement fresh = deepseek_placement(load, topology).value();
  // The current placement is deepseek's own, with ranks reversed and each
  // rank's two slots swapped: relabel must find the way back to it exactly.
  std::vector<int32_t> scrambled(16);
  for (int r = 0; r < 8; ++r) {
    scrambled[size_t(2 * (7 - r))] = fresh.phy2log(0, 2 * r + 1);
    scrambled[size_t(2 * (7 - r) + 1)] = fresh.phy2log(0, 2 * r);
  }
  Placement current = Placement::from_phy2log(1, 8, 16, scrambled).value();
  auto placed = make_policy("relabel").value()->place(load, topology, current, PolicyOptions{});
  ASSERT_TRUE(placed.is_ok());
  EXPECT_EQ(placed->phy2log_data(), scrambled);
}

TEST(Hungarian, MatchesBruteForce) {
  for (int n = 1; n <= 6; ++n) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      std::mt19937_64 rng(seed * 31 + n);
      std::vector<double> cost(size_t(n) * n);
      for (double& c : cost) c = double(rng() % 20) - 5;
      std::vector<int> assignment = policies::min_cost_assignment(cost, n);
      double total = 0;
      std::vector<int> seen(size_t(n), 0);
      for (int i = 0; i < n; ++i) {
        ASSERT_GE(assignment[size_t(i)], 0);
        ASSERT_LT(assignment[size_t(i)], n);
        ++seen[size_t(assignment[size_t(i)])];
        total += cost[size_t(i) * n + assignment[size_t(i)]];
      }
      for (int count : seen) EXPECT_EQ(count, 1);
      std::vector<int> perm(static_cast<size_t>(n));
      std::iota(perm.begin(), perm.end(), 0);
      double best = 1e18;
      do {
        double sum = 0;
        for (int i = 0; i < n; ++i) sum += cost[size_t(i) * n + perm[size_t(i)]];
        best = std::min(best, sum);
      } while (std::next_permutation(perm.begin(), perm.end()));
      EXPECT_DOUBLE_EQ(total, best) << "n " << n << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace eplb
