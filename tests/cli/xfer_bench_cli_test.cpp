// eplb xfer-bench end to end: READ and WRITE between two processes over UCX
// shared memory and TCP with --check (bytes verified) and --json rows,
// pinning with --cpu / --target-cpu, the bounded waits of --listen / --peer,
// and the errors of bad options.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "../support/cli_support.h"

namespace eplb {
namespace {

using testing_support::BoundedRun;
using testing_support::run_bounded;

// Runs xfer-bench bounded at 120 s; stdout and stderr together.
BoundedRun xfer_bench(const std::string& arguments) {
  return run_bounded(std::string(EPLB_BINARY_DIR) + "/eplb xfer-bench " + arguments, "EPLB_LOG=warn", 120);
}

// The JSON rows of a --json run (the output must be that array alone).
nlohmann::json rows_of(const BoundedRun& run) {
  auto parsed = nlohmann::json::parse(run.output, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << run.output;
  return parsed;
}

void expect_checked_rows(const BoundedRun& run, const std::vector<uint64_t>& blocks, int batch) {
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json rows = rows_of(run);
  ASSERT_TRUE(rows.is_array()) << run.output;
  ASSERT_EQ(rows.size(), blocks.size()) << run.output;
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(rows[i]["block_bytes"].get<uint64_t>(), blocks[i]);
    EXPECT_EQ(rows[i]["batch"].get<int>(), batch);
    EXPECT_EQ(rows[i]["check"].get<std::string>(), "ok") << rows[i].dump();
    EXPECT_GT(rows[i]["gigabytes_per_second"].get<double>(), 0.0);
    EXPECT_GE(rows[i]["completion_p99_us"].get<double>(), 0.0);
  }
}

TEST(XferBenchCli, ReadAndWriteOverSharedMemoryAreChecked) {
  for (const char* op : {"read", "write"}) {
    SCOPED_TRACE(op);
    BoundedRun run = xfer_bench(std::string("--op ") + op +
                                " --transport shm --block-sizes 4K,1M --batch 3 --iterations 20 --check --json");
    expect_checked_rows(run, {4096, 1 << 20}, 3);
  }
}

TEST(XferBenchCli, UserMemoryAndRepostedRequestsAreChecked) {
  BoundedRun user = xfer_bench("--memory user --block-sizes 64K --iterations 20 --check --json");
  expect_checked_rows(user, {64 << 10}, 1);
  BoundedRun reused = xfer_bench("--reuse-request --block-sizes 4K..16K --iterations 50 --check --json");
  expect_checked_rows(reused, {4 << 10, 8 << 10, 16 << 10}, 1);
}

TEST(XferBenchCli, ReadOverTcpOnLoopbackIsChecked) {
  BoundedRun run = xfer_bench("--transport tcp --block-sizes 256K --iterations 10 --check --json");
  expect_checked_rows(run, {256 << 10}, 1);
}

TEST(XferBenchCli, PinnedInitiatorAndTargetAreChecked) {
  BoundedRun run = xfer_bench("--cpu 0 --target-cpu 0 --block-sizes 1M --iterations 20 --check --json");
  expect_checked_rows(run, {1 << 20}, 1);
}

// A TCP port for this test process (distinct per test run and per test).
std::string test_port(int offset) { return std::to_string(30000 + (::getpid() * 7 + offset) % 20000); }

TEST(XferBenchCli, ListenGivesUpWhenNoPeerComes) {
  BoundedRun run = xfer_bench("--listen " + test_port(1) + " --listen-timeout 1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(run.seconds, 10.0);
  EXPECT_NE(run.output.find("no --peer connected to port " + test_port(1) + " within 1.0 s"), std::string::npos)
      << run.output;
}

TEST(XferBenchCli, PeerGivesUpOnAStoppedTarget) {
  // The target listens, is stopped (SIGSTOP) before the peer connects, and
  // never sends its metadata: the peer must fail after --timeout, not hang.
  const std::string eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  const std::string port = test_port(2);
  const std::string script = eplb + " xfer-bench --listen " + port + " --block-sizes 4K & target=$!; sleep 0.5; " +
                             "kill -STOP $target; " + eplb + " xfer-bench --peer 127.0.0.1:" + port +
                             " --block-sizes 4K --timeout 1; status=$?; kill -KILL $target; exit $status";
  BoundedRun run = run_bounded("sh -c '" + script + "'", "EPLB_LOG=warn", 60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 137) << "killed by the time limit: the peer hung";
  EXPECT_LT(run.seconds, 20.0);
  EXPECT_NE(run.output.find("the target did not send its metadata within 1.0 s"), std::string::npos) << run.output;
}

TEST(XferBenchCli, BadOptionsAreRefusedWithTheReason) {
  struct Case {
    const char* arguments;
    const char* says;
  };
  const Case cases[] = {
      {"--cpu 4096 --block-sizes 4K", "--cpu 4096 does not exist"},
      {"--target-cpu -2 --block-sizes 4K", "--target-cpu -2 does not exist"},
      {"--target-cpu 0 --peer 127.0.0.1:9 --block-sizes 4K", "--target-cpu pins the forked target"},
      {"--op copy", "--op must be read or write"},
      {"--memory gpu", "--memory must be ucx or user"},
      {"--block-sizes 4Q", "--block-sizes: '4Q' is not a byte size"},
      {"--block-sizes 0", "--block-sizes: byte size '0' must be a whole number of bytes in [1 B, 1 TiB]"},
      {"--block-sizes 1M..4K", "--block-sizes: range '1M..4K' is empty"},
      {"--batch 0", "--batch must be 1..65536"},
      {"--peer nocolon", "--peer must be HOST:PORT"},
      {"--target-poll-ms 0", "--target-poll-ms: Value 0 not in range 1 to 1000"},
      // Issue 17 row 8: every duration finite, > 0 and at most a day.
      {"--timeout 0", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout inf", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout nan", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout 1e10", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout -1", "--timeout must be a number of seconds in (0, 86400]"},
      {"--listen-timeout 1e300", "--listen-timeout must be a number of seconds in (0, 86400]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arguments);
    BoundedRun run = xfer_bench(c.arguments);
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.exit_code, 137) << "killed by the time limit";
    EXPECT_NE(run.output.find(c.says), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace eplb
