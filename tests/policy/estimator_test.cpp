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
  for (const char* bad : {"", "sums", "sum:1", "ema", "ema:", "ema:0", "ema:-2", "ema:x", "robust", "robust:nan",
                          "robust:1e999", "median"}) {
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

TEST(Estimator, RejectsStepsOutsideTheTrace) {
  Estimator sum;
  EXPECT_FALSE(estimate_load(small_trace(), 2, 3, sum).is_ok());
  EXPECT_FALSE(estimate_load(small_trace(), -1, 2, sum).is_ok());
  EXPECT_FALSE(estimate_load(small_trace(), 0, 0, sum).is_ok());
  EXPECT_TRUE(estimate_load(small_trace(), 0, 4, sum).is_ok());
}

}  // namespace
}  // namespace eplb
