// simulate_policy / simulate_sequence / simulate_rebalance: the replay
// priced on a cluster agrees with evaluate_policy's rows, a sequence of the
// same placements prices the same, and tokens follow the serving model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "eplb/evaluate.h"
#include "evaluate_support.h"

namespace eplb {
namespace {

using evaluate_support::kTopology;

SimulateOptions options_for(StallMode mode) {
  SimulateOptions options;
  options.cluster = cluster_preset("h100").value();
  options.bytes_per_expert = 44040192;
  options.serving.interval_seconds = 60;
  options.serving.mode = mode;
  return options;
}

TEST(Simulate, PolicyReplayMatchesEvaluateAndASequenceOfItsPlacements) {
  const LoadTrace trace = evaluate_support::drifting_trace(40, 8);
  EvaluateOptions evaluate;
  evaluate.window = 10;
  auto rows = evaluate_policy(trace, kTopology, "deepseek", evaluate);
  ASSERT_TRUE(rows.is_ok());
  std::vector<Placement> chosen;
  EvaluateOptions capturing = evaluate;
  capturing.on_rebalance = [&](const WindowResult&, const Placement&, const Placement& after, const LoadMatrix&) {
    chosen.push_back(after);
    return Status::ok();
  };
  ASSERT_TRUE(evaluate_policy(trace, kTopology, "deepseek", capturing).is_ok());
  auto simulated = simulate_policy(trace, kTopology, "deepseek", evaluate, options_for(StallMode::Sync));
  ASSERT_TRUE(simulated.is_ok()) << simulated.status().to_string();
  auto sequence = simulate_sequence(trace, kTopology, chosen, 10, options_for(StallMode::Sync));
  ASSERT_TRUE(sequence.is_ok()) << sequence.status().to_string();
  ASSERT_EQ(simulated->size(), rows->windows.size());
  ASSERT_EQ(sequence->size(), rows->windows.size());
  for (size_t i = 0; i < simulated->size(); ++i) {
    const RebalanceSimulation &a = (*simulated)[i], &b = (*sequence)[i];
    EXPECT_DOUBLE_EQ(a.window.next_window, rows->windows[i].next_window);
    EXPECT_EQ(a.window.slots_moved, rows->windows[i].slots_moved);
    EXPECT_DOUBLE_EQ(a.window.next_window, b.window.next_window);
    EXPECT_DOUBLE_EQ(a.cost.scheduled_seconds, b.cost.scheduled_seconds);
    EXPECT_DOUBLE_EQ(a.tokens, b.tokens);
    EXPECT_GE(a.cost.scheduled_seconds, a.cost.lower_bound_seconds * (1 - 1e-12));
    EXPECT_GE(a.cost.unscheduled_seconds, a.cost.lower_bound_seconds * (1 - 1e-12));
    // Sync serving pauses for the migration: tokens = (interval - migration) x rate x balance.
    const double rate = 4096 / 0.05;
    EXPECT_NEAR(a.tokens, (60 - a.cost.scheduled_seconds) * rate * a.sum_after, 1e-6 * a.tokens);
  }
}

TEST(Simulate, StallModesAndBadSequences) {
  const LoadTrace trace = evaluate_support::drifting_trace(40, 8);
  const Placement before = default_placement(kTopology);
  std::vector<int32_t> shuffled = before.phy2log_data();
  std::mt19937_64 rng(1);
  for (int l = 0; l < kTopology.num_layers; ++l)
    std::shuffle(shuffled.begin() + l * 24, shuffled.begin() + (l + 1) * 24, rng);
  const Placement after = Placement::from_phy2log(3, 16, 24, shuffled).value();
  const LoadMatrix next = trace.sum(10, 10);
  auto sync = simulate_rebalance(before, after, next, kTopology, options_for(StallMode::Sync));
  auto swap = simulate_rebalance(before, after, next, kTopology, options_for(StallMode::AsyncSwap));
  ASSERT_TRUE(sync.is_ok() && swap.is_ok());
  EXPECT_GT(sync->stall.sync, sync->stall.async_copy);
  EXPECT_GT(sync->stall.async_copy, sync->stall.async_swap);
  EXPECT_GT(swap->tokens, sync->tokens);  // swap stalls less than a paused migration
  auto too_long = simulate_sequence(trace, kTopology, {after, after, after, after}, 10, options_for(StallMode::Sync));
  EXPECT_EQ(too_long.status().code(), Code::InvalidArgument);  // the 4th has no whole next window
  Topology other = kTopology;
  other.num_slots = 32;
  auto wrong_shape = simulate_sequence(trace, other, {after}, 10, options_for(StallMode::Sync));
  EXPECT_FALSE(wrong_shape.is_ok());
}

}  // namespace
}  // namespace eplb
