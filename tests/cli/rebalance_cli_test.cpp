// eplb rebalance end to end: the worked example through files, defaults,
// --current (one reproducible step), JSON output, thread independence, errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/cli_support.h"
#include "eplb/placement_io.h"

namespace eplb {
namespace {

using testing_support::CliRun;
using testing_support::run_eplb;
using testing_support::slurp;

class RebalanceCli : public testing_support::TempDirTest {};

nlohmann::json worked_example() {
  return nlohmann::json::parse(slurp(std::string(EPLB_SOURCE_DIR) + "/tests/data/reference/deepseek_readme_example.json"));
}

TEST_F(RebalanceCli, WorkedExampleThroughFiles) {
  auto example = worked_example();
  std::ofstream(file("load.json")) << nlohmann::json{{"load", example["load"]}}.dump();
  CliRun run = run_eplb("rebalance --load " + file("load.json") +
                            " --replicas 16 --groups 4 --nodes 2 --ranks 8 --format json --out " + file("p.json"),
                        false);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto report = nlohmann::json::parse(run.output);
  EXPECT_EQ(report["policy"], "deepseek");
  EXPECT_EQ(report["topology"]["variant"], "hierarchical");
  EXPECT_GE(report["policy_seconds"].get<double>(), 0.0);
  ASSERT_EQ(report["per_layer"].size(), 2u);
  EXPECT_GT(report["summary"]["after"]["mean_balancedness"].get<double>(),
            report["summary"]["before"]["mean_balancedness"].get<double>());

  auto written = read_placement_file(file("p.json"));
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  const Placement& placement = written->placement;
  std::vector<int32_t> phy2log, logcnt, log2phy;
  for (const auto& row : example["phy2log"])
    for (int v : row) phy2log.push_back(v);
  for (const auto& row : example["logcnt"])
    for (int v : row) logcnt.push_back(v);
  for (const auto& layer : example["log2phy"])
    for (const auto& row : layer)
      for (int v : row) log2phy.push_back(v);
  EXPECT_EQ(placement.phy2log_data(), phy2log);
  EXPECT_EQ(placement.logcnt_data(), logcnt);
  EXPECT_EQ(placement.log2phy_data(), log2phy);
  EXPECT_EQ(written->topology, (Topology{2, 12, 16, 4, 2, 8}));
}

TEST_F(RebalanceCli, DefaultsRunTheDeepSeekV3ShapeOnAGeneratedLoad) {
  CliRun run = run_eplb("rebalance");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("L=58 E=256 R=288 G=8 N=4 P=32 (hierarchical variant)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("load: generated"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("mean over layers"), std::string::npos);
  EXPECT_NE(run.output.find("sum of means / sum of maxes"), std::string::npos);
  EXPECT_NE(run.output.find("policy time"), std::string::npos);
  EXPECT_NE(run.output.find("\n   57  "), std::string::npos) << "one row per layer";
}

TEST_F(RebalanceCli, CurrentPlacementMakesOneReproducibleStep) {
  ASSERT_EQ(run_eplb("gen-load --preset deepseek-v3 --seed 1 --out " + file("a.npy")).exit_code, 0);
  ASSERT_EQ(run_eplb("gen-load --preset deepseek-v3 --seed 2 --out " + file("b.npy")).exit_code, 0);
  CliRun first = run_eplb("rebalance --load " + file("a.npy") + " --out " + file("p1.json"));
  ASSERT_EQ(first.exit_code, 0) << first.output;

  // Same load from its own output: nothing moves, balance unchanged.
  CliRun same = run_eplb("rebalance --format json --load " + file("a.npy") + " --current " + file("p1.json"), false);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  auto same_report = nlohmann::json::parse(same.output);
  EXPECT_EQ(same_report["moved"]["slots"], 0);
  EXPECT_EQ(same_report["moved"]["bytes_over_network"], 0);
  EXPECT_DOUBLE_EQ(same_report["summary"]["before"]["mean_balancedness"].get<double>(),
                   same_report["summary"]["after"]["mean_balancedness"].get<double>());

  // Another load: slots move, and the bytes are the plan's slots times the expert size.
  CliRun step = run_eplb("rebalance --format json --bytes-per-expert 1000 --load " + file("b.npy") + " --current " +
                             file("p1.json") + " --out " + file("p2.json"),
                         false);
  ASSERT_EQ(step.exit_code, 0) << step.output;
  auto moved = nlohmann::json::parse(step.output)["moved"];
  int64_t slots = moved["slots"];
  EXPECT_GT(slots, 0);
  EXPECT_EQ(moved["slots_local_copy"].get<int64_t>() + moved["slots_read_intra_node"].get<int64_t>() +
                moved["slots_read_inter_node"].get<int64_t>(),
            slots);
  EXPECT_EQ(moved["slots_kept"].get<int64_t>() + slots, moved["slots_total"].get<int64_t>());
  EXPECT_EQ(moved["bytes_over_network"].get<int64_t>(),
            1000 * (moved["slots_read_intra_node"].get<int64_t>() + moved["slots_read_inter_node"].get<int64_t>()));

  // The table names the same numbers.
  CliRun table = run_eplb("rebalance --load " + file("b.npy") + " --current " + file("p1.json"));
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("moved vs --current: " + std::to_string(slots) + " of 16704 slots"), std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("slots moved"), std::string::npos);
}

TEST_F(RebalanceCli, OutputIsTheSameForAnyThreadCount) {
  ASSERT_EQ(run_eplb("rebalance --nodes 3 --ranks 36 --threads 1 --out " + file("t1.json")).exit_code, 0);
  ASSERT_EQ(run_eplb("rebalance --nodes 3 --ranks 36 --threads 3 --out " + file("t3.json")).exit_code, 0);
  EXPECT_EQ(slurp(file("t1.json")), slurp(file("t3.json")));
  EXPECT_FALSE(slurp(file("t1.json")).empty());
}

TEST_F(RebalanceCli, BadInputGivesOneClearLineAndAnExitCode) {
  CliRun topology = run_eplb("rebalance --replicas 100");
  EXPECT_EQ(topology.exit_code, 2);
  EXPECT_NE(topology.output.find("slots R=100 must be >= experts E=256"), std::string::npos) << topology.output;
  EXPECT_EQ(std::count(topology.output.begin(), topology.output.end(), '\n'), 1) << topology.output;

  CliRun missing = run_eplb("rebalance --load " + file("nope.npy"));
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.output.find("nope.npy"), std::string::npos) << missing.output;

