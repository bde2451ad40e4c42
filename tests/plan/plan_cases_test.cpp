// Hand-written planner cases with exact expected plans, and input errors.
#include <gtest/gtest.h>

#include <vector>

#include "eplb/plan.h"
#include "plan_check.h"

namespace eplb {
namespace {

using plan_test::check_plan;
using plan_test::dump;

// 8 slots, 4 ranks of 2 slots, 2 nodes of 2 ranks:
//   node 0: rank 0 = slots 0,1   rank 1 = slots 2,3
//   node 1: rank 2 = slots 4,5   rank 3 = slots 6,7
const Topology kNoRedundancy{1, 8, 8, 1, 2, 4};
const Topology kRedundant{1, 4, 8, 1, 2, 4};

LayerPlan plan_ok(const std::vector<int32_t>& old_layer, const std::vector<int32_t>& new_layer,
                  const Topology& topology) {
  auto plan = plan_layer(old_layer, new_layer, topology, 0);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  if (!plan.is_ok()) return {};
  EXPECT_EQ(check_plan(*plan, old_layer, new_layer, topology), "") << dump(*plan);
  return std::move(plan).value();
}

const SlotOp& op_at(const LayerPlan& plan, const Topology& topology, int slot) {
  return plan.ranks[size_t(topology.rank_of_slot(slot))].slots[size_t(slot % topology.slots_per_rank())];
}

void expect_read(const LayerPlan& plan, const Topology& topology, int slot, int source_slot) {
  const SlotOp& op = op_at(plan, topology, slot);
  EXPECT_EQ(op.action, SlotAction::RemoteRead) << "slot " << slot << "\n" << dump(plan);
  EXPECT_EQ(op.source_slot, source_slot) << "slot " << slot << "\n" << dump(plan);
  EXPECT_EQ(op.source_rank, topology.rank_of_slot(source_slot)) << "slot " << slot;
  EXPECT_FALSE(op.copy_after_read);
}

void expect_copy(const LayerPlan& plan, const Topology& topology, int slot, int source_slot, bool after_read) {
  const SlotOp& op = op_at(plan, topology, slot);
  EXPECT_EQ(op.action, SlotAction::LocalCopy) << "slot " << slot << "\n" << dump(plan);
  EXPECT_EQ(op.source_slot, source_slot) << "slot " << slot;
  EXPECT_EQ(op.source_rank, topology.rank_of_slot(slot));
  EXPECT_EQ(op.copy_after_read, after_read) << "slot " << slot;
}

void expect_keep(const LayerPlan& plan, const Topology& topology, std::initializer_list<int> slots) {
  for (int slot : slots) EXPECT_EQ(op_at(plan, topology, slot).action, SlotAction::Keep) << "slot " << slot;
}

void expect_runs(const ReadRequest& request, int source_rank, const std::vector<ReadRun>& runs) {
  EXPECT_EQ(request.source_rank, source_rank);
  ASSERT_EQ(request.runs.size(), runs.size()) << "from rank " << source_rank;
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(request.runs[i].source_slot, runs[i].source_slot);
    EXPECT_EQ(request.runs[i].dest_slot, runs[i].dest_slot);
    EXPECT_EQ(request.runs[i].count, runs[i].count);
  }
}

TEST(PlanCases, NoChangeKeepsEverySlotWithoutRequests) {
  const std::vector<int32_t> layer{0, 1, 2, 3, 0, 1, 2, 3};
  LayerPlan plan = plan_ok(layer, layer, kRedundant);
  expect_keep(plan, kRedundant, {0, 1, 2, 3, 4, 5, 6, 7});
  for (const auto& rank : plan.ranks) EXPECT_TRUE(rank.reads.empty());
  for (const auto& slots : plan.slots_read_from) EXPECT_TRUE(slots.empty());
  EXPECT_EQ(plan.stats.slots_kept, 8);
  EXPECT_EQ(plan.stats.requests, 0);
  EXPECT_EQ(plan.stats.descriptors, 0);
}

TEST(PlanCases, SwapBetweenTwoRanksOfOneNode) {
  LayerPlan plan = plan_ok({0, 1, 2, 3, 4, 5, 6, 7}, {0, 2, 1, 3, 4, 5, 6, 7}, kNoRedundancy);
  expect_read(plan, kNoRedundancy, 1, 2);
  expect_read(plan, kNoRedundancy, 2, 1);
  expect_keep(plan, kNoRedundancy, {0, 3, 4, 5, 6, 7});
  ASSERT_EQ(plan.ranks[0].reads.size(), 1u);
  expect_runs(plan.ranks[0].reads[0], 1, {{2, 1, 1}});
  ASSERT_EQ(plan.ranks[1].reads.size(), 1u);
  expect_runs(plan.ranks[1].reads[0], 0, {{1, 2, 1}});
  EXPECT_EQ(plan.slots_read_from[0], std::vector<int>{1});
  EXPECT_EQ(plan.slots_read_from[1], std::vector<int>{2});
  EXPECT_EQ(plan.stats.slots_read_intra_node, 2);
  EXPECT_EQ(plan.stats.slots_read_inter_node, 0);
  EXPECT_EQ(plan.stats.requests, 2);
}

TEST(PlanCases, RotationAcrossAllRanks) {
  // Rank r receives the two experts of rank r + 1 (mod 4).
  LayerPlan plan = plan_ok({0, 1, 2, 3, 4, 5, 6, 7}, {2, 3, 4, 5, 6, 7, 0, 1}, kNoRedundancy);
  for (int r = 0; r < 4; ++r) {
    const int source = (r + 1) % 4;
    ASSERT_EQ(plan.ranks[size_t(r)].reads.size(), 1u) << dump(plan);
    expect_runs(plan.ranks[size_t(r)].reads[0], source, {{source * 2, r * 2, 2}});  // one merged run
    EXPECT_EQ(plan.slots_read_from[size_t(source)], (std::vector<int>{source * 2, source * 2 + 1}));
  }
  EXPECT_EQ(plan.stats.slots_read_intra_node, 4);  // ranks 0 <- 1 and 2 <- 3
  EXPECT_EQ(plan.stats.slots_read_inter_node, 4);  // ranks 1 <- 2 and 3 <- 0
  EXPECT_EQ(plan.stats.requests, 4);
  EXPECT_EQ(plan.stats.descriptors, 4);
}

TEST(PlanCases, ExpertMovedWithinOneRankIsALocalCopy) {
  LayerPlan plan = plan_ok({0, 1, 2, 3, 4, 5, 6, 7}, {1, 0, 2, 3, 4, 5, 6, 7}, kNoRedundancy);
  expect_copy(plan, kNoRedundancy, 0, 1, false);
  expect_copy(plan, kNoRedundancy, 1, 0, false);
  expect_keep(plan, kNoRedundancy, {2, 3, 4, 5, 6, 7});
  EXPECT_EQ(plan.stats.slots_local_copy, 2);
  EXPECT_EQ(plan.stats.requests, 0);
  for (const auto& slots : plan.slots_read_from) EXPECT_TRUE(slots.empty());
}

TEST(PlanCases, LocalCopyPreferredOverRead) {
  // Rank 0 swaps experts 0 and 1 within itself: two local copies. Rank 2 held
  // expert 1 twice; slot 4 becomes expert 3, read from slot 7 (rank 3, same
  // node) rather than the lower slot 3 on node 0.
  LayerPlan plan = plan_ok({0, 1, 2, 3, 1, 1, 2, 3}, {1, 0, 2, 3, 3, 1, 2, 3}, kRedundant);
  expect_copy(plan, kRedundant, 0, 1, false);
  expect_copy(plan, kRedundant, 1, 0, false);
  expect_read(plan, kRedundant, 4, 7);
  expect_keep(plan, kRedundant, {2, 3, 5, 6, 7});
  // Rank 3 held expert 3 twice; slot 6 now needs expert 2, which only rank 1
  // (node 0) holds: a cross-node read.
  LayerPlan cross = plan_ok({0, 1, 2, 3, 1, 0, 3, 3}, {0, 1, 2, 3, 1, 0, 2, 3}, kRedundant);
  expect_read(cross, kRedundant, 6, 2);
  EXPECT_EQ(cross.stats.slots_read_inter_node, 1);
  // Rank 0 needs expert 1 in both slots and held it in slot 1 only: slot 0 is
  // a local copy of old slot 1, never a read.
  LayerPlan copy = plan_ok({0, 1, 2, 3, 0, 1, 2, 3}, {1, 1, 2, 3, 0, 0, 2, 3}, kRedundant);
  expect_copy(copy, kRedundant, 0, 1, false);
  expect_keep(copy, kRedundant, {1, 2, 3, 4, 6, 7});
  expect_copy(copy, kRedundant, 5, 4, false);
  EXPECT_EQ(copy.stats.requests, 0);
}

TEST(PlanCases, ReplicaAddedIsReadOnceThenCopiedAfterRead) {
  // Expert 2 gains replicas: rank 0 needs it in both slots (once read, then
  // copied from staging); slot 2 (rank 1, same node) is preferred over slot 6.
  LayerPlan plan = plan_ok({0, 1, 2, 3, 0, 1, 2, 3}, {2, 2, 0, 3, 0, 1, 2, 1}, kRedundant);
  expect_read(plan, kRedundant, 0, 2);
  expect_copy(plan, kRedundant, 1, 0, true);
  // Rank 1: slot 2 needs 0 (not on rank 1; node 0 holds it in slot 0).
  expect_read(plan, kRedundant, 2, 0);
  // Rank 3: slot 7 needs expert 1, which is on node 1 in slot 5 (rank 2).
  expect_read(plan, kRedundant, 7, 5);
  expect_keep(plan, kRedundant, {3, 4, 5, 6});
  EXPECT_EQ(plan.stats.slots_local_copy, 1);
  EXPECT_EQ(plan.stats.slots_read_intra_node, 3);
  EXPECT_EQ(plan.slots_read_from[0], std::vector<int>{0});
  EXPECT_EQ(plan.slots_read_from[1], std::vector<int>{2});
  EXPECT_EQ(plan.slots_read_from[2], std::vector<int>{5});
  EXPECT_TRUE(plan.slots_read_from[3].empty());
}

TEST(PlanCases, ReplicaRemovedMovesOnlyTheFreedSlot) {
  // Slot 7 held the second replica of 3; that replica is removed (expert 3
  // keeps slot 3) and the freed slot becomes another replica of 0, read from
  // slot 4 on the same node. Removing the replica itself moves nothing.
  LayerPlan plan = plan_ok({0, 1, 2, 3, 0, 1, 2, 3}, {0, 1, 2, 3, 0, 1, 2, 0}, kRedundant);
  expect_keep(plan, kRedundant, {0, 1, 2, 3, 4, 5, 6});
  expect_read(plan, kRedundant, 7, 4);
  EXPECT_EQ(plan.stats.requests, 1);
  // Removing a replica in place of a copy of something already on the rank:
  // rank 2 held 0 and 1; slot 5 now holds 0 as well: local copy, no read.
  LayerPlan local = plan_ok({0, 1, 2, 3, 0, 1, 2, 3}, {0, 1, 2, 3, 0, 0, 2, 3}, kRedundant);
  expect_copy(local, kRedundant, 5, 4, false);
  EXPECT_EQ(local.stats.requests, 0);
}

TEST(PlanCases, NodeLocalSourceBeforeLowerSlotOnAnotherNode) {
  // Expert 0 lives in slot 0 (node 0) and slot 4 (node 1). Rank 3 (node 1)
  // reads it from slot 4; rank 1 (node 0) from slot 0.
  LayerPlan plan = plan_ok({0, 1, 2, 3, 0, 1, 2, 3}, {0, 1, 0, 3, 0, 1, 0, 3}, kRedundant);
  expect_read(plan, kRedundant, 2, 0);
  expect_read(plan, kRedundant, 6, 4);
  EXPECT_EQ(plan.stats.slots_read_intra_node, 2);
  EXPECT_EQ(plan.stats.slots_read_inter_node, 0);
}

TEST(PlanCases, ReceiversSpreadOverReplicasLowestSlotOnTies) {
  // Expert 0 in slots 0 (rank 0) and 2 (rank 1), both on node 0. All four
  // slots of node 1 need expert 0: rank 2 reads from slot 0 (tie -> lowest),
  // rank 3 from slot 2 (least used); the second slot of each is a copy after read.
  const Topology topology{1, 2, 8, 1, 2, 4};
  LayerPlan plan = plan_ok({0, 1, 0, 1, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 0, 0, 0}, topology);
  expect_read(plan, topology, 4, 0);
  expect_copy(plan, topology, 5, 4, true);
  expect_read(plan, topology, 6, 2);
  expect_copy(plan, topology, 7, 6, true);
  EXPECT_EQ(plan.stats.slots_read_inter_node, 2);
  EXPECT_EQ(plan.stats.slots_local_copy, 2);
}

TEST(PlanCases, CrossNodeReadsComeAfterNodeLocalOnesAndFillTheLeastUsedReplica) {
  // 3 nodes x 2 ranks x 2 slots. Expert 0 lives in slot 0 (node 0) and slot 8
  // (node 2). Rank 5 (node 2) reads it node-locally from slot 8; this is
  // chosen first although rank 5 comes last. Then ranks 2 and 3 (node 1, no
  // replica) read across nodes: rank 2 takes slot 0 (served 0 < 1), rank 3
  // ties (1, 1) and takes the lowest slot, 0.
  const Topology topology{1, 2, 12, 1, 3, 6};
  //                                   n0: r0    r1    n1: r2    r3    n2: r4    r5
  const std::vector<int32_t> old_layer{0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1};
  const std::vector<int32_t> new_layer{0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1};
  LayerPlan plan = plan_ok(old_layer, new_layer, topology);
  expect_read(plan, topology, 10, 8);
  expect_read(plan, topology, 4, 0);
  expect_read(plan, topology, 6, 0);
  EXPECT_EQ(plan.stats.slots_read_intra_node, 1);
  EXPECT_EQ(plan.stats.slots_read_inter_node, 2);
  EXPECT_EQ(plan.slots_read_from[0], std::vector<int>{0});
  EXPECT_EQ(plan.slots_read_from[4], std::vector<int>{8});
}

TEST(PlanCases, AdjacentRowsMergeIntoOneRun) {
  // Rank 2 receives experts 0,1 from rank 0 slots 0,1 in order: one run of 2.
  // Rank 3 receives 3,2 from rank 1 slots 3,2 crosswise: one request, two runs.
  // Rank 0 receives 4 from slot 4 and 5 from slot 5: one run of 2.
  // Rank 1 receives 7 and 6: crosswise again.
  LayerPlan plan = plan_ok({0, 1, 2, 3, 4, 5, 6, 7}, {4, 5, 7, 6, 0, 1, 3, 2}, kNoRedundancy);
  ASSERT_EQ(plan.ranks[0].reads.size(), 1u);
  expect_runs(plan.ranks[0].reads[0], 2, {{4, 0, 2}});
  ASSERT_EQ(plan.ranks[1].reads.size(), 1u);
  expect_runs(plan.ranks[1].reads[0], 3, {{7, 2, 1}, {6, 3, 1}});
  ASSERT_EQ(plan.ranks[2].reads.size(), 1u);
  expect_runs(plan.ranks[2].reads[0], 0, {{0, 4, 2}});
  ASSERT_EQ(plan.ranks[3].reads.size(), 1u);
  expect_runs(plan.ranks[3].reads[0], 1, {{3, 6, 1}, {2, 7, 1}});
  EXPECT_EQ(plan.ranks[0].reads[0].slots(), 2);
  EXPECT_EQ(plan.stats.requests, 4);
  EXPECT_EQ(plan.stats.descriptors, 6);
}

TEST(PlanCases, ReadsFromSeveralRanksFormOneRequestEachOrderedBySourceRank) {
  // 4 slots per rank: rank 0 needs experts from ranks 3, 1, 3 (non-adjacent rows).
  const Topology topology{1, 16, 16, 1, 2, 4};
  std::vector<int32_t> old_layer(16), new_layer(16);
  for (int s = 0; s < 16; ++s) old_layer[size_t(s)] = new_layer[size_t(s)] = s;
  // rank 0 slots 0..2 <- experts 12, 5, 14; the experts displaced go back.
  new_layer = {12, 5, 14, 3, 4, 1, 6, 7, 8, 9, 10, 11, 0, 13, 2, 15};
  LayerPlan plan = plan_ok(old_layer, new_layer, topology);
  ASSERT_EQ(plan.ranks[0].reads.size(), 2u);
  expect_runs(plan.ranks[0].reads[0], 1, {{5, 1, 1}});
  expect_runs(plan.ranks[0].reads[1], 3, {{12, 0, 1}, {14, 2, 1}});
  EXPECT_EQ(plan.slots_read_from[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.slots_read_from[3], (std::vector<int>{12, 14}));
}

TEST(PlanErrors, ShapeMismatch) {
  const std::vector<int32_t> eight{0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> seven{0, 1, 2, 3, 4, 5, 6};
  auto plan = plan_layer(eight, seven, kNoRedundancy, 3);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_EQ(plan.status().code(), Code::InvalidArgument);
  EXPECT_NE(plan.status().message().find("layer 3"), std::string::npos) << plan.status().message();
  EXPECT_NE(plan.status().message().find("new phy2log has 7"), std::string::npos) << plan.status().message();
}

TEST(PlanErrors, ExpertOutOfRange) {
  const std::vector<int32_t> good{0, 1, 2, 3, 4, 5, 6, 7};
  auto bad_new = plan_layer(good, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 8}, kNoRedundancy, 0);
  ASSERT_FALSE(bad_new.is_ok());
  EXPECT_NE(bad_new.status().message().find("new phy2log[7] = 8"), std::string::npos) << bad_new.status().message();
  auto bad_old = plan_layer(std::vector<int32_t>{0, 1, -1, 3, 4, 5, 6, 7}, good, kNoRedundancy, 0);
  ASSERT_FALSE(bad_old.is_ok());
  EXPECT_NE(bad_old.status().message().find("old phy2log[2] = -1"), std::string::npos) << bad_old.status().message();
}

TEST(PlanErrors, ExpertMissingFromOldPlacement) {
  auto plan = plan_layer(std::vector<int32_t>{0, 0, 2, 3, 4, 5, 6, 7}, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7},
                         kNoRedundancy, 5);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_EQ(plan.status().code(), Code::InvalidArgument);
  const std::string& message = plan.status().message();
  EXPECT_NE(message.find("layer 5"), std::string::npos) << message;
  EXPECT_NE(message.find("expert 1 in slot 1 (rank 0)"), std::string::npos) << message;
  EXPECT_NE(message.find("no slot of the old placement holds it"), std::string::npos) << message;
}

TEST(PlanErrors, InvalidTopologyAndPlacementShape) {
  const std::vector<int32_t> layer{0, 1, 2, 3, 4, 5, 6, 7};
  auto bad_topology = plan_layer(layer, layer, Topology{1, 8, 8, 1, 3, 4}, 0);
  ASSERT_FALSE(bad_topology.is_ok());
  EXPECT_NE(bad_topology.status().message().find("multiple of nodes"), std::string::npos);

  const Topology two_layers{2, 8, 8, 1, 2, 4};
  Placement one = default_placement(kNoRedundancy);
  Placement two = default_placement(two_layers);
  auto mismatch = plan_migration(one, two, two_layers);
  ASSERT_FALSE(mismatch.is_ok());
  EXPECT_NE(mismatch.status().message().find("old placement (layers=1"), std::string::npos)
      << mismatch.status().message();
  auto ok = plan_migration(two, two, two_layers);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->layers.size(), 2u);
  EXPECT_EQ(ok->stats.slots_kept, 16);
}

TEST(PlanErrors, MissingExpertInALaterLayerNamesTheLayer) {
  const Topology topology{3, 4, 8, 1, 2, 4};
  Placement old_placement =
      Placement::from_phy2log(3, 4, 8, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3})
          .value();
  // An empty placement (all -1) stands in for a corrupt one.
  Placement empty(3, 4, 8, 1);
  auto plan = plan_migration(old_placement, empty, topology);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("plan layer 0: new phy2log[0] = -1"), std::string::npos)
      << plan.status().message();
}

}  // namespace
}  // namespace eplb
