// Property tests: random valid placements of several shapes; every plan
// must satisfy every rule that check_plan() verifies independently.
#include <gtest/gtest.h>

#include <random>

#include "eplb/plan.h"
#include "plan_check.h"

namespace eplb {
namespace {

using plan_test::check_plan;
using plan_test::dump;

struct Shape {
  const char* name;
  Topology topology;
};
void PrintTo(const Shape& shape, std::ostream* out) { *out << shape.name << " " << shape.topology.to_string(); }

// L, E, R, G, N, P
const Shape kShapes[] = {
    {"deepseek-v3", {58, 256, 288, 8, 4, 32}},
    {"tiny", {2, 12, 16, 4, 2, 8}},
    {"two-per-rank", {1, 6, 12, 1, 3, 6}},
    {"no-redundancy", {1, 16, 16, 1, 2, 4}},
    {"few-experts-many-copies", {1, 3, 24, 1, 2, 4}},   // heavy duplicates, copies after read
    {"one-node", {1, 10, 20, 1, 1, 5}},                // every read is intra-node
    {"one-rank-per-node", {1, 8, 16, 1, 4, 4}},        // every read is inter-node
    {"one-rank", {1, 4, 8, 1, 1, 1}},                  // no reads possible
    {"many-nodes", {1, 200, 260, 1, 65, 130}},         // > 64 nodes: no node bit masks
};

class PlanProperty : public ::testing::TestWithParam<Shape> {};

TEST_P(PlanProperty, RandomPlacementsSatisfyEveryRule) {
  const Topology& topology = GetParam().topology;
  const int trials = topology.num_layers > 8 ? 3 : 200;
  std::mt19937_64 rng(12345);
  int64_t reads = 0, copies_after_read = 0;
  for (int trial = 0; trial < trials; ++trial) {
    Placement old_placement = plan_test::random_placement(topology, rng);
    Placement new_placement = trial % 3 == 2 ? plan_test::perturb_placement(old_placement, 0.1, rng)
                                             : plan_test::random_placement(topology, rng);
    auto migration = plan_migration(old_placement, new_placement, topology);
    ASSERT_TRUE(migration.is_ok()) << migration.status().to_string();
    ASSERT_EQ(int(migration->layers.size()), topology.num_layers);
    PlanStats total;
    for (int l = 0; l < topology.num_layers; ++l) {
      const LayerPlan& layer = migration->layers[size_t(l)];
      EXPECT_EQ(layer.layer, l);
      std::string violation =
          check_plan(layer, old_placement.layer_phy2log(l), new_placement.layer_phy2log(l), topology);
      ASSERT_EQ(violation, "") << "trial " << trial << "\n" << dump(layer);
      total += layer.stats;
      reads += layer.stats.slots_read_intra_node + layer.stats.slots_read_inter_node;
      for (const auto& rank : layer.ranks)
        for (const auto& op : rank.slots) copies_after_read += op.copy_after_read;
    }
    EXPECT_EQ(total.slots_kept, migration->stats.slots_kept);
    EXPECT_EQ(total.slots_local_copy, migration->stats.slots_local_copy);
    EXPECT_EQ(total.slots_read_intra_node, migration->stats.slots_read_intra_node);
    EXPECT_EQ(total.slots_read_inter_node, migration->stats.slots_read_inter_node);
    EXPECT_EQ(total.requests, migration->stats.requests);
    EXPECT_EQ(total.descriptors, migration->stats.descriptors);
  }
  if (topology.num_ranks > 1) {
    EXPECT_GT(reads, 0) << "the random placements never needed a read";
  }
  if (topology.num_experts <= 4 && topology.num_ranks > 1) {
    EXPECT_GT(copies_after_read, 0);
  }
}

TEST_P(PlanProperty, DeterministicAndEqualToPlanLayer) {
  const Topology& topology = GetParam().topology;
  std::mt19937_64 rng(777);
  Placement old_placement = plan_test::random_placement(topology, rng);
  Placement new_placement = plan_test::random_placement(topology, rng);
  auto first = plan_migration(old_placement, new_placement, topology);
  auto second = plan_migration(old_placement, new_placement, topology);
  ASSERT_TRUE(first.is_ok() && second.is_ok());
  for (int l = 0; l < topology.num_layers; ++l) {
    auto single = plan_layer(old_placement.layer_phy2log(l), new_placement.layer_phy2log(l), topology, l);
    ASSERT_TRUE(single.is_ok()) << single.status().to_string();
    const std::string text = dump(first->layers[size_t(l)]);
    EXPECT_EQ(text, dump(second->layers[size_t(l)]));
    EXPECT_EQ(text, dump(*single));
  }
}

TEST_P(PlanProperty, IdenticalPlacementsKeepEverything) {
  const Topology& topology = GetParam().topology;
  std::mt19937_64 rng(99);
  Placement placement = plan_test::random_placement(topology, rng);
  auto migration = plan_migration(placement, placement, topology);
  ASSERT_TRUE(migration.is_ok());
  EXPECT_EQ(migration->stats.slots_kept, int64_t(topology.num_layers) * topology.num_slots);
  EXPECT_EQ(migration->stats.requests, 0);
  EXPECT_EQ(migration->stats.descriptors, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PlanProperty, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           std::string name = info.param.name;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// The checker itself must catch broken plans (otherwise the properties above
// would pass vacuously).
TEST(PlanChecker, RejectsCorruptedPlans) {
  const Topology topology{1, 8, 16, 1, 2, 4};
  std::mt19937_64 rng(5);
  auto old_layer = plan_test::random_layer(topology, rng);
  auto new_layer = plan_test::random_layer(topology, rng);
  auto plan = plan_layer(old_layer, new_layer, topology, 0);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_EQ(check_plan(*plan, old_layer, new_layer, topology), "");

  int corrupted = 0;
  for (int r = 0; r < topology.num_ranks; ++r) {
    for (size_t i = 0; i < plan->ranks[size_t(r)].slots.size(); ++i) {
      LayerPlan broken = *plan;  // a copy: its views point into its own storage
      SlotOp& op = broken.slot_storage[size_t(r * topology.slots_per_rank()) + i];
      ASSERT_EQ(&broken.ranks[size_t(r)].slots[i], &op);
      if (op.action == SlotAction::RemoteRead) {
        op.source_slot = (op.source_slot + 1) % topology.num_slots;  // wrong row
      } else if (op.action == SlotAction::Keep) {
        op.action = SlotAction::LocalCopy;
      } else {
        op.source_slot = -1;
      }
      EXPECT_NE(check_plan(broken, old_layer, new_layer, topology), "") << "rank " << r << " op " << i;
      ++corrupted;
    }
    if (!plan->ranks[size_t(r)].reads.empty()) {
      LayerPlan broken = *plan;
      auto& reads = broken.ranks[size_t(r)].reads;
      reads = reads.first(reads.size() - 1);
      EXPECT_NE(check_plan(broken, old_layer, new_layer, topology), "");
    }
  }
  EXPECT_EQ(corrupted, topology.num_slots);
  LayerPlan broken = *plan;
  ++broken.stats.descriptors;
  EXPECT_NE(check_plan(broken, old_layer, new_layer, topology), "");
}

}  // namespace
}  // namespace eplb
