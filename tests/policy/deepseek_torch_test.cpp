// Cross-check of the `deepseek` policy against a PyTorch port of the
// published algorithm (bench/deepseek_reference.py), run by the project's
// Python environment (.venv, scripts/setup_python.sh; EPLB_PYTHON overrides).
// Fails when that interpreter cannot import torch: scripts/setup.sh makes it.
// One Python process computes every case (one torch import, a few seconds).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "deepseek_support.h"
#include "eplb/policy.h"

namespace eplb {
namespace {

std::string python() {
  const char* custom = std::getenv("EPLB_PYTHON");
  return custom ? custom : EPLB_SOURCE_DIR "/.venv/bin/python";
}

bool torch_available() {
  std::string command = python() + " -c 'import torch' >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

struct Case {
  Topology topology;
  LoadMatrix load;
};

nlohmann::json load_json(const LoadMatrix& load) {
  nlohmann::json rows = nlohmann::json::array();
  for (int l = 0; l < load.num_layers; ++l) {
    auto row = load.layer(l);
    rows.push_back(std::vector<double>(row.begin(), row.end()));
  }
  return rows;
}

TEST(DeepSeekTorch, MatchesThePyTorchPortExactly) {
  ASSERT_TRUE(torch_available()) << python() << " cannot import torch (bash scripts/setup_python.sh makes .venv)";

  std::vector<Case> cases;
  std::mt19937_64 rng(2024);
  // The three benchmark shapes (fewer layers to keep the test fast).
  for (Topology topology : {Topology{12, 256, 288, 8, 4, 32}, Topology{12, 256, 288, 8, 1, 32},
                            Topology{12, 256, 288, 8, 3, 36}})
    cases.push_back({topology, testing_support::zipf_load(topology.num_layers, topology.num_experts, rng())});
  // Small shapes with many ties, both variants.
  const Topology small[] = {{4, 12, 16, 4, 2, 8},  {4, 24, 27, 3, 3, 3}, {4, 24, 27, 4, 3, 3},
                            {4, 16, 16, 4, 2, 8},  {4, 6, 10, 2, 1, 1},  {4, 20, 54, 4, 3, 6},
                            {4, 32, 32, 8, 4, 32}, {4, 48, 64, 6, 2, 8}};
  for (const Topology& topology : small)
    for (auto kind : {testing_support::LoadKind::SmallIntegers, testing_support::LoadKind::Integers,
                      testing_support::LoadKind::Zero})
      cases.push_back({topology, testing_support::random_load(topology.num_layers, topology.num_experts, kind, rng)});

  nlohmann::json input = nlohmann::json::array();
  for (const Case& c : cases)
    input.push_back({{"load", load_json(c.load)},
                     {"replicas", c.topology.num_slots},
                     {"groups", c.topology.num_groups},
                     {"nodes", c.topology.num_nodes},
                     {"ranks", c.topology.num_ranks}});
  const std::string dir = ::testing::TempDir();
  const std::string in_path = dir + "/eplb_deepseek_torch_cases.json";
  const std::string out_path = dir + "/eplb_deepseek_torch_results.json";
  std::ofstream(in_path) << input.dump();
  std::string command = python() + " " + std::string(EPLB_SOURCE_DIR) + "/bench/deepseek_reference.py cases " +
                        in_path + " --out " + out_path;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto results = testing_support::read_json(out_path);
  ASSERT_EQ(results.size(), cases.size());

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto placement = deepseek_placement(c.load, c.topology, 2);
    ASSERT_TRUE(placement.is_ok()) << placement.status().to_string();
    std::vector<int32_t> phy2log, log2phy, logcnt;
    for (const auto& row : results[i]["phy2log"])
      for (const auto& v : row) phy2log.push_back(v.get<int32_t>());
    for (const auto& row : results[i]["logcnt"])
      for (const auto& v : row) logcnt.push_back(v.get<int32_t>());
    for (const auto& layer : results[i]["log2phy"])
      for (const auto& row : layer)
        for (const auto& v : row) log2phy.push_back(v.get<int32_t>());
    EXPECT_EQ(placement->phy2log_data(), phy2log) << "case " << i << " " << c.topology.to_string();
    EXPECT_EQ(placement->logcnt_data(), logcnt) << "case " << i << " " << c.topology.to_string();
    EXPECT_EQ(placement->max_replicas(), int(results[i]["log2phy"][0][0].size())) << "case " << i;
    EXPECT_EQ(placement->log2phy_data(), log2phy) << "case " << i << " " << c.topology.to_string();
  }
  std::filesystem::remove(in_path);
  std::filesystem::remove(out_path);
}

}  // namespace
}  // namespace eplb
