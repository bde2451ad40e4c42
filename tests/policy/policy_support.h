// policy_support.h - shapes, loads and checks shared by the policy tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "eplb/placement.h"

namespace eplb::policy_tests {

inline nlohmann::json read_json(const std::string& name) {
  std::ifstream in(std::string(EPLB_SOURCE_DIR) + "/tests/data/reference/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// Lognormal-like skewed loads (exp of a normal), deterministic per seed.
inline LoadMatrix skewed_load(int layers, int experts, uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  LoadMatrix load(layers, experts);
  for (double& v : load.values) v = std::round(1000.0 * std::exp(sigma * normal(rng)));
  return load;
}

// The shapes the properties are checked on.
inline std::vector<Topology> test_shapes() {
  return {
      Topology{3, 16, 24, 4, 2, 8},    // hierarchical, 3 slots per rank
      Topology{2, 16, 24, 4, 1, 8},    // one node
      Topology{2, 12, 18, 3, 2, 6},    // G % N != 0: global variant
      Topology{2, 8, 8, 1, 1, 4},      // E == R
      Topology{2, 18, 27, 3, 3, 3},    // 9 slots per rank, 3 nodes
      Topology{4, 64, 72, 8, 4, 8},    // a larger one
  };
}

inline bool has_duplicate_on_a_rank(const Placement& placement, const Topology& topology) {
  const int per_rank = topology.slots_per_rank();
  for (int l = 0; l < placement.num_layers(); ++l)
    for (int r = 0; r < topology.num_ranks; ++r)
      for (int i = 0; i < per_rank; ++i)
        for (int j = 0; j < i; ++j)
          if (placement.phy2log(l, r * per_rank + i) == placement.phy2log(l, r * per_rank + j)) return true;
  return false;
}

inline std::vector<double> sorted_rank_loads(const Placement& placement, const LoadMatrix& load,
                                             const Topology& topology, int layer) {
  std::vector<double> loads = rank_loads(placement, load, topology, layer);
  std::sort(loads.begin(), loads.end());
  return loads;
}

inline double max_rank_load(const Placement& placement, const LoadMatrix& load, const Topology& topology, int layer) {
  auto loads = rank_loads(placement, load, topology, layer);
  return *std::max_element(loads.begin(), loads.end());
}

}  // namespace eplb::policy_tests
