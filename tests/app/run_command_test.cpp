// `eplb run` as users run it: the built binary, as separate rank processes
// over UCX (shared memory and TCP), under mpirun, with injected faults and a
// rank killed mid-migration. Every case is bounded by `timeout`.
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
using eplb::testing_support::kSmallRun;

Outcome run(const std::string& arguments, const std::string& environment = "", int limit_seconds = 90) {
  Outcome outcome = eplb::testing_support::run_bounded(arguments, environment, limit_seconds);
  return outcome;
}

std::string run_temp_path(const std::string& name) { return eplb::testing_support::temp_path("run", name); }

bool mpirun_installed() { return system("command -v mpirun >/dev/null 2>&1") == 0; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file, nullptr, false);
}

// Retries over every round of an `eplb run --json` report.
int total_retries(const nlohmann::json& report) {
  int retries = 0;
  for (const auto& round : report["rounds"]) retries += round["retries"].get<int>();
  return retries;
}

void expect_all_verified(const Outcome& outcome, const std::string& json_path, int rounds) {
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("verified byte for byte against the mapping"), std::string::npos) << outcome.output;
  auto json = read_json(json_path);
  ASSERT_FALSE(json.is_discarded()) << outcome.output;
  EXPECT_EQ(json["all_verified"], true);
  ASSERT_EQ(json["rounds"].size(), size_t(rounds));
  for (const auto& round : json["rounds"]) {
    EXPECT_EQ(round["verified"], true);
    EXPECT_GT(round["bytes_moved"].get<uint64_t>(), 0u);
  }
}

class RunOverUcx : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(RunOverUcx, EveryRoundVerifiesOnEveryRank) {
  auto [ranks, transport] = GetParam();
  std::string json = run_temp_path("ucx_" + std::to_string(ranks) + transport + ".json");
  Outcome outcome = run(kBinary + " run --ranks " + std::to_string(ranks) + " --nodes 2 --transport " + transport +
                        kSmallRun + " --json " + json);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_EQ(parsed["topology"]["ranks"], ranks);
  EXPECT_EQ(parsed["transport"], transport);
  std::remove(json.c_str());
}

