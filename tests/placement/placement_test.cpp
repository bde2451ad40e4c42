#include <gtest/gtest.h>

#include <chrono>

#include "eplb/placement.h"

namespace eplb {
namespace {

TEST(Topology, ValidatesEveryRule) {
  EXPECT_TRUE((Topology{58, 256, 288, 8, 4, 32}.validate().is_ok()));
  struct Case {
    Topology topology;
    const char* needle;
  } cases[] = {
      {{0, 8, 8, 1, 1, 1}, "layers must be > 0"},
      {{1, 0, 8, 1, 1, 1}, "experts must be > 0"},
      {{1, 8, 0, 1, 1, 1}, "slots"},
      {{1, 8, 8, 0, 1, 1}, "groups must be > 0"},
      {{1, 8, 8, 1, 0, 1}, "nodes must be > 0"},
      {{1, 8, 8, 1, 1, 0}, "ranks must be > 0"},
      {{1, 8, 6, 1, 1, 1}, "must be >= experts"},
      {{1, 8, 9, 1, 1, 2}, "multiple of ranks"},
      {{1, 8, 8, 1, 3, 4}, "multiple of nodes"},
      {{1, 8, 8, 3, 1, 1}, "multiple of groups"},
  };
  for (const auto& c : cases) {
    Status status = c.topology.validate();
    EXPECT_EQ(status.code(), Code::InvalidArgument) << c.topology.to_string();
    EXPECT_NE(status.message().find(c.needle), std::string::npos) << status.message();
  }
}

TEST(Topology, PresetsAreValid) {
  for (const char* name : {"deepseek-v3", "qwen3-235b", "mixtral-8x7b", "tiny"}) {
    auto topology = topology_preset(name);
    ASSERT_TRUE(topology.is_ok()) << name;
    EXPECT_TRUE(topology->validate().is_ok()) << name;
  }
  EXPECT_EQ(topology_preset("gpt-5").status().code(), Code::InvalidArgument);
}

TEST(Placement, DefaultPlacementWrapsRedundantSlots) {
  Topology topology{2, 4, 6, 1, 1, 2};
  Placement placement = default_placement(topology);
  std::vector<int32_t> expected{0, 1, 2, 3, 0, 1};
  for (int l = 0; l < 2; ++l) {
    auto row = placement.layer_phy2log(l);
    EXPECT_EQ(std::vector<int32_t>(row.begin(), row.end()), expected);
  }
  EXPECT_EQ(placement.logcnt(0, 0), 2);
  EXPECT_EQ(placement.logcnt(0, 3), 1);
  EXPECT_EQ(placement.log2phy(0, 1, 0), 1);
  EXPECT_EQ(placement.log2phy(0, 1, 1), 5);
  EXPECT_EQ(placement.log2phy(0, 2, 1), -1);
  EXPECT_TRUE(placement.validate_against(topology).is_ok());
}

TEST(Placement, RejectsBrokenInvariants) {
  // Expert 2 missing.
  auto missing = Placement::from_phy2log(1, 3, 3, {0, 1, 1});
  EXPECT_EQ(missing.status().code(), Code::InvalidArgument);
  EXPECT_NE(missing.status().message().find("expert 2 has no replica"), std::string::npos);
  // Out-of-range expert.
  EXPECT_FALSE(Placement::from_phy2log(1, 3, 3, {0, 1, 7}).is_ok());
  // log2phy not the inverse of phy2log.
  auto not_inverse = Placement::from_arrays(1, 2, 3, 2, {0, 1, 0}, {0, 1, 1, -1}, {2, 1});
  EXPECT_FALSE(not_inverse.is_ok());
  EXPECT_NE(not_inverse.status().message().find("log2phy[0][1]"), std::string::npos);
  // logcnt disagreeing with phy2log.
  EXPECT_FALSE(Placement::from_arrays(1, 2, 3, 2, {0, 1, 0}, {0, 2, 1, -1}, {1, 2}).is_ok());
  // A good one.
  EXPECT_TRUE(Placement::from_arrays(1, 2, 3, 2, {0, 1, 0}, {2, 0, 1, -1}, {2, 1}).is_ok());
}

TEST(Metrics, RankLoadsSplitReplicasEvenly) {
  Topology topology{1, 3, 4, 1, 1, 2};
  auto placement = Placement::from_phy2log(1, 3, 4, {0, 1, 0, 2}).value();
  LoadMatrix load(1, 3);
  load.at(0, 0) = 10;
  load.at(0, 1) = 4;
  load.at(0, 2) = 2;
  auto loads = rank_loads(placement, load, topology, 0);
  EXPECT_DOUBLE_EQ(loads[0], 9);  // 10/2 + 4
  EXPECT_DOUBLE_EQ(loads[1], 7);  // 10/2 + 2
  auto summary = balancedness(placement, load, topology);
  EXPECT_DOUBLE_EQ(summary.per_layer[0], 8.0 / 9.0);
  EXPECT_DOUBLE_EQ(summary.mean_balancedness, 8.0 / 9.0);
  EXPECT_DOUBLE_EQ(summary.sum_balancedness, 8.0 / 9.0);
}

TEST(Metrics, EmptyLoadIsPerfectlyBalanced) {
  Topology topology{1, 2, 2, 1, 1, 2};
  LoadMatrix load(1, 2);
  EXPECT_DOUBLE_EQ(balancedness(default_placement(topology), load, topology).mean_balancedness, 1.0);
}

TEST(Placement, SetLayerWidensLog2phy) {
  auto narrow = Placement::from_phy2log(2, 3, 3, {0, 1, 2, 0, 1, 2}).value();
  auto wide = Placement::from_phy2log(1, 3, 3, {0, 0, 0 + 1}).status();
  EXPECT_FALSE(wide.is_ok());  // expert 2 missing
  auto source = Placement::from_phy2log(1, 2, 3, {0, 0, 1});
  ASSERT_TRUE(source.is_ok());
  EXPECT_EQ(narrow.set_layer(0, source.value(), 0).code(), Code::Mismatch);
  auto three = Placement::from_phy2log(1, 3, 4, {0, 0, 1, 2}).value();
  auto four = Placement::from_phy2log(2, 3, 4, {0, 1, 2, 2, 0, 1, 2, 2}).value();
  ASSERT_TRUE(four.set_layer(1, three, 0).is_ok());
  EXPECT_TRUE(four.validate().is_ok());
  EXPECT_EQ(four.phy2log(1, 1), 0);
  EXPECT_EQ(four.logcnt(1, 0), 2);
  EXPECT_EQ(slots_changed(four, four), std::vector<int>({0, 0}));
}

}  // namespace
}  // namespace eplb

