// The cluster cost model: presets, serving shapes, the fluid network model
// on cases with known answers, migration costs against the lower bound,
// stalls and tokens served.
#include <gtest/gtest.h>

#include <random>

#include "../plan/plan_check.h"
#include "eplb/cluster.h"

namespace eplb {
namespace {

constexpr double kMB = 1e6;

TEST(ClusterPresets, HostsAndModels) {
  auto h100 = cluster_preset("h100");
  ASSERT_TRUE(h100.is_ok());
  EXPECT_EQ(h100->ranks_per_host, 8);
  EXPECT_DOUBLE_EQ(h100->links.nic, 50e9);
  EXPECT_DOUBLE_EQ(h100->links.intra_host, 450e9);
  EXPECT_DOUBLE_EQ(h100->links.host, 0);
  auto h200 = cluster_preset("h200");
  ASSERT_TRUE(h200.is_ok());
  EXPECT_GT(h200->copy_bytes_per_second, h100->copy_bytes_per_second);
  EXPECT_EQ(cluster_preset("a100").status().code(), Code::InvalidArgument);
  auto v3 = model_preset("deepseek-v3");
  ASSERT_TRUE(v3.is_ok());
  EXPECT_EQ(v3->layers, 58);
  EXPECT_EQ(v3->experts, 256);
  EXPECT_DOUBLE_EQ(v3->bytes_per_expert, 44040192);
  EXPECT_EQ(model_preset("kimi-k2")->experts, 384);
  EXPECT_EQ(model_preset("qwen3-235b")->experts, 128);
  EXPECT_EQ(model_preset("llama").status().code(), Code::InvalidArgument);
}

TEST(ClusterPresets, ServingShapes) {
  const ModelSpec v3 = *model_preset("deepseek-v3");
  struct Expect {
    int ranks, slots, hosts, groups;
  };
  for (const Expect& e : {Expect{32, 288, 4, 8}, Expect{64, 320, 8, 8}, Expect{144, 288, 18, 1}, Expect{320, 320, 40, 1}}) {
    auto topology = cluster_topology(v3, e.ranks, 8);
    ASSERT_TRUE(topology.is_ok()) << topology.status().to_string();
    EXPECT_EQ(topology->num_slots, e.slots) << e.ranks;
    EXPECT_EQ(topology->num_nodes, e.hosts) << e.ranks;
    EXPECT_EQ(topology->num_groups, e.groups) << e.ranks;
  }
  EXPECT_EQ(cluster_topology(v3, 12, 8).status().code(), Code::InvalidArgument);  // 1.5 hosts
  EXPECT_EQ(cluster_topology(v3, 4, 8)->num_nodes, 1);
}

// Two hosts of one rank, links of 10 MB/s: one flow of 10 MB takes 1 s.
const Topology kTwoHosts{1, 2, 2, 1, 2, 2};
const LinkBandwidths kSlow{1e12, 10 * kMB, 10 * kMB};

TEST(Fluid, OneFlowTakesItsBytesOverTheLink) {
  auto plan = plan_layer(std::vector<int32_t>{0, 1}, std::vector<int32_t>{1, 0}, kTwoHosts, 0);
  ASSERT_TRUE(plan.is_ok());
  // Both directions at once: each link carries one flow.
  EXPECT_NEAR(fluid_layer_seconds(*plan, kTwoHosts, kSlow, 10 * kMB, nullptr), 1.0, 1e-9);
}

TEST(Fluid, TwoSendersShareTheReceiversLinkAndTheScheduleMatchesIt) {
  // Three hosts of one rank, one slot each: a cycle, every link carries one flow: 1 s.
  const Topology ring{1, 3, 3, 1, 3, 3};
  auto cycle = plan_layer(std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{1, 2, 0}, ring, 0);
  ASSERT_TRUE(cycle.is_ok());
  EXPECT_NEAR(fluid_layer_seconds(*cycle, ring, kSlow, 10 * kMB, nullptr), 1.0, 1e-9);
  // Two slots per rank: rank 0 reads expert 1 from rank 1 and expert 3 from
  // rank 2 (host 0's ingress carries two), and sends expert 0 to ranks 1
  // and 2 (its egress carries two): 2 s all at once, in two rounds, and as
  // the lower bound says.
  const Topology fan{1, 4, 6, 1, 3, 3};
  auto fan_in = plan_layer(std::vector<int32_t>{0, 0, 1, 2, 3, 3}, std::vector<int32_t>{1, 3, 0, 2, 0, 3}, fan, 0);
  ASSERT_TRUE(fan_in.is_ok()) << fan_in.status().to_string();
  auto schedule = schedule_transfers(*fan_in, fan, kSlow, 10 * kMB);
  ASSERT_TRUE(schedule.is_ok());
  EXPECT_NEAR(schedule->lower_bound_seconds, 2.0, 1e-9);
  EXPECT_EQ(schedule->rounds.size(), 2u);
  EXPECT_NEAR(fluid_layer_seconds(*fan_in, fan, kSlow, 10 * kMB, nullptr), 2.0, 1e-9);
  EXPECT_NEAR(fluid_layer_seconds(*fan_in, fan, kSlow, 10 * kMB, &*schedule), 2.0, 1e-9);
  EXPECT_NEAR(schedule->makespan_seconds, 2.0, 1e-9);
}

// A receiver's rounds run one after another: with its two reads in two
// rounds from the same idle source, the second starts when the first landed.
TEST(Fluid, RoundsOfOneReceiverRunInOrder) {
  const Topology two{1, 3, 4, 1, 2, 2};
  // Rank 0 (slots 0, 1) gets experts 2 and 1... from rank 1 (slots 2, 3 hold 1, 2).
  auto plan = plan_layer(std::vector<int32_t>{0, 0, 1, 2}, std::vector<int32_t>{1, 2, 0, 2}, two, 0);
  ASSERT_TRUE(plan.is_ok());
  auto schedule = schedule_transfers(*plan, two, kSlow, 10 * kMB);
  ASSERT_TRUE(schedule.is_ok());
  EXPECT_EQ(schedule->rounds.size(), 2u);
  EXPECT_NEAR(fluid_layer_seconds(*plan, two, kSlow, 10 * kMB, &*schedule), 2.0, 1e-9);
  EXPECT_NEAR(fluid_layer_seconds(*plan, two, kSlow, 10 * kMB, nullptr), 2.0, 1e-9);
}

// On random plans the fluid model never beats the lower bound, with or
// without the schedule, and sharing stays within a small factor of it.
TEST(Fluid, NeverBelowTheLowerBoundOnRandomPlans) {
  const Topology topology{4, 24, 32, 1, 4, 8};
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    Placement a = plan_test::random_placement(topology, rng);
    Placement b = trial % 2 ? plan_test::perturb_placement(a, 0.2, rng) : plan_test::random_placement(topology, rng);
    auto migration = plan_migration(a, b, topology);
    ASSERT_TRUE(migration.is_ok());
    for (const LinkBandwidths& links : {kSlow, LinkBandwidths{50e9, 5e9, 0}}) {
      for (const LayerPlan& layer : migration->layers) {
        auto schedule = schedule_transfers(layer, topology, links, kMB);
        ASSERT_TRUE(schedule.is_ok());
        const double bound = schedule->lower_bound_seconds;
        const double at_once = fluid_layer_seconds(layer, topology, links, kMB, nullptr);
        const double rounds = fluid_layer_seconds(layer, topology, links, kMB, &*schedule);
        EXPECT_GE(at_once, bound * (1 - 1e-9));
        EXPECT_GE(rounds, bound * (1 - 1e-9));
        EXPECT_LE(at_once, 3 * bound + 1e-12);
      }
    }
  }
}

TEST(MigrationCost, V3OnH100) {
  const ClusterSpec h100 = *cluster_preset("h100");
  const ModelSpec v3 = *model_preset("deepseek-v3");
  const Topology topology = *cluster_topology(v3, 32, 8);
  std::mt19937_64 rng(3);
  Placement a = plan_test::random_placement(topology, rng);
  Placement b = plan_test::random_placement(topology, rng);
  auto cost = migration_cost(a, b, topology, h100, v3.bytes_per_expert);
  ASSERT_TRUE(cost.is_ok()) << cost.status().to_string();
  EXPECT_EQ(cost->layers_changed, 58);
  EXPECT_GT(cost->bytes_inter_host, 0);
  EXPECT_GE(cost->scheduled_seconds, cost->lower_bound_seconds * (1 - 1e-12));
  EXPECT_LE(cost->schedule_makespan_seconds, 1.10 * cost->lower_bound_seconds);
  EXPECT_NEAR(cost->loads.total_inter_host(), cost->bytes_inter_host, 1);
  auto same = migration_cost(a, a, topology, h100, v3.bytes_per_expert);
  ASSERT_TRUE(same.is_ok());
  EXPECT_EQ(same->layers_changed, 0);
  EXPECT_EQ(same->scheduled_seconds, 0);
  EXPECT_EQ(migration_cost(a, b, topology, h100, 0).status().code(), Code::InvalidArgument);
}

TEST(Serving, StallsAndTokens) {
  const ClusterSpec h100 = *cluster_preset("h100");
  MigrationCost cost;
  cost.scheduled_seconds = 2;
  cost.unscheduled_seconds = 3;
  cost.layers.push_back({0, true, 0, 0, 0, 0, h100.copy_bytes_per_second * 0.01});
  cost.layers.push_back({1, false});
  ServingStall stall = serving_stall(cost, h100, true);
  EXPECT_DOUBLE_EQ(stall.sync, 2);
  EXPECT_DOUBLE_EQ(stall.async_copy, 0.01 + h100.commit_seconds);
  EXPECT_DOUBLE_EQ(stall.async_swap, h100.commit_seconds);
  EXPECT_DOUBLE_EQ(serving_stall(cost, h100, false).sync, 3);
  ServingModel serving{0.1, 1000, 100, StallMode::Sync};
  ASSERT_TRUE(serving.validate().is_ok());
  // 10000 tokens/s at balance 1; sync: 98 s at 0.9.
  EXPECT_DOUBLE_EQ(tokens_served(serving, 0.5, 0.9, 2, 2), 98 * 10000 * 0.9);
  serving.mode = StallMode::AsyncSwap;
  EXPECT_DOUBLE_EQ(tokens_served(serving, 0.5, 0.9, 2, 0.5), 10000 * (2 * 0.5 + 97.5 * 0.9));
  EXPECT_EQ(parse_stall_mode("async-copy").value(), StallMode::AsyncCopy);
  EXPECT_EQ(parse_stall_mode("later").status().code(), Code::InvalidArgument);
  serving.interval_seconds = 0;
  EXPECT_EQ(serving.validate().code(), Code::InvalidArgument);
}

}  // namespace
}  // namespace eplb
