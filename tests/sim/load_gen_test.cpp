// Synthetic load traces: determinism, skew, drift, counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "eplb/sim.h"

namespace eplb {
namespace {

LoadGenOptions small_options() {
  LoadGenOptions options;
  options.num_layers = 4;
  options.num_experts = 64;
  options.num_steps = 50;
  options.seed = 7;
  return options;
}

// The `count` experts with the largest load in one step and layer (ties: lower index).
std::set<int> hot_set(const LoadTrace& trace, int step, int layer, int count) {
  std::vector<int> experts(size_t(trace.num_experts));
  std::iota(experts.begin(), experts.end(), 0);
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int a, int b) { return trace.at(step, layer, a) > trace.at(step, layer, b); });
  return std::set<int>(experts.begin(), experts.begin() + count);
}

size_t overlap(const std::set<int>& a, const std::set<int>& b) {
  size_t shared = 0;
  for (int x : a) shared += b.count(x);
  return shared;
}

TEST(LoadGen, SameOptionsSameTraceDifferentSeedDifferentTrace) {
  auto first = generate_load_trace(small_options());
  auto second = generate_load_trace(small_options());
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(first->values, second->values);
  LoadGenOptions other = small_options();
  other.seed = 8;
  auto third = generate_load_trace(other);
  ASSERT_TRUE(third.is_ok());
  EXPECT_NE(first->values, third->values);
  // Layers are independent streams: their rows differ.
  LoadMatrix step0 = first->sum(0, 1);
  std::vector<double> layer0(step0.layer(0).begin(), step0.layer(0).end());
  std::vector<double> layer1(step0.layer(1).begin(), step0.layer(1).end());
  EXPECT_NE(layer0, layer1);
}

TEST(LoadGen, PinnedOutputDoesNotChangeAcrossVersions) {
  // A few values of a fixed configuration: a change here changes every
  // generated file (and the tuned default drift): do it knowingly.
  LoadGenOptions options;
  options.num_layers = 1;
  options.num_experts = 8;
  options.num_steps = 2;
  options.seed = 42;
  auto trace = generate_load_trace(options);
  ASSERT_TRUE(trace.is_ok());
  double total = 0;
  for (double v : trace->values) total += v;
  EXPECT_NEAR(total, 2 * 32768, 2 * 32768 * 0.02);
  std::vector<double> pinned(trace->values.begin(), trace->values.end());
  std::string text;
  for (double v : pinned) text += std::to_string(int64_t(v)) + ",";
  EXPECT_EQ(text, "5970,3031,2430,4166,12005,1542,2012,1784,6048,2947,2445,4064,11876,1485,2057,1775,") << "actual: " << text;
}

TEST(LoadGen, CountsAreNonNegativeIntegersAndSumToTheTokens) {
  for (LoadDistribution distribution : {LoadDistribution::Zipf, LoadDistribution::Lognormal}) {
    LoadGenOptions options = small_options();
    options.distribution = distribution;
    options.skew = 2.0;
    auto trace = generate_load_trace(options);
    ASSERT_TRUE(trace.is_ok());
    for (double v : trace->values) {
      ASSERT_GE(v, 0);
      ASSERT_EQ(v, std::floor(v));
    }
    for (int step : {0, 49})
      for (int layer = 0; layer < 4; ++layer) {
        double total = 0;
        for (int e = 0; e < 64; ++e) total += trace->at(step, layer, e);
        EXPECT_NEAR(total, 32768, 32768 * 0.03) << step << " " << layer;
      }
  }
  LoadGenOptions tiny = small_options();
  tiny.tokens_per_step = 10;  // the exact Poisson branch
  auto sparse = generate_load_trace(tiny);
  ASSERT_TRUE(sparse.is_ok());
  double total = 0;
  for (double v : sparse->values) total += v;
  EXPECT_NEAR(total / (50 * 4), 10, 1.5);
}

TEST(LoadGen, ZipfSkewShowsInTheCounts) {
  LoadGenOptions options = small_options();
  options.num_experts = 256;
  options.num_steps = 1;
  options.drift = 0;
  auto trace = generate_load_trace(options);
  ASSERT_TRUE(trace.is_ok());
  for (int layer = 0; layer < 4; ++layer) {
    std::vector<double> counts(trace->values.begin() + layer * 256, trace->values.begin() + (layer + 1) * 256);
    std::sort(counts.rbegin(), counts.rend());
    // weight(k) = 1/k: the top expert carries ~ 1/H(256) = 16% of the tokens,
    // twice the 2nd, ten times the 10th.
    double total = std::accumulate(counts.begin(), counts.end(), 0.0);
    EXPECT_NEAR(counts[0] / total, 1.0 / 6.1243, 0.01);
    EXPECT_NEAR(counts[0] / counts[1], 2.0, 0.15);
    EXPECT_NEAR(counts[0] / counts[9], 10.0, 1.0);
  }
  options.skew = 0;  // uniform
  auto flat = generate_load_trace(options);
  ASSERT_TRUE(flat.is_ok());
  double max = *std::max_element(flat->values.begin(), flat->values.end());
  EXPECT_LT(max, 128 * 1.5);  // mean 128 per expert, Poisson noise only
}

