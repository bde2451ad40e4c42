// Writers: every format reads back exactly what was written.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "eplb/placement_io.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace eplb {
namespace {

using testing::fails_with;
using testing::TempDir;

// Values that stress exactness: fractions, extremes, big integers, denormals.
std::vector<double> tricky_values(size_t count) {
  std::vector<double> pool{0,
                           1,
                           0.1,
                           1.0 / 3.0,
                           123456789.123456789,
                           1e-300,
                           std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::max(),
                           9007199254740992.0,
                           1152921504606846976.0,
                           1e22,
                           2.5e-8,
                           4096,
                           65535.99999999999};
  std::vector<double> values(count);
  uint64_t state = 12345;
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    values[i] = i < pool.size() ? pool[i] : double(state >> 11) * 0x1.0p-40;
  }
  return values;
}

TEST(RoundTrip, MatrixInEveryFormatIsExact) {
  TempDir dir;
  LoadMatrix load(5, 7);
  load.values = tricky_values(35);
  for (const char* name : {"m.npy", "m.csv", "m.json"}) {
    std::string path = dir.file(name);
    ASSERT_TRUE(write_load_file(path, load).is_ok()) << name;
    auto back = read_load_file(path, 7);
    ASSERT_TRUE(back.is_ok()) << name << ": " << back.status().to_string();
    EXPECT_EQ(back->num_layers, 5) << name;
    EXPECT_EQ(back->num_experts, 7) << name;
    for (size_t i = 0; i < load.values.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint64_t>(back->values[i]), std::bit_cast<uint64_t>(load.values[i]))
          << name << " value " << i << " " << load.values[i] << " vs " << back->values[i];
  }
}

TEST(RoundTrip, TraceInNpyAndJsonIsExact) {
  TempDir dir;
  LoadTrace trace;
  trace.num_steps = 4;
  trace.num_layers = 3;
  trace.num_experts = 5;
  trace.values = tricky_values(60);
  for (const char* name : {"t.npy", "t.json"}) {
    std::string path = dir.file(name);
    ASSERT_TRUE(write_load_trace(path, trace).is_ok()) << name;
    auto back = read_load_trace(path);
    ASSERT_TRUE(back.is_ok()) << name << ": " << back.status().to_string();
    EXPECT_EQ(back->num_steps, 4);
    EXPECT_EQ(back->num_layers, 3);
    EXPECT_EQ(back->num_experts, 5);
    EXPECT_EQ(back->values, trace.values) << name;
  }
}

TEST(RoundTrip, SmallIntegersAreWrittenAsIntegersInText) {
  TempDir dir;
  LoadMatrix load(2, 2);
  load.values = {0, 12, 345, 6789};
  ASSERT_TRUE(write_load_file(dir.file("i.csv"), load).is_ok());
  EXPECT_EQ(TempDir::read(dir.file("i.csv")), "0,12\n345,6789\n");
  ASSERT_TRUE(write_load_file(dir.file("i.json"), load).is_ok());
  EXPECT_EQ(TempDir::read(dir.file("i.json")), "[\n  [0, 12],\n  [345, 6789]\n]\n");
}

TEST(RoundTrip, WritersRefuseWhatReadersWouldRefuse) {
  TempDir dir;
  LoadTrace trace;
  trace.num_steps = 2;
  trace.num_layers = 1;
  trace.num_experts = 2;
  trace.values = {1, 2, 3, 4};
  EXPECT_TRUE(fails_with(write_load_trace(dir.file("t.csv"), trace), Code::InvalidArgument, {"t.csv", "2 steps"}));
  trace.num_steps = 1;
  trace.values = {1, 2};
  EXPECT_TRUE(write_load_trace(dir.file("one.csv"), trace).is_ok());
  LoadMatrix load(1, 2);
  load.values = {1, NAN};
  EXPECT_TRUE(fails_with(write_load_file(dir.file("nan.npy"), load), Code::InvalidArgument, {"nan.npy", "nan"}));
  load.values = {1, -1};
  EXPECT_TRUE(fails_with(write_load_file(dir.file("neg.csv"), load), Code::InvalidArgument, {"-1"}));
  load.values = {1, 2};
  EXPECT_TRUE(fails_with(write_load_file(dir.file("x.txt"), load), Code::InvalidArgument, {"'.txt'"}));
  EXPECT_TRUE(fails_with(write_load_file(dir.file("no/such/dir/x.npy"), load), Code::IoError, {"x.npy"}));
  LoadMatrix empty;
  EXPECT_TRUE(fails_with(write_load_file(dir.file("e.npy"), empty), Code::InvalidArgument, {"0 x 0"}));
}

TEST(RoundTrip, LargeNpyHeaderUsesFormat2) {
  // encode_npy_float64 switches to format 2.0 when the header exceeds 64 KiB; a
  // 20000-dimensional shape is the only way to get there, and the reader must
  // refuse it cleanly (more than 32 dimensions), not crash.
  std::vector<size_t> shape(30000, 1);
  std::vector<uint8_t> bytes = encode_npy_float64(shape, {1.0});
  ASSERT_GT(bytes.size(), 65536u);
  EXPECT_EQ(bytes[6], 2);
  EXPECT_TRUE(fails_with(parse_npy(bytes, "wide.npy"), Code::ParseError, {"32 dimensions"}));
}

}  // namespace
}  // namespace eplb