INSTANTIATE_TEST_SUITE_P(RanksAndTransports, RunOverUcx,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values("shm", "tcp")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

TEST(RunCommand, LoopbackThreadsWithTensorsAndPolicy) {
  std::string json = run_temp_path("loopback.json");
  Outcome outcome = run(kBinary + " run --transport loopback --ranks 4 --policy deepseek --tensors "
                                  "w1:40KiB,w2:20000,scale:256" + kSmallRun + " --json " + json);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  ASSERT_EQ(parsed["tensors"].size(), 3u);
  EXPECT_EQ(parsed["tensors"][1]["bytes"], 20000);
  std::remove(json.c_str());
}

// --commit swap without --async: READs land in the spare buffer, the commit
// swaps buffers; corrupted READs are caught and retried into the spare, so
// every rank's live rows stay whole (old or new) and verify after each round.
// Then the same over UCX shared memory.
TEST(RunCommand, SyncSwapCommitVerifiesWithCorruptionRetried) {
  std::string json = run_temp_path("sync_swap.json");
  Outcome outcome = run(kBinary + " run --ranks 4 --transport loopback --commit swap --retries 10 "
                                  "--inject corrupt=0.3,seed=4" + kSmallRun + " --json " + json);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_GT(total_retries(parsed), 0) << outcome.output;
  EXPECT_NE(outcome.output.find("of spare buffers per rank (--commit swap)"), std::string::npos) << outcome.output;
  EXPECT_EQ(parsed["commit"], "swap");
  EXPECT_GT(parsed["spare_bytes"].get<uint64_t>(), 0u);
  std::remove(json.c_str());
  // Over UCX shared memory, peers read whichever buffer a rank published live.
  Outcome over_shm = run(kBinary + " run --ranks 2 --nodes 2 --transport shm --commit swap" + kSmallRun + " --json " + json);
  expect_all_verified(over_shm, json, 2);
  std::remove(json.c_str());
}

// [issue 31] --transfer-schedule hosts-fenced over UCX shared memory on 2
// emulated hosts: every round verifies, and the report names the setting.
// Then with stalled READs: a stalled rank reaches its fence at the transfer
// deadline, the fence waits a collective's deadline, so the attempt is
// voted down and retried (with the transfer deadline as the fence's, the
// local group's fence timed out and the round was lost: "rank 1 sent
// allgather #17 while rank 0 is in vote #18").
TEST(RunCommand, FencedTransferScheduleVerifiesEveryRound) {
  std::string json = run_temp_path("fenced_schedule.json");
  Outcome outcome = run(kBinary + " run --ranks 4 --nodes 2 --transport shm --transfer-schedule hosts-fenced" +
                        kSmallRun + " --json " + json);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_EQ(parsed["transfer_schedule"], "hosts-fenced");
  std::remove(json.c_str());
  Outcome stalled = run(kBinary + " run --ranks 4 --nodes 2 --transport shm --transfer-schedule hosts-fenced "
                                  "--inject stall=0.05,seed=2 --timeout 0.3 --retries 10" +
                        kSmallRun + " --json " + json);
  expect_all_verified(stalled, json, 2);
  EXPECT_GT(total_retries(read_json(json)), 0)
      << "no READ stalled: the seed no longer injects a stall\n" << stalled.output;
  std::remove(json.c_str());
}

TEST(RunCommand, BadOptionsFailWithOneClearLine) {
  Outcome bad_tensors = run(kBinary + " run --transport loopback --tensors a:4,a:8");
  EXPECT_EQ(bad_tensors.exit_code, 2) << bad_tensors.output;
  EXPECT_NE(bad_tensors.output.find("--tensors: tensor 'a' is named twice"), std::string::npos) << bad_tensors.output;
  Outcome bad_topology = run(kBinary + " run --transport loopback --replicas 70");
  EXPECT_EQ(bad_topology.exit_code, 2) << bad_topology.output;
  Outcome missing_trace = run(kBinary + " run --transport loopback --trace /nonexistent/trace.npy");
  EXPECT_NE(missing_trace.exit_code, 0);
  EXPECT_NE(missing_trace.output.find("/nonexistent/trace.npy"), std::string::npos) << missing_trace.output;
}

TEST(RunCommand, InjectedErrorsAreRetriedAndTheRunCompletes) {
  std::string json = run_temp_path("inject_err.json");
  Outcome outcome = run(kBinary + " run --transport loopback --ranks 4 --retries 10 --inject err=0.1,seed=3" +
                        kSmallRun + " --json " + json);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_GT(total_retries(parsed), 0) << outcome.output;
  std::remove(json.c_str());
}

TEST(RunCommand, StalledTransfersAbortCleanlyWithinTheDeadline) {
  std::string json = run_temp_path("stall.json");
  Outcome outcome = run(kBinary + " run --ranks 4 --nodes 2 --timeout 0.5 --retries 1 --inject stall=1" + kSmallRun +
                        " --json " + json);
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_LT(outcome.seconds, 30) << outcome.output;
  EXPECT_NE(outcome.output.find("aborted after 2 attempt(s)"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("still in progress at the deadline"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("kept its old placement on every rank"), std::string::npos) << outcome.output;
  // Every rank states its committed state and that it verified.
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(outcome.output.find("rank " + std::to_string(rank) + ": round 1 stopped"), std::string::npos)
        << outcome.output;
  EXPECT_NE(outcome.output.find("slots verified byte for byte against that mapping"), std::string::npos);
  auto parsed = read_json(json);
  ASSERT_FALSE(parsed.is_discarded());
  EXPECT_EQ(parsed["all_verified"], false);
  EXPECT_EQ(parsed["rounds"][0]["verified"], true);  // what was committed verified
  std::remove(json.c_str());
}

TEST(RunCommand, KilledRankMakesTheOthersStopWithinTheDeadline) {
  Outcome outcome = run(kBinary + " run --ranks 4 --nodes 2 --timeout 2" + kSmallRun, "EPLB_TEST_KILL_RANK_AT_LAYER=2:1");
  EXPECT_NE(outcome.exit_code, 0) << outcome.output;
  EXPECT_LT(outcome.seconds, 40) << outcome.output;
  EXPECT_NE(outcome.output.find("rank 2"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("migration stopped on rank"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("layer 1"), std::string::npos) << outcome.output;
  // The survivors report their committed state, verified.
  EXPECT_NE(outcome.output.find("slots verified byte for byte against that mapping"), std::string::npos)
      << outcome.output;
}

TEST(RunCommand, MpirunStartsTheRanks) {
  if (!mpirun_installed()) GTEST_SKIP() << "mpirun not installed";
  std::string json = run_temp_path("mpi.json");
  Outcome outcome = run("mpirun --allow-run-as-root --oversubscribe -np 4 " + kBinary +
                            " run --bootstrap mpi --nodes 2" + kSmallRun + " --json " + json,
                        "", 120);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_EQ(parsed["bootstrap"], "mpi");
  EXPECT_EQ(parsed["topology"]["ranks"], 4);
  std::remove(json.c_str());
}

// --async under mpirun: the serving loop gets a communicator of its own and
// both groups' MPI calls are serialized (mpi_group.cpp), swap commits.
TEST(RunCommand, MpirunRunsTheAsyncServingLoop) {
  if (!mpirun_installed()) GTEST_SKIP() << "mpirun not installed";
  std::string json = run_temp_path("mpi-async.json");
  Outcome outcome = run("mpirun --allow-run-as-root --oversubscribe -np 4 " + kBinary +
                            " run --bootstrap mpi --nodes 2 --async --commit swap --step-ms 2" + kSmallRun +
                            " --json " + json,
                        "", 120);
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  EXPECT_EQ(parsed["bootstrap"], "mpi");
  for (const auto& round : parsed["rounds"]) {
    EXPECT_GT(round["serving"]["steps"].get<int64_t>(), 0);
    EXPECT_EQ(round["serving"]["inconsistent_reads"], 0);
  }
  std::remove(json.c_str());
}

// Multi-host emulation: ranks 0-1 in one network namespace, 2-3 in another,
// joined by a veth pair, started by mpirun, data over UCX TCP. The veth's byte
// counters show that the inter-node reads (and only those) crossed it. One
// expert group: the policy then balances globally and moves experts across nodes.
TEST(RunCommand, AcrossTwoNetworkNamespacesOverTcp) {
  if (!mpirun_installed()) GTEST_SKIP() << "mpirun not installed";
  std::string json = run_temp_path("netns.json");
  Outcome outcome = run("bash " EPLB_SOURCE_DIR "/scripts/netns_mpirun.sh -n 4 " + kBinary +
                            " run --bootstrap mpi --transport tcp --nodes 2 --layers 3 --experts 16 --replicas 24"
                            " --groups 1 --bytes-per-expert 512KiB --rounds 2 --window 10 --json " + json,
                        "-u UCX_TLS", 150);  // --transport tcp decides, not a UCX_TLS left in the caller's shell
  if (outcome.exit_code == 77) GTEST_SKIP() << "cannot create network namespaces here: " << outcome.output;
  expect_all_verified(outcome, json, 2);
  auto parsed = read_json(json);
  ASSERT_FALSE(parsed.is_discarded());
  EXPECT_EQ(parsed["transport"], "tcp");
  uint64_t inter = 0, intra = 0;
  for (const auto& round : parsed["rounds"]) {
    inter += round["bytes_inter_node"].get<uint64_t>();
    intra += round["bytes_intra_node"].get<uint64_t>();
  }
  ASSERT_GT(inter, 0u);
  ASSERT_GT(intra, 0u);
  // "netns_mpirun: veth eplb0 carried X MiB eplb-host0 -> eplb-host1 (N bytes) and Y MiB ... (M bytes)"
  const std::string marker = "netns_mpirun: veth eplb0 carried ";
  auto at = outcome.output.find(marker);
  ASSERT_NE(at, std::string::npos) << outcome.output;
  std::string line = outcome.output.substr(at, outcome.output.find('\n', at) - at);
  const auto first = line.find('(');
  ASSERT_NE(first, std::string::npos) << line;
  const auto second = line.find('(', first + 1);
  ASSERT_NE(second, std::string::npos) << line;
  const unsigned long long sent = std::stoull(line.substr(first + 1));
  const unsigned long long received = std::stoull(line.substr(second + 1));
  // Every inter-node byte crossed the veth; intra-node reads stayed inside a
  // namespace (what else crosses is MPI votes, checksums and TCP headers).
  EXPECT_GE(sent + received, inter) << line;
  EXPECT_LT(sent + received, inter + intra / 2) << line << "; inter-node " << inter << ", intra-node " << intra;
  std::remove(json.c_str());
}

TEST(RunCommand, RanksWithDifferentInputsAreRefusedBeforeAnythingMoves) {
  if (!mpirun_installed()) GTEST_SKIP() << "mpirun not installed";
  const std::string common = " run --bootstrap mpi --nodes 2" + kSmallRun;
  const std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 " + kBinary + common + " : -np 2 " +
                             kBinary + common;
  Outcome policy = run(mpirun + " --policy relabel", "", 60);
  EXPECT_NE(policy.exit_code, 0) << policy.output;
  EXPECT_NE(policy.output.find("before any byte moved: rank 2 has policy = 'relabel', rank 0 has 'deepseek'"),
            std::string::npos)
      << policy.output;
  Outcome layout = run(mpirun + " --tensors a:40000,b:25536", "", 60);
  EXPECT_NE(layout.exit_code, 0) << layout.output;
  EXPECT_NE(layout.output.find("rank 2 has expert layout"), std::string::npos) << layout.output;
  EXPECT_NE(layout.output.find("a:40000,b:25536"), std::string::npos) << layout.output;
  EXPECT_NE(layout.output.find("gate_up:43520"), std::string::npos) << layout.output;
}

}  // namespace
