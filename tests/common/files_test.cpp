// files_test.cpp - common/files.h: an AtomicFile writes to
// temporary_path(path, its pid) until commit() renames it to `path`; the
// name a launcher looks for is the one the writer used.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../placement/temp_dir.h"
#include "common/files.h"

namespace eplb {
namespace {

TEST(Files, TemporaryPathIsThePathWithTmpAndThePid) {
  EXPECT_EQ(files::temporary_path("/a/r.json", 4242), "/a/r.json.tmp.4242");
  EXPECT_EQ(files::temporary_path("m.prom", 1), "m.prom.tmp.1");
}

TEST(Files, AnAtomicFileWritesToItsTemporaryPathUntilCommit) {
  testing::TempDir dir;
  const std::string path = dir.file("out.json");
  const std::string temporary = files::temporary_path(path, ::getpid());
  auto file = files::AtomicFile::create(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_TRUE(file->append("{}"));
  EXPECT_TRUE(std::filesystem::is_regular_file(temporary));
  EXPECT_FALSE(std::filesystem::exists(path));
  ASSERT_TRUE(file->commit());
  EXPECT_FALSE(std::filesystem::exists(temporary));
  EXPECT_EQ(testing::TempDir::read(path), "{}");
}

}  // namespace
}  // namespace eplb
