// Load estimators: sum, ema:H, robust:Z and their text syntax.
#include <gtest/gtest.h>

#include <cmath>

#include "eplb/estimator.h"

namespace eplb {
namespace {

// One layer, two experts; expert 0 sees 1, 2, 3, 4 over four steps and
// expert 1 a constant 5.
LoadTrace small_trace() {
  LoadTrace trace;
  trace.num_steps = 4;
  trace.num_layers = 1;
  trace.num_experts = 2;
  trace.values = {1, 5, 2, 5, 3, 5, 4, 5};
  return trace;
}

TEST(Estimator, Parse) {
  EXPECT_EQ(parse_estimator("sum")->kind, EstimatorKind::Sum);
  auto ema = parse_estimator("ema:8");
  ASSERT_TRUE(ema.is_ok());
  EXPECT_EQ(ema->kind, EstimatorKind::Ema);
  EXPECT_EQ(ema->half_life, 8);
  auto robust = parse_estimator("robust:1.5");
  ASSERT_TRUE(robust.is_ok());
  EXPECT_EQ(robust->kind, EstimatorKind::Robust);
  EXPECT_EQ(robust->z, 1.5);
  EXPECT_EQ(parse_estimator(robust->to_string())->z, 1.5);
  EXPECT_EQ(parse_estimator("ema:2.5")->to_string(), "ema:2.5");
  EXPECT_EQ(parse_estimator("auto")->kind, EstimatorKind::Auto);
  EXPECT_EQ(parse_estimator("auto")->to_string(), "auto");
  for (const char* bad : {"", "sums", "sum:1", "auto:2", "automatic", "ema", "ema:", "ema:0", "ema:-2", "ema:x",
                          "robust", "robust:nan", "robust:1e999", "median"}) {
    auto parsed = parse_estimator(bad);
    EXPECT_FALSE(parsed.is_ok()) << bad;
    EXPECT_EQ(parsed.status().code(), Code::InvalidArgument) << bad;
  }
}

TEST(Estimator, SumIsThePlainSum) {
  auto load = estimate_load(small_trace(), 1, 3, *parse_estimator("sum"));
  ASSERT_TRUE(load.is_ok());
  EXPECT_EQ(load->at(0, 0), 9);
  EXPECT_EQ(load->at(0, 1), 15);
}

TEST(Estimator, EmaWeighsRecentStepsMore) {
  auto load = estimate_load(small_trace(), 0, 4, *parse_estimator("ema:1"));
  ASSERT_TRUE(load.is_ok());
  // Weights 1/8, 1/4, 1/2, 1 (newest last), normalized to add up to 4.
  double weighted = 1 * 0.125 + 2 * 0.25 + 3 * 0.5 + 4 * 1.0, total = 1.875;
  EXPECT_NEAR(load->at(0, 0), weighted * 4 / total, 1e-12);
  EXPECT_NEAR(load->at(0, 1), 20, 1e-12);  // a constant stays what the sum says
  // A long half-life approaches the plain sum.
  auto flat = estimate_load(small_trace(), 0, 4, *parse_estimator("ema:1e9"));
  EXPECT_NEAR(flat->at(0, 0), 10, 1e-6);
}

TEST(Estimator, RobustAddsZStandardDeviations) {
  auto load = estimate_load(small_trace(), 0, 4, *parse_estimator("robust:2"));
  ASSERT_TRUE(load.is_ok());
  double mean = 2.5, deviation = std::sqrt((2.25 + 0.25 + 0.25 + 2.25) / 4);
  EXPECT_NEAR(load->at(0, 0), (mean + 2 * deviation) * 4, 1e-12);
  EXPECT_NEAR(load->at(0, 1), 20, 1e-12);
  // Negative z is floored at zero.
  auto low = estimate_load(small_trace(), 0, 4, *parse_estimator("robust:-100"));
  EXPECT_EQ(low->at(0, 0), 0);
  // z = 0 is the sum.
  EXPECT_NEAR(estimate_load(small_trace(), 0, 4, *parse_estimator("robust:0"))->at(0, 0), 10, 1e-12);
}

// One layer, one expert, the given per-step loads.
LoadTrace series(std::vector<double> values) {
  LoadTrace trace;
  trace.num_steps = int(values.size());
  trace.num_layers = 1;
  trace.num_experts = 1;
  trace.values = std::move(values);
  return trace;
}

TEST(Estimator, AutoKeepsTheSumWhenTheLoadDoesNotDrift) {
  // Constant, and noisy around a constant mean: the older half's plain sum
  // predicts the newer half exactly, and ties keep the longest memory.
  for (const LoadTrace& trace : {series({5, 5, 5, 5, 5, 5, 5, 5}), series({0, 10, 0, 10, 0, 10, 0, 10})}) {
    auto resolved = resolve_estimator(trace, 0, 8, *parse_estimator("auto"));
    ASSERT_TRUE(resolved.is_ok());
    EXPECT_EQ(resolved->to_string(), "sum");
    EXPECT_EQ(estimate_load(trace, 0, 8, *parse_estimator("auto"))->at(0, 0),
              estimate_load(trace, 0, 8, Estimator{})->at(0, 0));
  }
}

TEST(Estimator, AutoFollowsALoadThatDrifts) {
  // A ramp 1..8: the older half (1..4) predicts the newer half's mean 6.5
  // best with the shortest half-life (1 step: 3.27; the sum: 2.5).
  LoadTrace ramp = series({1, 2, 3, 4, 5, 6, 7, 8});
  auto resolved = resolve_estimator(ramp, 0, 8, *parse_estimator("auto"));
  ASSERT_TRUE(resolved.is_ok());
  EXPECT_EQ(resolved->to_string(), "ema:1");
  EXPECT_NEAR(estimate_load(ramp, 0, 8, *parse_estimator("auto"))->at(0, 0),
              estimate_load(ramp, 0, 8, *parse_estimator("ema:1"))->at(0, 0), 1e-12);
  // It sees only the steps it is given: flat steps, then a ramp after them.
  LoadTrace flat_then_ramp = series({5, 5, 5, 5, 5, 5, 5, 5, 6, 8, 10, 12, 14, 16});
  EXPECT_EQ(resolve_estimator(flat_then_ramp, 0, 8, *parse_estimator("auto"))->to_string(), "sum");
  EXPECT_EQ(resolve_estimator(flat_then_ramp, 6, 8, *parse_estimator("auto"))->to_string(), "ema:1");
}

TEST(Estimator, AutoNeedsAShorterMemoryToWinByTheMargin) {
  // Older half 0, 0, 1, 0; newer half 4 throughout. Every half-life predicts
  // the newer mean a little better than the sum (errors 0.986-0.997 of the
  // sum's), none by more than kAutoMargin (5%): the sum stays.
  LoadTrace trace = series({0, 0, 1, 0, 4, 4, 4, 4});
  EXPECT_EQ(resolve_estimator(trace, 0, 8, *parse_estimator("auto"))->to_string(), "sum");
  // Values that differ only by rounding: the sum stays too.
  LoadTrace constant = series({0.1, 0.1, 0.1, 0.1, 0.1});
  EXPECT_EQ(resolve_estimator(constant, 0, 5, *parse_estimator("auto"))->to_string(), "sum");
}

TEST(Estimator, AutoChoosesAMiddleHalfLifeWhenNoiseAndDriftMeet) {
  // The newer half's mean (4) is best predicted by a half-life between the
  // extremes: the step loads 8, 0, 8, 0 are noise around a level that rose
  // from 0 (steps 0..3) to 4 (steps 4..11). Predicted means: half-life 1
  // 2.66 (it follows the last step's noise), 2 3.16, 4 3.13, 8 2.96, 16
  // 2.83, the sum 2.67.
  LoadTrace trace = series({0, 0, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4});
  auto resolved = resolve_estimator(trace, 0, 24, *parse_estimator("auto"));
  ASSERT_TRUE(resolved.is_ok());
  EXPECT_EQ(resolved->to_string(), "ema:2");
}

TEST(Estimator, AutoOnFewerThanFourStepsIsTheSum) {
  LoadTrace ramp = series({1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(resolve_estimator(ramp, 5, 3, *parse_estimator("auto"))->to_string(), "sum");
  EXPECT_EQ(estimate_load(ramp, 5, 3, *parse_estimator("auto"))->at(0, 0), 21);
  EXPECT_FALSE(resolve_estimator(ramp, 6, 3, *parse_estimator("auto")).is_ok());  // outside the trace
  // Other estimators resolve to themselves.
  EXPECT_EQ(resolve_estimator(ramp, 0, 8, *parse_estimator("ema:3"))->to_string(), "ema:3");
}

TEST(Estimator, RejectsStepsOutsideTheTrace) {
  Estimator sum;
  EXPECT_FALSE(estimate_load(small_trace(), 2, 3, sum).is_ok());
  EXPECT_FALSE(estimate_load(small_trace(), -1, 2, sum).is_ok());
  EXPECT_FALSE(estimate_load(small_trace(), 0, 0, sum).is_ok());
  EXPECT_TRUE(estimate_load(small_trace(), 0, 4, sum).is_ok());
}

}  // namespace
}  // namespace eplb
