// The fast subset of the fault matrix (bench/fault_matrix.sh, issue 6):
// `eplb run` with 4 rank processes over the default transport under
// injected transfer errors, corrupted bytes, a disconnecting peer, a rank
// killed mid-layer, ranks with different expert layouts (mpirun MPMD) and a
// malformed trace file. Every case is bounded by `timeout -s KILL` (a hang
// fails the test) and asserts the required outcome: the round completes
// through retries with every slot verified, or the survivors stop with an
// error naming the lost rank and the layer while their committed layers
// verify, or the run is refused before any byte moves with the offending
// rank / file and field named.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/cli_support.h"
#include "eplb/common.h"

namespace {

using Outcome = eplb::testing_support::BoundedRun;

using eplb::testing_support::kBinary;
// A tiny model: LAYERS layers of 16 experts in 24 slots, ROUNDS rounds.
std::string shape(int layers, int rounds, const std::string& bytes = "16KiB") {
  return " --layers " + std::to_string(layers) + " --experts 16 --replicas 24 --groups 4 --bytes-per-expert " + bytes +
         " --rounds " + std::to_string(rounds) + " --window 10";
}
const std::string kTiny = " --ranks 4 --nodes 2" + shape(3, 2);

Outcome run(const std::string& arguments, const std::string& environment = "", int limit_seconds = 60) {
  Outcome outcome = eplb::testing_support::run_bounded(arguments, environment, limit_seconds);
  // Under scripts/sanitize.sh the eplb processes are sanitizer builds too: a
  // report from any rank fails the test even when the exit code is expected.
  for (const char* report : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                             "runtime error:"})
    EXPECT_EQ(outcome.output.find(report), std::string::npos) << arguments << "\n" << outcome.output;
  return outcome;
}

std::string temp_path(const std::string& name) { return eplb::testing_support::temp_path("faults", name); }

using eplb::testing_support::contains;

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file, nullptr, false);
}

// Every survivor states its committed state, verified against its mapping.
void expect_survivors_consistent(const Outcome& outcome, int survivors) {
  EXPECT_FALSE(contains(outcome.output, "VERIFICATION FAILED")) << outcome.output;
  size_t count = 0, at = 0;
  while ((at = outcome.output.find("slots verified byte for byte against that mapping", at)) != std::string::npos) {
    ++count;
    ++at;
  }
  EXPECT_EQ(count, size_t(survivors)) << outcome.output;
}

void expect_completed_through_retries(const std::string& inject, int layers) {
  std::string json = temp_path("retried.json");
  // Enough layers and rounds that the injected faults fire (the fault
  // sequence is deterministic for a seed); asserted below.
  Outcome outcome = run(kBinary + " run --ranks 4 --nodes 2" + shape(layers, 3) + " --retries 5 --timeout 2 --inject " +
                        inject + " --json " + json);
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
  auto parsed = read_json(json);
  ASSERT_FALSE(parsed.is_discarded()) << outcome.output;
  EXPECT_EQ(parsed["all_verified"], true) << outcome.output;
  int retries = 0;
  for (const auto& round : parsed["rounds"]) {
    EXPECT_EQ(round["verified"], true);
    retries += round["retries"].get<int>();
  }
  EXPECT_GT(retries, 0) << "the injected faults never fired: " << outcome.output;
  std::remove(json.c_str());
}

TEST(FaultMatrix, TransferErrorsAreRetriedAndTheRoundCompletes) {  // scenario 1
  expect_completed_through_retries("err=0.05,seed=1", 8);
}

TEST(FaultMatrix, CorruptedBytesAreCaughtByTheChecksumAndRetried) {  // scenario 3
  expect_completed_through_retries("corrupt=0.1,seed=3", 8);
}

TEST(FaultMatrix, DisconnectingPeerStopsTheRoundCleanly) {  // scenario 5
  // Every rank's transfer backend fails from its 21st request on: mid-round.
  Outcome outcome = run(kBinary + " run --ranks 4 --nodes 2" + shape(8, 3) +
                        " --retries 2 --timeout 2 --inject disconnect_after=20");
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "peer vanished")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "kept its old placement")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "layers committed to the new placement this round")) << outcome.output;
  expect_survivors_consistent(outcome, 4);
}

TEST(FaultMatrix, KilledRankMidLayerNamesTheRankAndTheLayer) {  // scenario 6
  Outcome outcome = run(kBinary + " run" + kTiny + " --retries 2 --timeout 2", "EPLB_TEST_SIGNAL=2:1:KILL");
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_LT(outcome.seconds, 30) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "rank 2")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "migration stopped on rank")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "at layer 1")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "layer 1 kept its old placement")) << outcome.output;
  expect_survivors_consistent(outcome, 3);
}

TEST(FaultMatrix, FrozenRankMidLayerIsDetectedByTheDeadline) {  // scenario 7
  Outcome outcome = run(kBinary + " run" + kTiny + " --retries 1 --timeout 1", "EPLB_TEST_SIGNAL=2:1:STOP");
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "rank 2")) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, "layer 1")) << outcome.output;
  expect_survivors_consistent(outcome, 3);
}

TEST(FaultMatrix, DifferentExpertLayoutsAreRefusedBeforeAnythingMoves) {  // scenario 8
  if (system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not installed";
  const std::string common = " run --bootstrap mpi --nodes 2";
  const std::string mpirun =
      "mpirun --allow-run-as-root --oversubscribe -np 2 " + kBinary + common + shape(3, 1) + " : -np 2 " + kBinary + common;
  Outcome bytes = run(mpirun + shape(3, 1, "8KiB"), "", 90);
  ASSERT_FALSE(bytes.killed_by_timeout()) << "hang: " << bytes.output;
  EXPECT_NE(bytes.exit_code, 0) << bytes.output;
  EXPECT_TRUE(contains(bytes.output, "before any byte moved")) << bytes.output;
  EXPECT_TRUE(contains(bytes.output, "rank 2 has expert layout")) << bytes.output;
  Outcome layers = run(mpirun + shape(2, 1), "", 90);
  ASSERT_FALSE(layers.killed_by_timeout()) << "hang: " << layers.output;
  EXPECT_NE(layers.exit_code, 0) << layers.output;
  EXPECT_TRUE(contains(layers.output, "before any byte moved")) << layers.output;
  EXPECT_TRUE(contains(layers.output, "rank 2")) << layers.output;
}

TEST(FaultMatrix, MalformedTraceNamesTheFileBeforeAnythingMoves) {  // scenario 10
  std::string path = temp_path("bad.csv");
  {
    std::ofstream file(path);
    file << "step,layer,expert,load\n0,0,0,12\n0,0,1,not-a-number\n";
  }
  Outcome outcome = run(kBinary + " run" + kTiny + " --trace " + path);
  ASSERT_FALSE(outcome.killed_by_timeout()) << "hang: " << outcome.output;
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_TRUE(contains(outcome.output, path)) << outcome.output;
  EXPECT_FALSE(contains(outcome.output, "round 1/")) << outcome.output;  // no round started
  std::remove(path.c_str());
}

}  // namespace
