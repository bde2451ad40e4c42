// launch_local_ranks: environment, exit codes, first failure named, survivors
// killed after the grace period, the deadline, signal forwarding, cleanup;
// and whole local groups launched from this test binary in child mode.
#include <gtest/gtest.h>

#include <fstream>

#include "eplb/bootstrap.h"
#include "test_support.h"

namespace eplb {
namespace {

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(Launcher, RanksGetTheirEnvironmentAndTheDirectoryIsRemoved) {
  std::string out = testing::make_temp_dir();
  ScopedEnv env("EPLB_TEST_OUT", out);
  auto result = launch_local_ranks(
      3,
      {"/bin/sh", "-c",
       "test -d \"$EPLB_BOOTSTRAP_DIR\" && echo \"$EPLB_RANK $EPLB_SIZE $EPLB_BOOTSTRAP_DIR\" > "
       "\"$EPLB_TEST_OUT/$EPLB_RANK\""},
      Deadline::after_seconds(20));
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_EQ(result->exit_codes, std::vector<int>(3, 0));
  std::string dir;
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(out + "/" + std::to_string(r));
    int rank = -1, size = -1;
    in >> rank >> size >> dir;
    EXPECT_EQ(rank, r);
    EXPECT_EQ(size, 3);
  }
  EXPECT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " should have been removed";
  std::filesystem::remove_all(out);
}

TEST(Launcher, FirstFailureIsNamedAndSurvivorsAreKilledAfterGrace) {
  Stopwatch watch;
  LaunchResult outcome;
  auto result = launch_local_ranks(3, {"sh", "-c", "if [ \"$EPLB_RANK\" = 1 ]; then exit 5; fi; exec sleep 30"},
                                   Deadline::after_seconds(20), 0.3, &outcome);
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), Code::RemoteDisconnect);  // exit code 5: peer lost
  EXPECT_NE(result.status().message().find("rank 1 failed with exit code 5"), std::string::npos)
      << result.status().to_string();
  EXPECT_NE(result.status().message().find("ranks 0, 2 were still running and were killed"), std::string::npos)
      << result.status().to_string();
  EXPECT_EQ(outcome.exit_codes, (std::vector<int>{128 + SIGKILL, 5, 128 + SIGKILL}));
  EXPECT_LT(watch.seconds(), 5.0);
}

TEST(Launcher, SignalledRankIsNamed) {
  auto result = launch_local_ranks(2, {"sh", "-c", "if [ \"$EPLB_RANK\" = 0 ]; then kill -9 $$; fi; exit 0"},
                                   Deadline::after_seconds(20), 5);
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), Code::RemoteDisconnect);
  EXPECT_NE(result.status().message().find("rank 0 was killed by signal 9 (SIGKILL)"), std::string::npos)
      << result.status().to_string();
}

TEST(Launcher, DeadlineKillsEveryRank) {
  Stopwatch watch;
  LaunchResult outcome;
  auto result = launch_local_ranks(2, {"sleep", "30"}, Deadline::after_seconds(0.4), 5, &outcome);
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), Code::Timeout) << result.status().to_string();
  EXPECT_EQ(outcome.exit_codes, (std::vector<int>{128 + SIGKILL, 128 + SIGKILL}));
  EXPECT_LT(watch.seconds(), 3.0);
}

TEST(Launcher, SigtermIsForwardedToTheRanks) {
  // A helper process sends SIGTERM to this process while it waits for its ranks.
  pid_t parent = ::getpid();
  pid_t helper = ::fork();
  if (helper == 0) {
    ::usleep(300000);
    ::kill(parent, SIGTERM);
    ::_exit(0);
  }
  LaunchResult outcome;
  Stopwatch watch;
  auto result = launch_local_ranks(2, {"sleep", "30"}, Deadline::after_seconds(20), 5, &outcome);
  testing::wait_children({helper}, 5);
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), Code::Canceled) << result.status().to_string();
  EXPECT_NE(result.status().message().find("SIGTERM"), std::string::npos) << result.status().to_string();
  EXPECT_EQ(outcome.exit_codes, (std::vector<int>{128 + SIGTERM, 128 + SIGTERM}));
  EXPECT_LT(watch.seconds(), 5.0);
}

TEST(Launcher, MissingProgramIsNotFound) {
  auto result = launch_local_ranks(2, {"/nonexistent/eplb-rank"}, Deadline::after_seconds(5));
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), Code::NotFound);
  EXPECT_NE(result.status().message().find("/nonexistent/eplb-rank"), std::string::npos);
  EXPECT_EQ(launch_local_ranks(0, {"true"}, Deadline::after_seconds(1)).status().code(), Code::InvalidArgument);
  EXPECT_EQ(launch_local_ranks(1, {}, Deadline::after_seconds(1)).status().code(), Code::InvalidArgument);
}

TEST(Launcher, LaunchedLocalGroupExchangesData) {
  ScopedEnv mode("EPLB_TEST_CHILD_MODE", "local_exercise");
  auto result = launch_local_ranks(4, {self_exe(), "--gtest_filter=BootstrapChildMode.Run", "--gtest_brief=1"},
                                   Deadline::after_seconds(60));
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  EXPECT_EQ(result->exit_codes, std::vector<int>(4, 0));
}

TEST(Launcher, LaunchedRankKilledIsNamedAndOthersExitPeerLost) {
  ScopedEnv mode("EPLB_TEST_CHILD_MODE", "local_kill");
  LaunchResult outcome;
  Stopwatch watch;
  auto result = launch_local_ranks(3, {self_exe(), "--gtest_filter=BootstrapChildMode.Run", "--gtest_brief=1"},
                                   Deadline::after_seconds(60), 10, &outcome);
  ASSERT_FALSE(result.is_ok());
  EXPECT_NE(result.status().message().find("rank 2 was killed by signal 9"), std::string::npos)
      << result.status().to_string();
  // The survivors noticed by themselves (exit code 5: peer lost), long before the grace period ended.
  EXPECT_EQ(outcome.exit_codes, (std::vector<int>{5, 5, 128 + SIGKILL}));
  EXPECT_LT(watch.seconds(), 9.0);
}

TEST(BootstrapCheckCli, ThreeLocalRanksAgree) {
  std::string eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  if (::access(eplb.c_str(), X_OK) != 0) GTEST_SKIP() << eplb << " is not built (cmake --build <dir> --target eplb)";
  std::string out = testing::make_temp_dir();
  std::string command = "env -u EPLB_RANK -u EPLB_SIZE -u EPLB_BOOTSTRAP_DIR timeout 60 " + eplb +
                        " bootstrap-check --ranks 3 --rounds 5 > " + out + "/stdout 2>&1";
  int status = std::system(command.c_str());
  std::ifstream in(out + "/stdout");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(out);
  EXPECT_EQ(status, 0) << text;
  EXPECT_NE(text.find("bootstrap-check: 3 ranks over local"), std::string::npos) << text;
  EXPECT_NE(text.find("vote: all 3 ranks agree"), std::string::npos) << text;
}

}  // namespace
}  // namespace eplb
