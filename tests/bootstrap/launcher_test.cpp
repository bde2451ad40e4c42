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

LaunchResult launch(int size, std::vector<std::string> argv, double seconds, double grace_seconds = 5) {
  LaunchOptions options;
  options.size = size;
  options.argv = std::move(argv);
  options.deadline = Deadline::after_seconds(seconds);
  options.grace_seconds = grace_seconds;
  options.echo_exit_codes = {4, 5};
  return launch_local_ranks(options);
}

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
  auto result = launch(3,
                       {"/bin/sh", "-c",
                        "test -d \"$EPLB_BOOTSTRAP_DIR\" && echo \"$EPLB_RANK $EPLB_SIZE $EPLB_BOOTSTRAP_DIR\" > "
                        "\"$EPLB_TEST_OUT/$EPLB_RANK\""},
                       20);
  ASSERT_TRUE(result.status) << result.status.to_string();
  EXPECT_EQ(result.exit_codes, std::vector<int>(3, 0));
  EXPECT_EQ(result.failed_rank, -1);
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
  auto result = launch(3, {"sh", "-c", "if [ \"$EPLB_RANK\" = 1 ]; then exit 5; fi; exec sleep 30"}, 20, 0.3);
  ASSERT_FALSE(result.status);
  // The launcher names the rank and how it ended; what exit code 5 means is
  // the application's business (the CLI maps it).
  EXPECT_EQ(result.status.code(), Code::Aborted);
  EXPECT_EQ(result.failed_rank, 1);
  EXPECT_FALSE(result.failed_rank_signalled);
  EXPECT_NE(result.status.message().find("rank 1 failed with exit code 5"), std::string::npos)
      << result.status.to_string();
  EXPECT_NE(result.status.message().find("ranks 0, 2 were still running and were killed"), std::string::npos)
      << result.status.to_string();
  EXPECT_EQ(result.exit_codes, (std::vector<int>{128 + SIGKILL, 5, 128 + SIGKILL}));
  EXPECT_LT(watch.seconds(), 5.0);
}

TEST(Launcher, AnEchoOfAnotherFailureIsNamedLast) {
  // Ranks 0 and 1 exit 5 ("peer lost", an echo), rank 2 exits 3 at the same
  // moment: rank 2 is named, though rank 0 has the lower number.
  auto result = launch(3, {"sh", "-c", "if [ \"$EPLB_RANK\" = 2 ]; then exit 3; fi; exit 5"}, 20);
  ASSERT_FALSE(result.status);
  EXPECT_EQ(result.failed_rank, 2) << result.status.to_string();
  EXPECT_NE(result.status.message().find("rank 2 failed with exit code 3"), std::string::npos);
}

TEST(Launcher, SignalledRankIsNamed) {
  auto result = launch(2, {"sh", "-c", "if [ \"$EPLB_RANK\" = 0 ]; then kill -9 $$; fi; exit 0"}, 20);
  ASSERT_FALSE(result.status);
  EXPECT_EQ(result.failed_rank, 0);
  EXPECT_TRUE(result.failed_rank_signalled);
  EXPECT_NE(result.status.message().find("rank 0 was killed by signal 9 (SIGKILL)"), std::string::npos)
      << result.status.to_string();
}

TEST(Launcher, DeadlineKillsEveryRank) {
  Stopwatch watch;
  auto result = launch(2, {"sleep", "30"}, 0.4);
  ASSERT_FALSE(result.status);
  EXPECT_EQ(result.status.code(), Code::Timeout) << result.status.to_string();
  EXPECT_EQ(result.exit_codes, (std::vector<int>{128 + SIGKILL, 128 + SIGKILL}));
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
  Stopwatch watch;
  auto result = launch(2, {"sleep", "30"}, 20);
  testing::wait_children({helper}, 5);
  ASSERT_FALSE(result.status);
  EXPECT_EQ(result.status.code(), Code::Canceled) << result.status.to_string();
  EXPECT_NE(result.status.message().find("SIGTERM"), std::string::npos) << result.status.to_string();
  EXPECT_EQ(result.exit_codes, (std::vector<int>{128 + SIGTERM, 128 + SIGTERM}));
  EXPECT_LT(watch.seconds(), 5.0);
}

TEST(Launcher, MissingProgramIsNotFound) {
  auto result = launch(2, {"/nonexistent/eplb-rank"}, 5);
  ASSERT_FALSE(result.status);
  EXPECT_EQ(result.status.code(), Code::NotFound);
  EXPECT_NE(result.status.message().find("/nonexistent/eplb-rank"), std::string::npos);
  EXPECT_EQ(launch(0, {"true"}, 1).status.code(), Code::InvalidArgument);
  EXPECT_EQ(launch(1, {}, 1).status.code(), Code::InvalidArgument);
}

TEST(Launcher, LaunchedLocalGroupExchangesData) {
  ScopedEnv mode("EPLB_TEST_CHILD_MODE", "local_exercise");
  auto result = launch(4, {self_exe(), "--gtest_filter=BootstrapChildMode.Run", "--gtest_brief=1"}, 60);
  ASSERT_TRUE(result.status) << result.status.to_string();
  EXPECT_EQ(result.exit_codes, std::vector<int>(4, 0));
}

TEST(Launcher, LaunchedRankKilledIsNamedAndOthersExitPeerLost) {
  ScopedEnv mode("EPLB_TEST_CHILD_MODE", "local_kill");
  Stopwatch watch;
  auto result = launch(3, {self_exe(), "--gtest_filter=BootstrapChildMode.Run", "--gtest_brief=1"}, 60, 10);
  ASSERT_FALSE(result.status);
  // The signalled rank is named, not the survivors that exited 5 (an echo).
  EXPECT_NE(result.status.message().find("rank 2 was killed by signal 9"), std::string::npos)
      << result.status.to_string();
  EXPECT_EQ(result.failed_rank, 2);
  // The survivors noticed by themselves (exit code 5: peer lost), long before the grace period ended.
  EXPECT_EQ(result.exit_codes, (std::vector<int>{5, 5, 128 + SIGKILL}));
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