// Issue 29 item 6: sizes beyond the documented caps are refused before any
// table is sized (they took gigabytes and seconds, then failed).
namespace eplb {
namespace {

TEST(Placement, HugeExpertCountsAreRefusedBeforeAnyTable) {
  auto start = std::chrono::steady_clock::now();
  auto huge = Placement::from_phy2log(4, 1 << 28, 8, std::vector<int32_t>(32, 0));
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), Code::InvalidArgument);
  EXPECT_NE(huge.status().message().find("at most"), std::string::npos) << huge.status().message();
  EXPECT_NE(huge.status().message().find(std::to_string(kMaxExpertsPerLayer)), std::string::npos)
      << huge.status().message();
  Topology replicas{4, 8, 1 << 26, 1, 1, 1};
  Status too_many = replicas.validate();
  EXPECT_EQ(too_many.code(), Code::InvalidArgument);
  EXPECT_NE(too_many.message().find(std::to_string(kMaxSlotsPerLayer)), std::string::npos) << too_many.message();
  Topology wide{1 << 11, 1 << 16, 1 << 16, 1, 1, 1};
  Status too_wide = wide.validate();
  EXPECT_EQ(too_wide.code(), Code::InvalidArgument);
  EXPECT_NE(too_wide.message().find(std::to_string(kMaxTableEntries)), std::string::npos) << too_wide.message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
  EXPECT_TRUE((Topology{58, 256, 288, 8, 4, 32}.validate().is_ok()));
}

}  // namespace
}  // namespace eplb
