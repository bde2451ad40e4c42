// eplb simulate end to end: a trace and a policy, a trace and placements,
// one placement pair; bad arguments exit 2, bad files 3; --json complete.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "../support/cli_support.h"

namespace eplb {
namespace {

using testing_support::CliRun;
using testing_support::run_eplb;
using testing_support::slurp;

class SimulateCli : public testing_support::TempDirTest {};

const std::string kSmall = "--model deepseek-v3 --layers 4 --experts 32 --ranks 16 --ranks-per-host 4 ";

TEST_F(SimulateCli, TraceAndPolicyPrintsEveryRebalanceAndWritesJson) {
  ASSERT_EQ(run_eplb("gen-load --layers 4 --experts 32 --steps 60 --seed 3 --out " + file("t.npy")).exit_code, 0);
  CliRun run = run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy incremental --json " +
                        file("s.json") + " --quiet");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("eplb simulate: deepseek-v3 on 16 ranks (4 per host, 4 hosts)"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("simulated 2 rebalance(s)"), std::string::npos) << run.output;
  auto json = nlohmann::json::parse(slurp(file("s.json")));
  ASSERT_EQ(json["rebalances"].size(), 2u);
  for (const auto& r : json["rebalances"]) {
    EXPECT_GE(double(r["scheduled_seconds"]), double(r["lower_bound_seconds"]) * (1 - 1e-12));
    EXPECT_EQ(r["link_bytes"]["nic_in"].size(), 16u);
    EXPECT_EQ(r["link_bytes"]["host_in"].size(), 4u);
    EXPECT_EQ(r["layers"].size(), 4u);
    EXPECT_EQ(r["estimator"], "sum");  // the default
  }
  // The same inputs give the same numbers (only the wall time differs).
  ASSERT_EQ(run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy incremental --json " +
                     file("s2.json") + " --quiet").exit_code, 0);
  auto again = nlohmann::json::parse(slurp(file("s2.json")));
  for (auto* document : {&json, &again})
    for (auto& r : (*document)["rebalances"]) r.erase("policy_seconds");
  EXPECT_EQ(again["rebalances"], json["rebalances"]);
}

// --estimator auto records what it chose at every rebalance: a recent
// half-life on a drifting trace, the plain sum on one that does not drift.
TEST_F(SimulateCli, AutoEstimatorRecordsItsChoice) {
  for (const std::string drift : {"0.05", "0"}) {
    ASSERT_EQ(run_eplb("gen-load --layers 4 --experts 32 --steps 60 --seed 3 --drift " + drift + " --out " +
                       file("t.npy")).exit_code, 0);
    CliRun run = run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy deepseek --estimator auto " +
                          "--json " + file("a.json") + " --quiet");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto json = nlohmann::json::parse(slurp(file("a.json")));
    ASSERT_EQ(json["rebalances"].size(), 2u);
    for (const auto& r : json["rebalances"]) {
      const std::string chosen = r["estimator"];
      if (drift == "0")
        EXPECT_EQ(chosen, "sum");
      else
        EXPECT_EQ(chosen.rfind("ema:", 0), 0u) << chosen;
    }
    // What it recorded is what it applied: the first rebalance (from the
    // default placement) comes out the same when that estimator is named.
    const std::string first = json["rebalances"][0]["estimator"];
    ASSERT_EQ(run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy deepseek --estimator " + first +
                       " --json " + file("b.json") + " --quiet").exit_code, 0);
    const auto named = nlohmann::json::parse(slurp(file("b.json")));
    EXPECT_EQ(named["rebalances"][0]["next_window"], json["rebalances"][0]["next_window"]);
    EXPECT_EQ(named["rebalances"][0]["slots_moved"], json["rebalances"][0]["slots_moved"]);
  }
  EXPECT_EQ(run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy deepseek --estimator auto:2 " +
                     "--quiet", false).exit_code, 2);
}

TEST_F(SimulateCli, CostAwareWeighsTheSimulatedServing) {
  ASSERT_EQ(run_eplb("gen-load --layers 4 --experts 32 --steps 60 --seed 3 --out " + file("t.npy")).exit_code, 0);
  CliRun tiny = run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --policy cost-aware --interval-s 0.001 "
                         "--json " + file("tiny.json") + " --quiet");
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  const auto report = nlohmann::json::parse(slurp(file("tiny.json")));  // outlives the loop below
  for (const auto& r : report["rebalances"]) EXPECT_EQ(int(r["slots_moved"]), 0);
  // Rates as tc writes them; a host link of 0 is no limit.
  CliRun shaped = run_eplb("simulate " + kSmall + "--trace " + file("t.npy") + " --nic-rate 200mbit --host-rate 0 "
                           "--intra-rate 2GB --quiet");
  ASSERT_EQ(shaped.exit_code, 0) << shaped.output;
  EXPECT_NE(shaped.output.find("NIC 0.2 Gb/s, host link unlimited"), std::string::npos) << shaped.output;
}

TEST_F(SimulateCli, BadArgumentsAndFiles) {
  EXPECT_EQ(run_eplb("simulate --quiet", false).exit_code, 2);  // no input
  EXPECT_EQ(run_eplb("simulate --cluster a100 --before x --after y", false).exit_code, 2);
  EXPECT_EQ(run_eplb("simulate --nic-rate 400gigabits --before x --after y", false).exit_code, 2);
  EXPECT_EQ(run_eplb("simulate --ranks 12 --before x --after y", false).exit_code, 2);  // 1.5 hosts
  EXPECT_EQ(run_eplb("simulate --trace " + file("missing.npy"), false).exit_code, 3);
  ASSERT_EQ(run_eplb("gen-load --layers 4 --experts 32 --steps 60 --out " + file("t.npy")).exit_code, 0);
  // The trace's shape must be the model's.
  EXPECT_EQ(run_eplb("simulate --trace " + file("t.npy") + " --quiet", false).exit_code, 1);
}

}  // namespace
}  // namespace eplb
