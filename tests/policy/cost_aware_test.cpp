// The cost-aware policy: valid, deterministic and thread independent; moves
// nothing when the interval cannot pay for a migration; moves more and
// balances better as the interval grows; its choice never serves fewer
// tokens (by its own model) than keeping the placement; options checked.
#include <gtest/gtest.h>

#include "eplb/cluster.h"
#include "eplb/plan.h"
#include "eplb/policy.h"
#include "policy_support.h"

namespace eplb {
namespace {

using policy_tests::skewed_load;
using policy_tests::test_shapes;

int64_t moved(const Placement& before, const Placement& after) {
  int64_t total = 0;
  for (int changed : slots_changed(before, after)) total += changed;
  return total;
}

Placement some_current(const Topology& topology, uint64_t seed) {
  return deepseek_placement(skewed_load(topology.num_layers, topology.num_experts, seed), topology).value();
}

TEST(CostAware, ValidDeterministicAndThreadIndependent) {
  auto policy = make_policy("cost-aware").value();
  for (const Topology& topology : test_shapes()) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, seed, 1.0);
      for (const Placement& current : {default_placement(topology), some_current(topology, seed + 50)}) {
        for (double interval : {1e-3, 1.0, 600.0}) {
          SCOPED_TRACE(topology.to_string() + " seed " + std::to_string(seed) + " interval " + std::to_string(interval));
          PolicyOptions options;
          options.interval_seconds = interval;
          auto first = policy->place(load, topology, current, options);
          ASSERT_TRUE(first.is_ok()) << first.status().to_string();
          EXPECT_TRUE(first->validate_against(topology).is_ok());
          auto again = policy->place(load, topology, current, options);
          ASSERT_TRUE(again.is_ok());
          EXPECT_TRUE(*again == *first) << "not deterministic";
          options.threads = 3;
          auto threaded = policy->place(load, topology, current, options);
          ASSERT_TRUE(threaded.is_ok());
          EXPECT_TRUE(*threaded == *first) << "depends on the thread count";
        }
      }
    }
  }
}

// DeepSeek-V3's shape on 4 H100 hosts: a millisecond between rebalances pays
// for nothing; an hour pays for much; more interval never buys fewer moves
// or a worse planned balance here.
TEST(CostAware, TheIntervalSetsHowMuchMoves) {
  const Topology topology{58, 256, 288, 8, 4, 32};
  const LoadMatrix load = skewed_load(58, 256, 9, 1.0);
  const Placement current = default_placement(topology);
  auto policy = make_policy("cost-aware").value();
  int64_t last_moved = -1;
  double last_balance = 0;
  for (double interval : {1e-3, 1.0, 10.0, 3600.0}) {
    PolicyOptions options;
    options.interval_seconds = interval;
    options.threads = 2;
    auto placed = policy->place(load, topology, current, options);
    ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
    const int64_t slots = moved(current, *placed);
    const double balance = balancedness(*placed, load, topology).sum_balancedness;
    if (interval < 0.01) {
      EXPECT_EQ(slots, 0) << "a millisecond cannot pay for a migration";
    }
    EXPECT_GE(slots, last_moved) << "interval " << interval;
    EXPECT_GE(balance, last_balance - 1e-12) << "interval " << interval;
    last_moved = slots;
    last_balance = balance;
  }
  EXPECT_GT(last_moved, 0);
  EXPECT_GT(last_balance, balancedness(current, load, topology).sum_balancedness);
}

// Async swap stalls serving only for the buffer swaps: the same interval
// buys at least as much balance as with the serving paused (sync).
TEST(CostAware, AsyncSwapBuysAtLeastSyncsBalance) {
  const Topology topology{8, 64, 72, 8, 2, 8};
  const LoadMatrix load = skewed_load(8, 64, 4, 1.2);
  const Placement current = some_current(topology, 77);
  auto policy = make_policy("cost-aware").value();
  PolicyOptions sync, swap;
  sync.interval_seconds = swap.interval_seconds = 0.05;
  swap.stall_mode = "async-swap";
  auto paused = policy->place(load, topology, current, sync);
  auto swapped = policy->place(load, topology, current, swap);
  ASSERT_TRUE(paused.is_ok() && swapped.is_ok());
  EXPECT_GE(balancedness(*swapped, load, topology).sum_balancedness,
            balancedness(*paused, load, topology).sum_balancedness - 1e-12);
}

// Shapes where replicas cannot be spread over distinct ranks (a rank has
// more slots than there are experts; a hot expert wants more replicas than
// there are ranks): that candidate path is dropped, the policy still places.
TEST(CostAware, PlacesWhereReplicasCannotBeSpread) {
  auto policy = make_policy("cost-aware").value();
  for (const Topology& topology : {Topology{2, 4, 16, 1, 1, 2}, Topology{2, 8, 24, 1, 1, 3}}) {
    SCOPED_TRACE(topology.to_string());
    const LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, 3, 2.0);
    PolicyOptions options;
    options.interval_seconds = 3600;
    auto placed = policy->place(load, topology, default_placement(topology), options);
    ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
    EXPECT_TRUE(placed->validate_against(topology).is_ok());
    EXPECT_GE(balancedness(*placed, load, topology).sum_balancedness,
              balancedness(default_placement(topology), load, topology).sum_balancedness - 1e-12);
  }
}

TEST(CostAware, OptionsAreChecked) {
  const Topology topology{2, 16, 24, 4, 2, 8};
  const LoadMatrix load = skewed_load(2, 16, 1);
  auto policy = make_policy("cost-aware").value();
  auto with = [&](auto change) {
    PolicyOptions options;
    change(options);
    return policy->place(load, topology, default_placement(topology), options).status();
  };
  EXPECT_EQ(with([](PolicyOptions& o) { o.cluster = "a100"; }).code(), Code::InvalidArgument);
  EXPECT_EQ(with([](PolicyOptions& o) { o.interval_seconds = 0; }).code(), Code::InvalidArgument);
  EXPECT_EQ(with([](PolicyOptions& o) { o.bytes_per_expert = -1; }).code(), Code::InvalidArgument);
  EXPECT_EQ(with([](PolicyOptions& o) { o.stall_mode = "later"; }).code(), Code::InvalidArgument);
  EXPECT_EQ(with([](PolicyOptions& o) { o.anti_affinity = true; }).code(), Code::InvalidArgument);
  EXPECT_TRUE(with([](PolicyOptions& o) { o.cluster = "h200"; }).is_ok());
}

}  // namespace
}  // namespace eplb
