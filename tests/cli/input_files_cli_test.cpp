// Input files given to rebalance and evaluate (issue 17 rows 3, 4): a FIFO,
// /dev/zero behind a load name, a directory, an over-limit text file. Each
// is one clear line and exit code 3 within a second; --max-input-bytes is
// checked like every byte size.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../support/cli_support.h"

namespace eplb {
namespace {

using testing_support::BoundedRun;
using testing_support::run_bounded;

class InputFilesCli : public testing_support::TempDirTest {
 protected:
  BoundedRun eplb(const std::string& arguments) {
    return run_bounded(std::string(EPLB_BINARY_DIR) + "/eplb " + arguments, "", 20);
  }
  void expect_refused(const BoundedRun& run, int code, const std::string& words) {
    EXPECT_EQ(run.exit_code, code) << run.output;
    EXPECT_NE(run.output.find(words), std::string::npos) << run.output;
    EXPECT_LT(run.seconds, 2.0) << run.output;
  }
};

TEST_F(InputFilesCli, FifoAsLoadCurrentOrTraceIsRefusedAtOnce) {
  for (const char* name : {"load.npy", "load.json", "current.json"}) ASSERT_EQ(::mkfifo(file(name).c_str(), 0600), 0);
  expect_refused(eplb("rebalance --load " + file("load.npy")), 3, "load.npy: is a FIFO (named pipe)");
  expect_refused(eplb("rebalance --current " + file("current.json")), 3, "current.json: is a FIFO (named pipe)");
  expect_refused(eplb("evaluate --trace " + file("load.json")), 3, "load.json: is a FIFO (named pipe)");
}

TEST_F(InputFilesCli, DevZeroAndDirectoriesAreRefused) {
  std::filesystem::create_symlink("/dev/zero", file("zero.npy"));
  std::filesystem::create_symlink("/dev/zero", file("zero.json"));
  std::filesystem::create_directory(file("dir.csv"));
  expect_refused(eplb("rebalance --load " + file("zero.npy")), 3, "is a character device");
  expect_refused(eplb("evaluate --trace " + file("zero.json")), 3, "is a character device");
  expect_refused(eplb("evaluate --trace " + file("dir.csv")), 3, "is a directory");
}

TEST_F(InputFilesCli, MaxInputBytesCapsTextInputs) {
  std::ofstream(file("load.csv")) << "1,2,3,4\n5,6,7,8\n";
  BoundedRun fits = eplb("rebalance --load " + file("load.csv") + " --replicas 8 --groups 2 --nodes 1 --ranks 2");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  expect_refused(eplb("rebalance --load " + file("load.csv") + " --max-input-bytes 15"), 3,
                 "is 16 bytes, more than the text input limit of 15 bytes");
  expect_refused(eplb("evaluate --trace " + file("load.csv") + " --max-input-bytes lots"), 2, "--max-input-bytes");
  BoundedRun help = eplb("rebalance --help");
  EXPECT_NE(help.output.find("--max-input-bytes"), std::string::npos);
}

// Issue 17 row 9 for evaluate: --json checked before any work, written atomically.
TEST_F(InputFilesCli, EvaluateJsonIsCheckedBeforeWorkAndWrittenWhole) {
  std::ofstream(file("trace.json")) << "[[[1, 2, 3, 4]], [[4, 3, 2, 1]], [[1, 1, 1, 1]], [[2, 2, 2, 2]]]";
  const std::string trace = " --trace " + file("trace.json") + " --window 1 --replicas 8 --groups 2 --nodes 1 --ranks 2";
  expect_refused(eplb("evaluate" + trace + " --json /proc/x.json"), 3, "--json: /proc/x.json: cannot create");
  std::ofstream(file("e.json")) << "old";
  BoundedRun written = eplb("evaluate" + trace + " --quiet --json " + file("e.json"));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  EXPECT_NE(testing_support::slurp(file("e.json")).find("\"policies\""), std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace eplb
