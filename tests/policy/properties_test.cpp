// Properties every policy must have, on many shapes and loads: a valid
// placement of the topology, every expert present, determinism, the same
// output for any thread count, anti-affinity when asked, the incremental
// budget, and min_gain hysteresis.
#include <gtest/gtest.h>

#include "eplb/policy.h"
#include "policy_support.h"

namespace eplb {
namespace {

using policy_tests::has_duplicate_on_a_rank;
using policy_tests::skewed_load;
using policy_tests::test_shapes;

const char* const kPolicies[] = {"deepseek", "relabel", "incremental", "balanced"};

// A placement in force that is not the default: deepseek's for another load.
Placement some_current(const Topology& topology, uint64_t seed) {
  return deepseek_placement(skewed_load(topology.num_layers, topology.num_experts, seed), topology).value();
}

TEST(PolicyProperties, ValidDeterministicAndThreadIndependent) {
  for (const Topology& topology : test_shapes()) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, seed, 0.5 + 0.5 * seed);
      for (const Placement& current : {default_placement(topology), some_current(topology, seed + 100)}) {
        for (const char* name : kPolicies) {
          SCOPED_TRACE(std::string(name) + " on " + topology.to_string() + " seed " + std::to_string(seed));
          auto policy = make_policy(name).value();
          PolicyOptions options;
          auto first = policy->place(load, topology, current, options);
          ASSERT_TRUE(first.is_ok()) << first.status().to_string();
          EXPECT_TRUE(first->validate_against(topology).is_ok()) << first->validate_against(topology).to_string();
          for (int l = 0; l < topology.num_layers; ++l)
            for (int e = 0; e < topology.num_experts; ++e) EXPECT_GE(first->logcnt(l, e), 1);
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

TEST(PolicyProperties, AntiAffinityWhenAsked) {
  for (const Topology& topology : test_shapes()) {
    LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, 7, 1.5);
    Placement current = some_current(topology, 8);
    for (const char* name : kPolicies) {
      SCOPED_TRACE(std::string(name) + " on " + topology.to_string());
      auto policy = make_policy(name).value();
      PolicyOptions options;
      options.anti_affinity = true;
      options.budget = topology.num_slots;  // incremental: enough budget for any repair
      auto placed = policy->place(load, topology, current, options);
      // deepseek and relabel keep deepseek's replica counts: with more
      // replicas of an expert than ranks, anti-affinity is impossible for them.
      const auto counts = deepseek_placement(load, topology).value().logcnt_data();
      const bool keeps_counts = std::string(name) == "deepseek" || std::string(name) == "relabel";
      if (keeps_counts && *std::max_element(counts.begin(), counts.end()) > topology.num_ranks) {
        EXPECT_EQ(placed.status().code(), Code::InvalidArgument);
        continue;
      }
      ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
      EXPECT_TRUE(placed->validate_against(topology).is_ok());
      EXPECT_FALSE(has_duplicate_on_a_rank(*placed, topology));
    }
  }
}

TEST(PolicyProperties, AntiAffinityImpossibleIsAnError) {
  // One rank, more slots than experts: some expert needs two replicas on it.
  Topology topology{1, 4, 6, 1, 1, 1};
  LoadMatrix load = skewed_load(1, 4, 3);
  for (const char* name : kPolicies) {
    PolicyOptions options;
    options.anti_affinity = true;
    auto placed = make_policy(name).value()->place(load, topology, default_placement(topology), options);
    EXPECT_FALSE(placed.is_ok()) << name;
    EXPECT_EQ(placed.status().code(), Code::InvalidArgument) << name;
    EXPECT_NE(placed.status().message().find("anti-affinity"), std::string::npos) << placed.status().message();
  }
}

TEST(PolicyProperties, IncrementalRespectsTheBudget) {
  auto policy = make_policy("incremental").value();
  for (const Topology& topology : test_shapes()) {
    LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, 11, 1.5);
    Placement current = some_current(topology, 12);
    for (double budget : {0.0, 1.0, 3.0, 0.1, 0.25, 0.5}) {
      SCOPED_TRACE(topology.to_string() + " budget " + std::to_string(budget));
      PolicyOptions options;
      options.budget = budget;
      auto placed = policy->place(load, topology, current, options);
      ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
      int allowed = budget < 1 ? int(std::floor(budget * topology.num_slots + 1e-9)) : int(budget);
      for (int changed : slots_changed(current, *placed)) EXPECT_LE(changed, allowed);
      if (allowed == 0) {
        EXPECT_EQ(placed->phy2log_data(), current.phy2log_data());
      }
    }
  }
}

TEST(PolicyProperties, IncrementalRejectsABadBudget) {
  Topology topology{1, 8, 16, 1, 1, 8};
  PolicyOptions options;
  options.budget = -1;
  auto placed = make_policy("incremental").value()->place(skewed_load(1, 8, 1), topology,
                                                            default_placement(topology), options);
  EXPECT_EQ(placed.status().code(), Code::InvalidArgument);
}

TEST(PolicyProperties, CurrentPlacementOfAnotherShapeIsRejected) {
  Topology topology{2, 8, 16, 1, 1, 8};
  Topology other{2, 8, 24, 1, 1, 8};
  for (const char* name : {"relabel", "incremental"}) {
    auto placed = make_policy(name).value()->place(skewed_load(2, 8, 1), topology, default_placement(other),
                                                   PolicyOptions{});
    EXPECT_FALSE(placed.is_ok()) << name;
  }
}

// Layer 0: loads for which the default placement is already perfect, so no
// policy can gain anything; layer 1: one very hot expert, a large gain.
TEST(PolicyProperties, MinGainKeepsLayersThatWouldGainTooLittle) {
  Topology topology{2, 8, 16, 1, 1, 8};
  LoadMatrix load(2, 8);
  for (int e = 0; e < 8; ++e) {
    load.at(0, e) = 10;
    load.at(1, e) = e == 5 ? 1000 : 10;
  }
  Placement current = default_placement(topology);
  for (const char* name : kPolicies) {
    SCOPED_TRACE(name);
    auto policy = make_policy(name).value();
    PolicyOptions options;
    options.min_gain = 0.05;
    auto placed = policy->place(load, topology, current, options);
    ASSERT_TRUE(placed.is_ok()) << placed.status().to_string();
    auto kept = placed->layer_phy2log(0), before = current.layer_phy2log(0);
    EXPECT_TRUE(std::equal(kept.begin(), kept.end(), before.begin())) << "layer 0 should be kept";
    auto after = balancedness(*placed, load, topology), old = balancedness(current, load, topology);
    EXPECT_GE(after.per_layer[1] - old.per_layer[1], 0.05) << "layer 1 should be rebalanced";
    // A min_gain larger than any possible gain keeps everything.
    options.min_gain = 2.0;
    auto all_kept = policy->place(load, topology, current, options);
    ASSERT_TRUE(all_kept.is_ok());
    EXPECT_EQ(all_kept->phy2log_data(), current.phy2log_data());
  }
}

TEST(PolicyProperties, DefaultOptionsLeaveDeepseekExact) {
  for (const Topology& topology : test_shapes()) {
    LoadMatrix load = skewed_load(topology.num_layers, topology.num_experts, 21);
    auto placed = make_policy("deepseek").value()->place(load, topology, default_placement(topology), PolicyOptions{});
    ASSERT_TRUE(placed.is_ok());
    EXPECT_TRUE(*placed == deepseek_placement(load, topology).value());
  }
}

}  // namespace
}  // namespace eplb
