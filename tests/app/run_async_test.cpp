// `eplb run --async` as users run it: rank processes over UCX serving in
// lockstep while each round migrates; every serving read checked against
// the mapping in force (0 inconsistent reads), every slot verified after
// each round, the serving keys of the JSON report present; bad option
// combinations refused with the reason. Every case is bounded by `timeout`.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "../support/cli_support.h"

namespace {

using Outcome = eplb::testing_support::BoundedRun;

using eplb::testing_support::kBinary;
using eplb::testing_support::kSmallRun;

std::string async_temp_path(const std::string& name) { return eplb::testing_support::temp_path("async", name); }

void expect_stats(const nlohmann::json& stats) {
  for (const char* key : {"steps", "step_seconds_p50", "step_seconds_p99", "stall_seconds_total",
                          "stall_seconds_max", "inconsistent_reads"})
    EXPECT_TRUE(stats.contains(key)) << key << " in " << stats.dump();
  EXPECT_EQ(stats.size(), 6u) << stats.dump();
  EXPECT_GT(stats["steps"].get<int64_t>(), 0);
  EXPECT_EQ(stats["inconsistent_reads"], 0);
  EXPECT_GT(stats["step_seconds_p50"].get<double>(), 0);
}

// Every layer that changed committed at a step of the timeline, once.
void expect_timeline(const nlohmann::json& round) {
  const auto& timeline = round["serving_timeline"];
  const size_t steps = round["serving"]["steps"].get<size_t>();
  EXPECT_EQ(timeline["step_end_seconds"].size(), steps);
  EXPECT_EQ(timeline["step_seconds"].size(), steps);
  EXPECT_EQ(timeline["stall_seconds"].size(), steps);
  size_t changed = 0;
  for (const auto& layer : round["layers"]) changed += layer["changed"].get<bool>() ? 1 : 0;
  EXPECT_EQ(timeline["commits"].size(), changed) << timeline.dump();
  for (const auto& commit : timeline["commits"]) {
    EXPECT_LT(commit["step"].get<size_t>(), steps);
    EXPECT_GE(commit["seconds"].get<double>(), 0);
  }
}

// (ranks, commit mode)
class AsyncRunOverUcx : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(AsyncRunOverUcx, ServesInLockstepWithNoInconsistentRead) {
  const auto [ranks, commit] = GetParam();
  const std::string json_path = async_temp_path(std::to_string(ranks) + commit + ".json");
  Outcome outcome = eplb::testing_support::run_bounded(
      kBinary + " run --async --commit " + commit + " --step-ms 1 --serve-share 0.5 --ranks " + std::to_string(ranks) +
          " --nodes 2" + kSmallRun + " --json " + json_path,
      "", 90);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("verified byte for byte against the mapping"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("serving: "), std::string::npos) << outcome.output;
  std::ifstream file(json_path);
  auto json = nlohmann::json::parse(file, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << outcome.output;
  EXPECT_EQ(json["all_verified"], true);
  EXPECT_EQ(json["serving_options"]["commit"], commit);
  // With swap, a second copy of the 3 layers x 24/ranks slots x 64 KiB (tensor blocks page aligned).
  const uint64_t spare = json["serving_options"]["spare_bytes"].get<uint64_t>(), live = 3u * (24 / ranks) * 65536;
  if (commit == "swap") {
    EXPECT_GE(spare, live);
    EXPECT_LE(spare, live + 3 * 3 * 4096);
  } else {
    EXPECT_EQ(spare, 0u);
  }
  EXPECT_NE(outcome.output.find(commit + " commits"), std::string::npos) << outcome.output;
  expect_stats(json["serving_idle"]);
  ASSERT_EQ(json["rounds"].size(), 2u);
  for (const auto& round : json["rounds"]) {
    EXPECT_EQ(round["verified"], true);
    expect_stats(round["serving"]);
    expect_timeline(round);
  }
  std::remove(json_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(RanksAndCommits, AsyncRunOverUcx,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values("copy", "swap")));

TEST(AsyncRunOptions, BadCombinationsAreRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--commit mirror", "--commit must be copy or swap, got 'mirror'"},
      {"--step-ms 2", "--step-ms needs --async"},
      {"--serve-share 0.5", "--serve-share needs --async"},
      {"--async --commit mirror", "--commit must be copy or swap, got 'mirror'"},
      {"--async --serve-share 0", "--serve-share must be in (0, 1]"},
      {"--async --step-ms -1", "--step-ms must be in [0, 10000]"}};
  for (const auto& [arguments, reason] : cases) {
    Outcome outcome = eplb::testing_support::run_bounded(kBinary + " run --ranks 2 " + arguments, "", 30);
    EXPECT_NE(outcome.exit_code, 0) << arguments;
    EXPECT_NE(outcome.output.find(reason), std::string::npos) << arguments << ": " << outcome.output;
  }
}

TEST(AsyncRunOptions, HelpExplainsEachOption) {
  Outcome outcome = eplb::testing_support::run_bounded(kBinary + " run --help", "", 30);
  for (const char* option : {"--async", "--commit", "--step-ms", "--serve-share"})
    EXPECT_NE(outcome.output.find(option), std::string::npos) << option;
}

}  // namespace
