// evaluate_policy: replay of a drifting trace, reproducible numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "eplb/evaluate.h"
#include "evaluate_support.h"

namespace eplb {
namespace {

using evaluate_support::kTopology;

TEST(Evaluate, ReproducibleRows) {
  LoadTrace trace = evaluate_support::drifting_trace(60, 4);
  EvaluateOptions options;
  options.window = 10;
  options.bytes_per_expert = 1000;
  for (const char* name : {"deepseek", "relabel", "incremental", "balanced"}) {
    SCOPED_TRACE(name);
    auto first = evaluate_policy(trace, kTopology, name, options);
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    ASSERT_EQ(first->windows.size(), 5u);  // boundaries 10, 20, 30, 40, 50
    auto second = evaluate_policy(trace, kTopology, name, options);
    ASSERT_TRUE(second.is_ok());
    for (size_t i = 0; i < first->windows.size(); ++i) {
      const auto &a = first->windows[i], &b = second->windows[i];
      EXPECT_EQ(a.boundary, int(10 * (i + 1)));
      EXPECT_EQ(a.in_sample, b.in_sample);
      EXPECT_EQ(a.next_window, b.next_window);
      EXPECT_EQ(a.stale_next, b.stale_next);
      EXPECT_EQ(a.slots_moved, b.slots_moved);
      EXPECT_EQ(a.bytes_moved, 1000.0 * a.slots_moved);
      EXPECT_GT(a.in_sample, 0);
      EXPECT_LE(a.in_sample, 1.0);
    }
  }
}

TEST(Evaluate, RelabelMatchesDeepseekBalanceWithFewerSlots) {
  LoadTrace trace = evaluate_support::drifting_trace(60, 4);
  EvaluateOptions options;
  options.window = 10;
  auto deepseek = evaluate_policy(trace, kTopology, "deepseek", options).value();
  auto relabel = evaluate_policy(trace, kTopology, "relabel", options).value();
  for (size_t i = 0; i < deepseek.windows.size(); ++i) {
    EXPECT_NEAR(relabel.windows[i].next_window, deepseek.windows[i].next_window, 1e-12);
    EXPECT_NEAR(relabel.windows[i].in_sample, deepseek.windows[i].in_sample, 1e-12);
  }
  EXPECT_LE(relabel.mean_slots_moved(), deepseek.mean_slots_moved());
}

TEST(Evaluate, IncrementalMovesWithinItsBudget) {
  LoadTrace trace = evaluate_support::drifting_trace(60, 4);
  EvaluateOptions options;
  options.window = 10;
  options.policy.budget = 2;
  auto incremental = evaluate_policy(trace, kTopology, "incremental", options).value();
  for (const auto& window : incremental.windows) EXPECT_LE(window.slots_moved, 2 * kTopology.num_layers);
  EXPECT_GT(incremental.max_slots_moved(), 0);
}

TEST(Evaluate, EstimatorAndHistoryAreUsed) {
  LoadTrace trace = evaluate_support::drifting_trace(60, 4);
  EvaluateOptions options;
  options.window = 10;
  auto plain = evaluate_policy(trace, kTopology, "deepseek", options).value();
  options.estimator = parse_estimator("ema:2").value();
  options.history = 3;
  auto ema = evaluate_policy(trace, kTopology, "deepseek", options).value();
  bool differs = false;
  for (size_t i = 0; i < plain.windows.size(); ++i) differs |= plain.windows[i].in_sample != ema.windows[i].in_sample;
  EXPECT_TRUE(differs);
}

TEST(Evaluate, BadArguments) {
  LoadTrace trace = evaluate_support::drifting_trace(60, 4);
  EvaluateOptions options;
  options.window = 40;  // 60 steps hold only one window of 40
  EXPECT_EQ(evaluate_policy(trace, kTopology, "deepseek", options).status().code(), Code::InvalidArgument);
  options.window = 10;
  EXPECT_EQ(evaluate_policy(trace, kTopology, "nonsense", options).status().code(), Code::InvalidArgument);
  Topology other = kTopology;
  other.num_experts = 32;
  other.num_slots = 48;
  EXPECT_EQ(evaluate_policy(trace, other, "deepseek", options).status().code(), Code::Mismatch);
}

}  // namespace
}  // namespace eplb