  ASSERT_EQ(run_eplb("rebalance --out " + file("p.json")).exit_code, 0);
  CliRun other_ranks = run_eplb("rebalance --nodes 3 --ranks 36 --current " + file("p.json"));
  EXPECT_NE(other_ranks.exit_code, 0);
  EXPECT_NE(other_ranks.output.find("32 ranks, not 36"), std::string::npos) << other_ranks.output;

  std::ofstream(file("broken.json")) << "{\"topology\": ";
  CliRun broken = run_eplb("rebalance --current " + file("broken.json"));
  EXPECT_EQ(broken.exit_code, 3) << broken.output;
  EXPECT_NE(broken.output.find("broken.json"), std::string::npos) << broken.output;

  // deepseek applies anti-affinity as post-processing; it fails only when
  // impossible (here 288 slots on a single rank for 256 experts).
  EXPECT_EQ(run_eplb("rebalance --anti-affinity").exit_code, 0);
  CliRun affinity = run_eplb("rebalance --anti-affinity --nodes 1 --ranks 1 --groups 1");
  EXPECT_EQ(affinity.exit_code, 2);
  EXPECT_NE(affinity.output.find("anti-affinity is impossible"), std::string::npos) << affinity.output;

  CliRun bad_format = run_eplb("rebalance --format xml");
  EXPECT_NE(bad_format.exit_code, 0);
  EXPECT_NE(bad_format.output.find("--format"), std::string::npos) << bad_format.output;

  CliRun unknown = run_eplb("rebalance --policy nonsense");
  EXPECT_NE(unknown.exit_code, 0);
}

}  // namespace
}  // namespace eplb
