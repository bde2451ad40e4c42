// `eplb run` as a careless user or an attacker drives it (issue 17 rows 3,
// 4, 8, 9, 10, 11): every option, the trace file and the --json path are
// checked once by the launcher before any rank starts; the report is
// written atomically, streamed round by round, and also when a run aborts;
// Ctrl-C exits 130 with the ranks stopped and the run's files removed.
#include <gtest/gtest.h>
#include <sys/stat.h>
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

using eplb::testing_support::kBinary;
const std::string kShape = " --layers 3 --experts 16 --replicas 24 --groups 4 --bytes-per-expert 64KiB";
const std::string kSmall = kShape + " --window 10";

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

// The files and directories directly in `dir` whose name starts with `prefix`.
std::set<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().starts_with(prefix)) names.insert(entry.path().filename().string());
  return names;
}

class RunHardening : public eplb::testing_support::TempDirTest {
 protected:
  BoundedRun run(const std::string& arguments, int limit_seconds = 60) {
    return run_bounded(kBinary + " run" + arguments, "", limit_seconds);
  }
  // One error line, the expected exit code, within seconds, no rank output.
  void expect_refused_once(const std::string& arguments, int exit_code, const std::string& words) {
    const bool window = arguments.find("--window") != std::string::npos;
    BoundedRun refused = run(" --ranks 4 --nodes 2" + (window ? kShape : kSmall) + arguments, 20);
    EXPECT_EQ(refused.exit_code, exit_code) << arguments << "\n" << refused.output;
    EXPECT_EQ(count_of(refused.output, "eplb: "), 1u) << arguments << "\n" << refused.output;
    EXPECT_NE(refused.output.find(words), std::string::npos) << arguments << "\n" << refused.output;
    EXPECT_EQ(refused.output.find("rank 0"), std::string::npos) << arguments << "\n" << refused.output;
    EXPECT_LT(refused.seconds, 5.0) << arguments;
  }
};

TEST_F(RunHardening, BadOptionsAreOneErrorBeforeAnyRankStarts) {
  expect_refused_once(" --rounds 0", 2, "rounds must be in [1, 100000], got 0");
  expect_refused_once(" --window 0", 2, "window must be in [1, 1000000], got 0");
  expect_refused_once(" --policy foo", 2, "foo");
  expect_refused_once(" --inject garbage", 2, "item 'garbage' is not key=value");
  expect_refused_once(" --inject seed=abc", 2, "fault spec seed");
  expect_refused_once(" --max-input-bytes 0", 2, "--max-input-bytes");
}

TEST_F(RunHardening, DurationsAreFinitePositiveAndAtMostADay) {
  for (const char* timeout : {"1e10", "inf", "1e300", "nan", "-1", "86401"})
    expect_refused_once(std::string(" --timeout ") + timeout, 2, "--timeout must be a number of seconds in (0, 86400]");
  for (const char* timeout : {"0", "nan", "inf", "1e10", "-1"}) {
    BoundedRun check = run_bounded(kBinary + " bootstrap-check --ranks 2 --timeout " + timeout, "", 20);
    EXPECT_NE(check.exit_code, 0) << check.output;
    EXPECT_NE(check.output.find("--timeout: the value must be a number of seconds in (0, 86400]"), std::string::npos)
        << check.output;
  }
  BoundedRun a_day = run(" --transport loopback --rounds 1" + kSmall + " --timeout 86400");
  EXPECT_EQ(a_day.exit_code, 0) << a_day.output;
}

