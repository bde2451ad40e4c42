// SGLang's deepseek_vec and deepseek in torch's tie order (eplb/deepseek_vec.h):
// valid placements, determinism, the shape checks, and bad values. Agreement
// with SGLang's own code is python/tests/test_sglang_real.py.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eplb/deepseek_vec.h"
#include "eplb/placement.h"

namespace eplb {
namespace {

std::vector<double> window(int steps, int layers, int experts, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> counts(0, 999);
  std::vector<double> values(size_t(steps) * size_t(layers) * size_t(experts));
  for (double& v : values) v = counts(rng);
  return values;
}

// Every slot's expert has the slot among its log2phy entries, counts agree.
void expect_consistent(const VecArrays& a) {
  for (int l = 0; l < a.num_layers; ++l) {
    std::vector<int> seen(size_t(a.num_experts), 0);
    for (int q = 0; q < a.num_slots; ++q) ++seen[size_t(a.phy2log[size_t(l * a.num_slots + q)])];
    for (int e = 0; e < a.num_experts; ++e) {
      const int count = a.logcnt[size_t(l * a.num_experts + e)];
      EXPECT_EQ(seen[size_t(e)], count) << "layer " << l << " expert " << e;
      for (int k = 0; k < a.width; ++k) {
        const int32_t slot = a.log2phy[size_t((l * a.num_experts + e) * a.width + k)];
        if (k < count) EXPECT_EQ(a.phy2log[size_t(l * a.num_slots + slot)], e);
        else EXPECT_EQ(slot, -1);
      }
    }
  }
}

TEST(DeepSeekVec, ValidDeterministicPlacements) {
  const std::vector<double> tokens = window(4, 3, 64, 7);
  for (bool hierarchical : {false, true})
    for (auto function : {&deepseek_vec, &deepseek_torch}) {
      VecShape shape{4, 3, 64, 80, 10, 8, 4, hierarchical};
      Result<VecArrays> first = function(tokens.data(), shape, VecPrecision::Int);
      ASSERT_TRUE(first.is_ok()) << first.status().to_string();
      expect_consistent(*first);
      Result<VecArrays> again = function(tokens.data(), shape, VecPrecision::Int);
      ASSERT_TRUE(again.is_ok());
      EXPECT_EQ(first->phy2log, again->phy2log);
      EXPECT_EQ(first->log2phy, again->log2phy);
    }
}

TEST(DeepSeekVec, LogToPhyIsRedundantPlusOneWide) {
  const std::vector<double> tokens = window(2, 2, 16, 3);
  Result<VecArrays> placed = deepseek_vec(tokens.data(), VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Float64);
  ASSERT_TRUE(placed.is_ok());
  EXPECT_EQ(placed->width, 24 - 16 + 1);
}

TEST(DeepSeekVec, BadShapesAndValuesAreErrors) {
  std::vector<double> tokens = window(2, 2, 16, 3);
  // Each refusal is InvalidArgument naming what is wrong (not any error).
  auto refused = [](const Result<VecArrays>& placed, const char* piece) {
    ASSERT_FALSE(placed.is_ok()) << piece;
    EXPECT_EQ(placed.status().code(), Code::InvalidArgument) << piece;
    EXPECT_NE(placed.status().message().find(piece), std::string::npos) << placed.status().message();
  };
  refused(deepseek_vec(tokens.data(), VecShape{2, 2, 16, 12, 3, 1, 1, false}, VecPrecision::Int), "< experts");
  refused(deepseek_vec(tokens.data(), VecShape{2, 2, 16, 24, 5, 1, 1, false}, VecPrecision::Int), "not a multiple");
  refused(deepseek_vec(tokens.data(), VecShape{2, 2, 16, 24, 3, 3, 2, true}, VecPrecision::Int), "groups % nodes");
  refused(deepseek_torch(tokens.data(), VecShape{2, 2, 16, 24, 3, 4, 3, true}, VecPrecision::Int), "groups % nodes");
  refused(deepseek_vec(nullptr, VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Int), "no values");
  tokens[5] = -1;
  refused(deepseek_vec(tokens.data(), VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Int), "negative");
  tokens[5] = 0.5;
  refused(deepseek_torch(tokens.data(), VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Int), "not an integer");
  EXPECT_TRUE(deepseek_torch(tokens.data(), VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Float64).is_ok());
}

// Both variants refuse sizes above the library's caps with the same words,
// before they read a value or allocate (one token stands for the window).
TEST(DeepSeekVec, SizesAboveTheLibraryCapsAreRefusedByBoth) {
  const double token = 1;
  const int cap = kMaxExpertsPerLayer;
  struct Case {
    VecShape shape;
    std::string message;
  };
  const std::vector<Case> cases = {
      {VecShape{1, 1, cap + 1, cap + 1, 1, 1, 1, false}, "experts=1048577 above the cap, at most 1048576"},
      {VecShape{1, 1, 16, kMaxSlotsPerLayer + 16, 1, 1, 1, false},
       "num_physical_experts=1048592 above the cap, at most 1048576"},
      {VecShape{1, 65, 16, 1 << 20, 1, 1, 1, false},
       "layers x num_physical_experts = 68157440 above the cap, at most 67108864"},
  };
  for (const Case& c : cases)
    for (auto [function, name] : {std::pair{&deepseek_vec, "deepseek_vec"}, std::pair{&deepseek_torch, "deepseek (torch order)"}}) {
      Result<VecArrays> placed = function(&token, c.shape, VecPrecision::Int);
      ASSERT_FALSE(placed.is_ok()) << c.message;
      EXPECT_EQ(placed.status().code(), Code::InvalidArgument);
      EXPECT_EQ(placed.status().message(), std::string(name) + ": " + c.message);
    }
}

// The two variants' checks are one: each refusal reads the same but for the name.
TEST(DeepSeekVec, BothVariantsRefuseTheSameShapesAlike) {
  std::vector<double> tokens = window(2, 2, 16, 3);
  const std::vector<VecShape> shapes = {
      VecShape{0, 2, 16, 24, 3, 1, 1, false},  VecShape{2, 2, 16, 12, 3, 1, 1, false},
      VecShape{2, 2, 16, 24, 5, 1, 1, false},  VecShape{2, 2, 16, 24, 3, 3, 2, true},
      VecShape{2, 2, 16, 24, 3, 4, 3, true},
      VecShape{2, 2, 16, 24, 12, 4, 4, true},  // 2 ranks on 4 nodes
  };
  for (const VecShape& shape : shapes) {
    Result<VecArrays> vec = deepseek_vec(tokens.data(), shape, VecPrecision::Int);
    Result<VecArrays> torch = deepseek_torch(tokens.data(), shape, VecPrecision::Int);
    ASSERT_FALSE(vec.is_ok());
    ASSERT_FALSE(torch.is_ok());
    EXPECT_EQ(vec.status().message().substr(std::string("deepseek_vec").size()),
              torch.status().message().substr(std::string("deepseek (torch order)").size()));
  }
  tokens[3] = 9007199254740994.0;  // above 2^53: not exact as an integer count
  for (auto function : {&deepseek_vec, &deepseek_torch}) {
    Result<VecArrays> placed = function(tokens.data(), VecShape{2, 2, 16, 24, 3, 1, 1, false}, VecPrecision::Int);
    ASSERT_FALSE(placed.is_ok());
    EXPECT_NE(placed.status().message().find("token count 3 is not an integer below 2^53"), std::string::npos)
        << placed.status().message();
  }
}

}  // namespace
}  // namespace eplb
