// `eplb run --async` under faults, as users run it: 4 rank processes over
// UCX with injected transfer errors, stalls and corruption (retried in the
// background until the run completes, or, without retries, stopped with
// the sync path's named error), a rank SIGKILLed and a rank SIGSTOPped mid
// layer. Each case: no hang (bounded by `timeout -s KILL`), the sync path's
// exit code and message, every survivor verified on the same mapping, and
// no inconsistent read in rank 0's --json. The stopped rank is detected by
// the vote's deadline (--timeout + 10 s) and its peers no longer wait the
// old 50 s at a serving step.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "../support/cli_support.h"

namespace {

using Outcome = eplb::testing_support::BoundedRun;

const std::string kRun = EPLB_BINARY_DIR "/eplb run --async --step-ms 1 --ranks 4 --nodes 2";
std::string shape(int layers, int rounds) {
  return " --layers " + std::to_string(layers) + " --experts 16 --replicas 24 --groups 4 --bytes-per-expert 16KiB" +
         " --rounds " + std::to_string(rounds) + " --window 10";
}

struct FaultCase {
  std::string name;
  std::string environment;
  std::string arguments;
  int exit_code;        // the sync path's for the same fault
  std::string message;  // in the error the user reads
  int survivors;        // ranks that state their committed state (0: the run completed)
  double max_seconds;
};

void PrintTo(const FaultCase& fault, std::ostream* out) { *out << fault.name; }

using eplb::testing_support::contains;

// Every survivor states its state, verified, and all on the same mapping.
void expect_survivors_agree(const Outcome& outcome, int survivors) {
  EXPECT_FALSE(contains(outcome.output, "VERIFICATION FAILED")) << outcome.output;
  const std::regex state("rank (\\d): round \\d+ stopped; .* \\(mapping ([0-9a-f]{16})\\); all \\d+ slots verified "
                         "byte for byte against that mapping");
  std::set<std::string> ranks, mappings;
  for (std::sregex_iterator it(outcome.output.begin(), outcome.output.end(), state), end; it != end; ++it) {
    ranks.insert((*it)[1]);
    mappings.insert((*it)[2]);
  }
  EXPECT_EQ(ranks.size(), size_t(survivors)) << outcome.output;
  EXPECT_EQ(mappings.size(), 1u) << outcome.output;
}

// Rank 0's report: every round served with no inconsistent read.
void expect_no_inconsistent_read(const std::string& json_path, bool completed) {
  std::ifstream file(json_path);
  auto json = nlohmann::json::parse(file, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["all_verified"], completed);
  ASSERT_FALSE(json["rounds"].empty());
  int retries = 0;
  for (const auto& round : json["rounds"]) {
    EXPECT_GT(round["serving"]["steps"].get<int>(), 0);
    EXPECT_EQ(round["serving"]["inconsistent_reads"], 0);
    retries += round["retries"].get<int>();
  }
  // A completing case is one whose faults fired and were retried.
  if (completed) {
    EXPECT_GT(retries, 0) << json.dump();
  }
}

class AsyncFault : public ::testing::TestWithParam<FaultCase> {};

TEST_P(AsyncFault, EndsWithTheSyncPathsErrorAndConsistentSlots) {
  const FaultCase& fault = GetParam();
  const std::string json = ::testing::TempDir() + "/eplb_async_fault_" + std::to_string(getpid()) + ".json";
  Outcome outcome = eplb::testing_support::run_bounded(kRun + fault.arguments + " --json " + json, fault.environment,
                                                       int(fault.max_seconds) + 30);
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  for (const char* report : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                             "runtime error:"})
    EXPECT_FALSE(contains(outcome.output, report)) << outcome.output;
  EXPECT_EQ(outcome.exit_code, fault.exit_code) << outcome.output;
  EXPECT_LT(outcome.seconds, fault.max_seconds) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, fault.message)) << outcome.output;
  if (fault.survivors > 0) expect_survivors_agree(outcome, fault.survivors);
  expect_no_inconsistent_read(json, fault.survivors == 0);
  std::remove(json.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Faults, AsyncFault,
    ::testing::Values(
        FaultCase{"ErrorsRetried", "", shape(16, 4) + " --retries 5 --timeout 2 --inject err=0.01,seed=1", 0,
                  "verified byte for byte", 0, 15},
        FaultCase{"StallsRetried", "", shape(16, 4) + " --retries 5 --timeout 1 --inject stall=0.005,seed=2", 0,
                  "verified byte for byte", 0, 15},
        FaultCase{"CorruptionRetried", "", shape(16, 4) + " --retries 5 --timeout 2 --inject corrupt=0.01,seed=3",
                  0, "verified byte for byte", 0, 15},
        FaultCase{"ErrorsWithoutRetry", "", shape(3, 2) + " --retries 0 --timeout 2 --inject err=0.5,seed=1", 1,
                  "eplb: aborted: layer 0 aborted after 1 attempt(s)", 4, 15},
        FaultCase{"StallWithoutRetry", "", shape(3, 2) + " --retries 0 --timeout 1 --inject stall=0.3,seed=2", 1,
                  "still in progress at the deadline", 4, 15},
        FaultCase{"CorruptionWithoutRetry", "", shape(3, 2) + " --retries 0 --timeout 2 --inject corrupt=1", 1,
                  "checksum mismatch", 4, 15},
        FaultCase{"KilledRank", "EPLB_TEST_SIGNAL=2:1:KILL", shape(3, 2) + " --retries 2 --timeout 2", 5,
                  "rank 2 lost", 3, 15},
        // The vote's deadline (1 + 10 s) and the launcher's 5 s grace for
        // the frozen rank: ~17 s, as the sync path.
        FaultCase{"StoppedRank", "EPLB_TEST_SIGNAL=2:1:STOP", shape(3, 2) + " --retries 1 --timeout 1", 4,
                  "rank 2 has not answered", 3, 25}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return info.param.name; });

}  // namespace