TEST_F(RunHardening, TraceFifoOrDeviceIsRefusedByTheLauncher) {
  ASSERT_EQ(::mkfifo(file("trace.npy").c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/zero", file("zero.json"));
  expect_refused_once(" --trace " + file("trace.npy"), 3, "trace.npy: is a FIFO (named pipe)");
  expect_refused_once(" --trace " + file("zero.json"), 3, "zero.json: is a character device");
  std::ofstream(file("trace.json")) << "[[[1, 2]]]";
  expect_refused_once(" --trace " + file("trace.json") + " --max-input-bytes 5", 3, "text input limit of 5 bytes");
}

TEST_F(RunHardening, UnwritableReportIsRefusedBeforeAnyWork) {
  expect_refused_once(" --json /proc/x.json", 3, "--json: /proc/x.json: cannot create");
  expect_refused_once(" --json " + file("missing/r.json"), 3, "cannot create");
  std::filesystem::create_directory(file("dir.json"));
  expect_refused_once(" --json " + file("dir.json"), 3, "exists and is not a regular file");
  BoundedRun threads = run(" --transport loopback --rounds 1" + kSmall + " --json /proc/x.json", 20);
  EXPECT_EQ(threads.exit_code, 3) << threads.output;
  EXPECT_EQ(threads.output.find("round 1"), std::string::npos) << threads.output;
}

// Under mpirun there is no launcher: rank 0 finds the bad path before any
// work and every rank stops with it at the fingerprint exchange.
TEST_F(RunHardening, UnderMpirunAnUnwritableReportStopsEveryRankBeforeWork) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not installed";
  BoundedRun mpi = run_bounded("mpirun --allow-run-as-root --oversubscribe -np 2 " + kBinary +
                                   " run --bootstrap mpi --nodes 1 --rounds 1" + kSmall + " --json /proc/x.json",
                               "", 60);
  EXPECT_NE(mpi.exit_code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("rank 0: --json: /proc/x.json: cannot create"), std::string::npos) << mpi.output;
  EXPECT_EQ(mpi.output.find("round 1/"), std::string::npos) << mpi.output;
  EXPECT_LT(mpi.seconds, 30.0);
}

TEST_F(RunHardening, AbortedRunWritesItsReportAndExitsWithTheAbortCode) {
  const std::string json = file("aborted.json");
  BoundedRun aborted = run(" --ranks 4 --nodes 2 --rounds 2 --retries 0 --inject corrupt=1" + kSmall + " --json " + json);
  EXPECT_EQ(aborted.exit_code, 1) << aborted.output;
  EXPECT_EQ(aborted.output.find("report was not written"), std::string::npos) << aborted.output;
  auto report = nlohmann::json::parse(eplb::testing_support::slurp(json), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << eplb::testing_support::slurp(json);
  EXPECT_EQ(report["all_verified"], false);
  EXPECT_NE(report["status"].get<std::string>().find("aborted"), std::string::npos) << report.dump(1);
  EXPECT_NE(report["final_state"].get<std::string>().find("rank 0: round 1 stopped"), std::string::npos)
      << report.dump(1);
  EXPECT_EQ(report["rounds"].size(), 1u);
  EXPECT_EQ(entries(dir_, "aborted.json.tmp"), std::set<std::string>{});
}

TEST_F(RunHardening, ReportReplacesTheOldOneWholeAndStreamsEveryRound) {
  const std::string json = file("r.json");
  std::ofstream(json) << "the previous report";
  BoundedRun long_run = run(" --transport loopback --ranks 2 --nodes 1 --rounds 60 --layers 2 --experts 8 "
                            "--replicas 8 --groups 2 --bytes-per-expert 4KiB --window 2 --json " + json);
  ASSERT_EQ(long_run.exit_code, 0) << long_run.output;
  auto report = nlohmann::json::parse(eplb::testing_support::slurp(json), nullptr, false);
  ASSERT_FALSE(report.is_discarded());
  ASSERT_EQ(report["rounds"].size(), 60u);
  EXPECT_EQ(report["rounds"][59]["round"], 60);
  EXPECT_EQ(report["all_verified"], true);
  EXPECT_EQ(report["status"], "ok");
  EXPECT_EQ(count_of(long_run.output, "\n60     "), 1u) << long_run.output;  // the table's last row
  EXPECT_EQ(entries(dir_, "r.json.tmp"), std::set<std::string>{});
}

// Row 7: TCP uses the devices UCX is told (lo with the local launcher), and
// the report says which.
TEST_F(RunHardening, TcpRunNamesItsNetworkDevices) {
  const std::string json = file("tcp.json");
  BoundedRun tcp = run(" --transport tcp --ranks 2 --nodes 1 --rounds 1" + kSmall + " --json " + json);
  ASSERT_EQ(tcp.exit_code, 0) << tcp.output;
  EXPECT_NE(tcp.output.find("UCX_NET_DEVICES=lo (AgentConfig)"), std::string::npos) << tcp.output;
  auto report = nlohmann::json::parse(eplb::testing_support::slurp(json), nullptr, false);
  EXPECT_NE(report["transports"].get<std::string>().find("UCX_NET_DEVICES=lo"), std::string::npos) << report.dump(1);
  BoundedRun chosen = run(" --transport tcp --net-devices nosuchdevice0 --ranks 2 --nodes 1 --rounds 1" + kSmall, 60);
  EXPECT_NE(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("nosuchdevice0"), std::string::npos) << chosen.output;
}

TEST_F(RunHardening, CtrlCExits130WithRanksStoppedAndFilesRemoved) {
  // The launcher makes its rendezvous directory under TMPDIR: this test's own
  // directory, so that runs of other tests in parallel do not count.
  // A run slow enough to be interrupted mid-way: 50 ms per transfer.
  BoundedRun interrupted = eplb::testing_support::run_bounded(
      "sh -c '" + kBinary + " run --ranks 4 --nodes 2 --rounds 50 --inject delay_ms=50" + kSmall +
          " & pid=$!; sleep 2; ls -d $TMPDIR/eplb-*; kill -INT $pid; wait $pid; echo exit=$?'",
      "TMPDIR=" + dir_, 60);
  EXPECT_NE(interrupted.output.find(dir_ + "/eplb-"), std::string::npos) << interrupted.output;  // it existed
  EXPECT_NE(interrupted.output.find("exit=130"), std::string::npos) << interrupted.output;
  EXPECT_NE(interrupted.output.find("interrupted by signal 2 (SIGINT)"), std::string::npos) << interrupted.output;
  EXPECT_NE(interrupted.output.find("exit codes by rank: 130 130 130 130"), std::string::npos) << interrupted.output;
  EXPECT_LT(interrupted.seconds, 20.0);
  EXPECT_EQ(entries(dir_, "eplb-"), std::set<std::string>{});
}

}  // namespace