TEST(LoadGen, LognormalSkewControlsTheSpread) {
  auto spread = [](double skew) {
    LoadGenOptions options = small_options();
    options.num_experts = 256;
    options.num_steps = 1;
    options.distribution = LoadDistribution::Lognormal;
    options.skew = skew;
    options.tokens_per_step = 1e7;
    auto trace = generate_load_trace(options);
    EXPECT_TRUE(trace.is_ok());
    // Standard deviation of log(count): ~ skew for lognormal weights.
    double sum = 0, square = 0;
    int n = 0;
    for (double v : trace->values) {
      double x = std::log(std::max(v, 1.0));
      sum += x;
      square += x * x;
      ++n;
    }
    double mean = sum / n;
    return std::sqrt(square / n - mean * mean);
  };
  EXPECT_NEAR(spread(0.5), 0.5, 0.1);
  EXPECT_NEAR(spread(1.0), 1.0, 0.15);
}

TEST(LoadGen, DriftChangesTheHotSetButNotTheSkew) {
  LoadGenOptions options = small_options();
  options.num_experts = 256;
  options.num_steps = 200;
  options.drift = 0.05;  // a strong drift (the tuned default, 0.001, keeps most of the top-8 over 200 steps)
  auto drifting = generate_load_trace(options);
  options.drift = 0;
  auto frozen = generate_load_trace(options);
  ASSERT_TRUE(drifting.is_ok());
  ASSERT_TRUE(frozen.is_ok());
  size_t drifting_overlap = 0, frozen_overlap = 0;
  for (int layer = 0; layer < 4; ++layer) {
    drifting_overlap += overlap(hot_set(*drifting, 0, layer, 8), hot_set(*drifting, 199, layer, 8));
    frozen_overlap += overlap(hot_set(*frozen, 0, layer, 4), hot_set(*frozen, 199, layer, 4));
    // Stationary skew: the hottest expert carries ~ the same share at both ends.
    double first = *std::max_element(&drifting->values[size_t(layer) * 256],
                                      &drifting->values[size_t(layer) * 256] + 256);
    size_t last_offset = (size_t(199) * 4 + size_t(layer)) * 256;
    double last = *std::max_element(&drifting->values[last_offset], &drifting->values[last_offset] + 256);
    EXPECT_NEAR(first / last, 1.0, 0.1);
  }
  EXPECT_EQ(frozen_overlap, 16u) << "without drift the top-4 experts stay the same";
  EXPECT_LE(drifting_overlap, 12u) << "with drift 0.05 most of the top-8 changes over 200 steps";
  // Adjacent steps stay highly correlated: the top-4 mostly survives one step.
  size_t adjacent = 0;
  for (int layer = 0; layer < 4; ++layer)
    adjacent += overlap(hot_set(*drifting, 100, layer, 4), hot_set(*drifting, 101, layer, 4));
  EXPECT_GE(adjacent, 12u);
}

TEST(LoadGen, TokensDoNotChangeThePopularityPath) {
  LoadGenOptions options = small_options();
  options.num_experts = 256;
  options.tokens_per_step = 1e9;
  auto a = generate_load_trace(options);
  options.tokens_per_step = 2e9;
  auto b = generate_load_trace(options);
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(b.is_ok());
  for (int step : {0, 25, 49}) EXPECT_EQ(hot_set(*a, step, 2, 3), hot_set(*b, step, 2, 3));
}

TEST(LoadGen, RejectsBadOptions) {
  auto check = [](auto change, const char* needle) {
    LoadGenOptions options = small_options();
    change(options);
    auto result = generate_load_trace(options);
    ASSERT_FALSE(result.is_ok()) << needle;
    EXPECT_EQ(result.status().code(), Code::InvalidArgument);
    EXPECT_NE(result.status().message().find(needle), std::string::npos) << result.status().message();
  };
  check([](LoadGenOptions& o) { o.num_layers = 0; }, "layers");
  check([](LoadGenOptions& o) { o.num_experts = -1; }, "experts");
  check([](LoadGenOptions& o) { o.num_steps = 0; }, "steps");
  check([](LoadGenOptions& o) { o.num_steps = 1 << 20; o.num_experts = 1 << 10; }, "2^28");
  check([](LoadGenOptions& o) { o.skew = NAN; }, "skew");
  check([](LoadGenOptions& o) { o.skew = -1; }, "skew");
  check([](LoadGenOptions& o) { o.drift = 1.5; }, "drift");
  check([](LoadGenOptions& o) { o.tokens_per_step = -5; }, "tokens");
  check([](LoadGenOptions& o) { o.tokens_per_step = INFINITY; }, "tokens");
}

TEST(LoadGen, DefaultDriftIsPlausible) {
  EXPECT_GT(default_drift(), 0.0);
  EXPECT_LT(default_drift(), 0.5);
}

}  // namespace
}  // namespace eplb
