// The mpi group under a real `mpirun -np 4` (this test binary in child mode).
// Skipped with a message when mpirun is not installed.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "eplb/bootstrap.h"
#include "test_support.h"

namespace eplb {
namespace {

std::string find_mpirun() {
  for (const char* path : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"})
    if (::access(path, X_OK) == 0) return path;
  return "";
}

// OpenMPI internals trip ThreadSanitizer in TSan builds: narrow suppressions.
std::string tsan_options() {
  return "TSAN_OPTIONS=suppressions=" + std::string(EPLB_SOURCE_DIR) + "/tests/bootstrap/tsan_openmpi.supp";
}

// Runs `mpirun -np 4 <this binary in child mode>`; returns each rank's verdict.
std::vector<std::string> run_under_mpirun(const std::string& mode, int ranks, Status* launch_status) {
  std::string results = testing::make_temp_dir();
  std::vector<std::string> argv = {find_mpirun(), "--allow-run-as-root", "--oversubscribe", "-np",
                                   std::to_string(ranks), "--mca", "btl", "self,vader,tcp",
                                   "-x", "EPLB_TEST_CHILD_MODE=" + mode, "-x", "EPLB_TEST_RESULT_DIR=" + results,
                                   "-x", "ASAN_OPTIONS=detect_leaks=0", "-x", tsan_options(),
                                   std::filesystem::read_symlink("/proc/self/exe").string(),
                                   "--gtest_filter=BootstrapChildMode.Run", "--gtest_brief=1"};
  LaunchOptions options;
  options.argv = argv;
  options.deadline = Deadline::after_seconds(90);
  *launch_status = launch_local_ranks(options).status;
  std::vector<std::string> verdicts;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(results + "/" + std::to_string(r));
    std::stringstream text;
    text << in.rdbuf();
    verdicts.push_back(in ? text.str() : "(no verdict)");
  }
  std::filesystem::remove_all(results);
  return verdicts;
}

TEST(MpiGroup, AllgatherBarrierVoteUnderMpirun) {
  if (find_mpirun().empty()) GTEST_SKIP() << "mpirun not found (install openmpi-bin): MPI bootstrap not tested";
  Status launch;
  auto verdicts = run_under_mpirun("mpi_exercise", 4, &launch);
  EXPECT_TRUE(launch.is_ok()) << launch.to_string();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(verdicts[r].starts_with("ok on ")) << "rank " << r << ": " << verdicts[r];
}

TEST(MpiGroup, AcrossTwoNetworkNamespaces) {
  if (find_mpirun().empty()) GTEST_SKIP() << "mpirun not found (install openmpi-bin): MPI bootstrap not tested";
  std::string results = testing::make_temp_dir();
  ::setenv("EPLB_TEST_CHILD_MODE", "mpi_exercise", 1);
  ::setenv("EPLB_TEST_RESULT_DIR", results.c_str(), 1);
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 0);
  std::string tsan = tsan_options();
  ::setenv("TSAN_OPTIONS", tsan.substr(tsan.find('=') + 1).c_str(), 0);
  LaunchOptions options;
  options.argv = {"bash", std::string(EPLB_SOURCE_DIR) + "/scripts/netns_mpirun.sh", "-n", "4",
                  std::filesystem::read_symlink("/proc/self/exe").string(), "--gtest_filter=BootstrapChildMode.Run",
                  "--gtest_brief=1"};
  options.deadline = Deadline::after_seconds(90);
  LaunchResult launched = launch_local_ranks(options);
  ::unsetenv("EPLB_TEST_CHILD_MODE");
  ::unsetenv("EPLB_TEST_RESULT_DIR");
  std::vector<std::string> verdicts;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(results + "/" + std::to_string(r));
    std::stringstream text;
    text << in.rdbuf();
    verdicts.push_back(in ? text.str() : "(no verdict)");
  }
  std::filesystem::remove_all(results);
  if (!launched.exit_codes.empty() && launched.exit_codes[0] == 77)
    GTEST_SKIP() << "cannot create network namespaces here (needs root or CAP_SYS_ADMIN+CAP_NET_ADMIN)";
  ASSERT_TRUE(launched.status) << launched.status.to_string();
  // Block mapping: ranks 0-1 on the first emulated host, 2-3 on the second.
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(verdicts[r], r < 2 ? "ok on eplb-host0" : "ok on eplb-host1") << "rank " << r;
}

TEST(MpiGroup, LateRankTimesOutNamingIt) {
  if (find_mpirun().empty()) GTEST_SKIP() << "mpirun not found (install openmpi-bin): MPI bootstrap not tested";
  Stopwatch watch;
  Status launch;
  auto verdicts = run_under_mpirun("mpi_timeout", 4, &launch);
  EXPECT_FALSE(launch.is_ok());  // the ranks that timed out exit 4
  // mpirun may stop a rank before it writes its verdict (the job is aborted as
  // soon as one rank exits non-zero); every verdict written must name rank 3.
  int reported = 0;
  for (int r = 0; r < 3; ++r) {
    if (verdicts[r] == "(no verdict)") continue;
    ++reported;
    EXPECT_NE(verdicts[r].find("timeout: mpi allgather #2: rank 3 has not arrived"), std::string::npos)
        << "rank " << r << ": " << verdicts[r];
  }
  EXPECT_GE(reported, 1);
  EXPECT_LT(watch.seconds(), 30.0);
}

TEST(MpiGroup, KilledRankEndsTheJobWithinTheDeadline) {
  if (find_mpirun().empty()) GTEST_SKIP() << "mpirun not found (install openmpi-bin): MPI bootstrap not tested";
  Stopwatch watch;
  Status launch;
  auto verdicts = run_under_mpirun("mpi_kill", 4, &launch);
  // mpirun notices the dead rank and stops the job; had it not, the survivors'
  // 10 s deadline would have (each verdict written must then name rank 3).
  EXPECT_FALSE(launch.is_ok());
  EXPECT_LT(watch.seconds(), 30.0);
  for (int r = 0; r < 3; ++r) {
    if (verdicts[r] != "(no verdict)") {
      EXPECT_NE(verdicts[r].find("rank 3"), std::string::npos) << "rank " << r << ": " << verdicts[r];
    }
  }
  std::printf("killed rank: job ended after %.1f s: %s\n", watch.seconds(), launch.to_string().c_str());
}

TEST(MpiGroup, LaunchedByMpirunReadsTheEnvironment) {
  bool before = launched_by_mpirun();
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_TRUE(launched_by_mpirun());
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(launched_by_mpirun(), before);
}

}  // namespace
}  // namespace eplb
