// `eplb run`'s report files (issue 29 items 10, 11, 12): a SIGINT or SIGTERM
// to the launcher leaves the report of the rounds so far in place, marked
// interrupted, and no temporary file; --json / --metrics naming the trace or
// each other (compared as real paths), or empty, are refused with exit 2
// before any rank starts, naming both options.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../support/cli_support.h"

namespace {

using eplb::testing_support::BoundedRun;
using eplb::testing_support::run_bounded;
using eplb::testing_support::slurp;

const std::string kBinary = EPLB_BINARY_DIR "/eplb";
const std::string kSmall = " --ranks 2 --nodes 1 --layers 3 --experts 16 --replicas 24 --groups 4"
                           " --bytes-per-expert 64KiB --window 10";

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

class RunReportPaths : public eplb::testing_support::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ASSERT_EQ(run_bounded(kBinary + " gen-load --layers 3 --experts 16 --steps 40 --out " + file("t.npy"), "", 30)
                  .exit_code, 0);
  }
  // Refused with exit 2 in one line naming `words`, before any rank starts,
  // the trace untouched and nothing new in the directory.
  void expect_refused(const std::string& arguments, const std::string& words) {
    const std::string trace_before = slurp(file("t.npy"));
    const auto names_before = names_in(dir_);
    BoundedRun refused = run_bounded("sh -c 'cd " + dir_ + " && " + kBinary + " run --rounds 1" + kSmall +
                                         " --trace t.npy" + arguments + "'", "", 20);
    EXPECT_EQ(refused.exit_code, 2) << arguments << "\n" << refused.output;
    EXPECT_EQ(count_of(refused.output, "eplb: "), 1u) << arguments << "\n" << refused.output;
    EXPECT_NE(refused.output.find(words), std::string::npos) << arguments << "\n" << refused.output;
    EXPECT_EQ(refused.output.find("rank 0"), std::string::npos) << arguments << "\n" << refused.output;
    EXPECT_EQ(refused.output.find("policy"), std::string::npos) << arguments << "\n" << refused.output;  // no banner
    EXPECT_EQ(slurp(file("t.npy")), trace_before) << arguments;
    EXPECT_EQ(names_in(dir_), names_before) << arguments;
  }
  // An `eplb run --json r.json` interrupted by `signal` after some rounds.
  void expect_report_survives(const std::string& signal) {
    const std::string json = file("r.json");
    std::filesystem::remove(json);
    BoundedRun interrupted = run_bounded(
        "sh -c '" + kBinary + " run --rounds 200 --inject delay_ms=20" + kSmall + " --json " + json +
            " & pid=$!; i=0; while [ $i -lt 300 ] && ! grep -q balancedness_after " + json + ".tmp.* 2>/dev/null; do"
            " sleep 0.05; i=$((i+1)); done; kill -" + signal + " $pid; wait $pid; echo exit=$?'",
        "", 90);
    EXPECT_NE(interrupted.output.find(signal == "INT" ? "exit=130" : "exit=143"), std::string::npos)
        << interrupted.output;
    for (const auto& name : names_in(dir_)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    ASSERT_TRUE(std::filesystem::exists(json)) << interrupted.output;
    auto report = nlohmann::json::parse(slurp(json), nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << slurp(json);
    EXPECT_EQ(report["interrupted"], true) << report.dump(1);
    EXPECT_GE(report["rounds"].size(), 1u) << report.dump(1);
    EXPECT_LT(report["rounds"].size(), 200u);
    EXPECT_EQ(report["all_verified"], false);
    EXPECT_NE(report["status"].get<std::string>().find("SIG" + signal), std::string::npos) << report.dump(1);
    EXPECT_EQ(report["topology"]["ranks"], 2);
  }
};

TEST_F(RunReportPaths, InterruptedRunLeavesTheReportOfItsRounds) {
  expect_report_survives("INT");
  expect_report_survives("TERM");
}

TEST_F(RunReportPaths, OutputsNamingTheTraceOrEachOtherAreRefused) {
  expect_refused(" --json t.npy", "--json and --trace");
  expect_refused(" --metrics ./t.npy", "--metrics and --trace");
  expect_refused(" --metrics " + file("x.prom") + " --json x.prom", "--json and --metrics");
  std::filesystem::create_symlink(file("t.npy"), file("link.npy"));
  expect_refused(" --json link.npy", "--json and --trace");
  std::filesystem::create_symlink(file("m.prom"), file("dangling.prom"));
  expect_refused(" --metrics m.prom --json dangling.prom", "--json and --metrics");
}

TEST_F(RunReportPaths, EmptyOutputPathsAreRefused) {
  expect_refused(" --json ''", "--json");
  expect_refused(" --metrics ''", "--metrics");
}

}  // namespace
