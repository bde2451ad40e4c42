// Input files as an attacker or a careless user gives them (issue 17 rows 3
// and 4): a FIFO, a device, a directory, a huge or growing file. Each is a
// clear error at once, without blocking and without reading without bound.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "eplb/placement_io.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace eplb {
namespace {

using testing::fails_with;
using testing::TempDir;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

long peak_rss_kib() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(InputFiles, FifoIsRefusedAtOnceForEveryReader) {
  TempDir dir;
  for (const char* name : {"load.npy", "load.csv", "load.json", "placement.json"}) {
    const std::string path = dir.file(name);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    const auto start = std::chrono::steady_clock::now();
    if (std::string(name) == "placement.json")
      EXPECT_TRUE(fails_with(read_placement_file(path), Code::IoError, {name, "is a FIFO", "regular file"}));
    else
      EXPECT_TRUE(fails_with(read_load_trace(path), Code::IoError, {name, "is a FIFO", "regular file"}));
    EXPECT_LT(seconds_since(start), 1.0) << name;
  }
}

TEST(InputFiles, DevZeroBehindALoadNameIsRefusedWithoutGrowth) {
  TempDir dir;
  const long rss_before = peak_rss_kib();
  for (const char* name : {"zero.npy", "zero.json", "zero.csv"}) {
    const std::string path = dir.file(name);
    std::filesystem::create_symlink("/dev/zero", path);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(fails_with(read_load_trace(path), Code::IoError, {name, "a character device"}));
    EXPECT_LT(seconds_since(start), 1.0) << name;
  }
  EXPECT_TRUE(fails_with(read_placement_file("/dev/urandom"), Code::IoError, {"/dev/urandom", "a character device"}));
  EXPECT_LT(peak_rss_kib() - rss_before, 16 * 1024);
}

TEST(InputFiles, DirectoryIsRefused) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("d.json"));
  EXPECT_TRUE(fails_with(read_load_trace(dir.file("d.json")), Code::IoError, {"d.json", "is a directory"}));
  EXPECT_TRUE(fails_with(read_placement_file(dir.file("d.json")), Code::IoError, {"is a directory"}));
}

TEST(InputFiles, TextLargerThanTheLimitIsRefusedBeforeReading) {
  TempDir dir;
  const std::string small = dir.write("small.csv", "1,2\n3,4\n");
  EXPECT_TRUE(read_load_trace(small, 8).is_ok());
  EXPECT_TRUE(fails_with(read_load_trace(small, 7), Code::IoError,
                         {"small.csv", "is 8 bytes", "text input limit of 7 bytes", "max-input-bytes"}));
  // A sparse 64 GiB .json: refused from its size, nothing read.
  const std::string huge = dir.file("huge.json");
  { std::ofstream(huge) << "["; }
  ASSERT_EQ(::truncate(huge.c_str(), off_t(64) << 30), 0);
  const long rss_before = peak_rss_kib();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(fails_with(read_load_trace(huge), Code::IoError, {"huge.json", "68719476736 bytes", "1073741824"}));
  EXPECT_TRUE(fails_with(read_placement_file(huge), Code::IoError, {"68719476736 bytes"}));
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_LT(peak_rss_kib() - rss_before, 16 * 1024);
}

TEST(InputFiles, NpyIsReadNoFurtherThanItsHeaderDeclares) {
  TempDir dir;
  const std::string path = dir.file("trace.npy");
  ASSERT_TRUE(write_load_trace(path, LoadTrace{1, 2, 3, {1, 2, 3, 4, 5, 6}}).is_ok());
  ASSERT_TRUE(read_load_trace(path).is_ok());
  const off_t exact = off_t(std::filesystem::file_size(path));
  // The same header followed by 64 GiB (sparse): refused from the size alone.
  ASSERT_EQ(::truncate(path.c_str(), off_t(64) << 30), 0);
  const long rss_before = peak_rss_kib();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(fails_with(read_load_trace(path), Code::ParseError,
                         {"trace.npy", std::to_string((int64_t(64) << 30) - exact).c_str(), "unexpected bytes"}));
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_LT(peak_rss_kib() - rss_before, 16 * 1024);
  // Cut short: the truncation is named, as from bytes in memory.
  ASSERT_EQ(::truncate(path.c_str(), exact - 8), 0);
  EXPECT_TRUE(fails_with(read_load_trace(path), Code::ParseError, {"truncated"}));
  ASSERT_EQ(::truncate(path.c_str(), 9), 0);
  EXPECT_TRUE(fails_with(read_load_trace(path), Code::ParseError, {"truncated"}));
}

TEST(InputFiles, NpyHeaderClaimingMoreThanAMebibyteIsRefused) {
  TempDir dir;
  std::string bytes = "\x93NUMPY";
  bytes += char(2);
  bytes += char(0);
  bytes += std::string("\x00\x00\x00\x40", 4);  // 1 GiB of header
  const std::string path = dir.write("big_header.npy", bytes);
  ASSERT_EQ(::truncate(path.c_str(), off_t(2) << 30), 0);
  EXPECT_TRUE(fails_with(read_load_trace(path), Code::ParseError, {"big_header.npy", "header claims 1073741824"}));
}

}  // namespace
}  // namespace eplb
