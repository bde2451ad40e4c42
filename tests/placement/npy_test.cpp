// .npy reader: every supported dtype and version, and every bad-file case.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <sys/stat.h>

#include "eplb/placement_io.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace eplb {
namespace {

using testing::fails_with;
using testing::TempDir;

// A .npy file with the given header dict (padded like NumPy unless `raw`) and data.
std::string npy(const std::string& dict, const std::string& data, int major = 1, bool raw = false) {
  std::string header = dict;
  size_t prefix = major == 1 ? 10 : 12;
  if (!raw) {
    size_t total = ((prefix + header.size() + 1 + 63) / 64) * 64;
    header += std::string(total - prefix - header.size() - 1, ' ') + "\n";
  }
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  for (size_t i = 0; i < prefix - 8; ++i) out += char((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

template <typename T>
std::string le(std::initializer_list<T> values) {
  std::string out;
  for (T value : values) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // the test host is little-endian (checked below)
    out.append(bytes, sizeof(T));
  }
  return out;
}

std::span<const uint8_t> bytes_of(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

Result<LoadTrace> parse(const std::string& text) { return parse_npy(bytes_of(text), "f.npy"); }

TEST(Npy, HostIsLittleEndian) { ASSERT_EQ(std::endian::native, std::endian::little); }

TEST(Npy, ReadsEveryDtype) {
  struct Case {
    std::string descr, data;
  } cases[] = {
      {"<i4", le<int32_t>({1, 2, 3, 4, 5, 2000000000})},
      {"<i8", le<int64_t>({1, 2, 3, 4, 5, 2000000000})},
      {"<f4", le<float>({1, 2, 3, 4, 5, 2000000000.f})},
      {"<f8", le<double>({1, 2, 3, 4, 5, 2000000000})},
      {"<u4", le<uint32_t>({1, 2, 3, 4, 5, 2000000000})},
      {"<u8", le<uint64_t>({1, 2, 3, 4, 5, 2000000000})},
  };
  for (const auto& c : cases) {
    auto trace = parse(npy(dict(c.descr, "(2, 3)"), c.data));
    ASSERT_TRUE(trace.is_ok()) << c.descr << ": " << trace.status().to_string();
    EXPECT_EQ(trace->num_steps, 1);
    EXPECT_EQ(trace->num_layers, 2);
    EXPECT_EQ(trace->num_experts, 3);
    EXPECT_EQ(trace->values, (std::vector<double>{1, 2, 3, 4, 5, 2000000000})) << c.descr;
  }
  auto small = parse(npy(dict("|u1", "(1, 3)"), std::string("\x01\x02\xff", 3)));
  ASSERT_TRUE(small.is_ok()) << small.status().to_string();
  EXPECT_EQ(small->values, (std::vector<double>{1, 2, 255}));
  auto fractional = parse(npy(dict("<f8", "(1, 2)"), le<double>({0.1, 1e-300})));
  ASSERT_TRUE(fractional.is_ok());
  EXPECT_EQ(fractional->values, (std::vector<double>{0.1, 1e-300}));
}

TEST(Npy, ReadsVersions2And3AndOddButValidHeaders) {
  for (int major : {2, 3}) {
    auto trace = parse(npy(dict("<i8", "(1, 2)"), le<int64_t>({7, 8}), major));
    ASSERT_TRUE(trace.is_ok()) << major << ": " << trace.status().to_string();
    EXPECT_EQ(trace->values, (std::vector<double>{7, 8}));
  }
  // Key order, double quotes, no trailing comma, Python 2 longs, no padding.
  auto odd = parse(npy("{\"shape\": (1L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}", le<float>({1, 2}), 1,
                       true));
  ASSERT_TRUE(odd.is_ok()) << odd.status().to_string();
  EXPECT_EQ(odd->values, (std::vector<double>{1, 2}));
}

TEST(Npy, ThreeDimensionalTraceIsSummedByReadLoadFile) {
  TempDir dir;
  std::string path =
      dir.write("trace.npy", npy(dict("<i4", "(3, 2, 2)"), le<int32_t>({1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400})));
  auto trace = read_load_trace(path);
  ASSERT_TRUE(trace.is_ok()) << trace.status().to_string();
  EXPECT_EQ(trace->num_steps, 3);
  EXPECT_EQ(trace->at(1, 1, 0), 30);
  auto matrix = read_load_file(path);
  ASSERT_TRUE(matrix.is_ok()) << matrix.status().to_string();
  EXPECT_EQ(matrix->num_layers, 2);
  EXPECT_EQ(matrix->num_experts, 2);
  EXPECT_EQ(matrix->values, (std::vector<double>{111, 222, 333, 444}));
  LoadMatrix window = trace->sum(1, 5);  // clipped to the trace
  EXPECT_EQ(window.values, (std::vector<double>{110, 220, 330, 440}));
}

TEST(Npy, SumOverflowIsAnError) {
  TempDir dir;
  double big = std::numeric_limits<double>::max();
  std::string path = dir.write("big.npy", npy(dict("<f8", "(2, 1, 1)"), le<double>({big, big})));
  EXPECT_TRUE(fails_with(read_load_file(path), Code::ParseError, {"big.npy", "overflows", "[0][0]"}));
}

TEST(Npy, BadFiles) {
  std::string good_data = le<double>({1, 2, 3, 4});
  struct Case {
    const char* label;
    std::string bytes;
    Code code;
    std::initializer_list<const char*> needles;
  } cases[] = {
      {"empty", "", Code::ParseError, {"f.npy", "empty file"}},
      {"wrong magic", "PK\x03\x04 this is a zip file", Code::ParseError, {"byte 0", "wrong magic"}},
      {"text", "1,2,3\n4,5,6\n", Code::ParseError, {"not a .npy file"}},
      {"truncated magic", "\x93NUM", Code::ParseError, {"truncated"}},
      {"truncated version", "\x93NUMPY\x01", Code::ParseError, {"truncated"}},
      {"version 4.0", std::string("\x93NUMPY\x04\x00\x10\x00", 10) + std::string(16, ' '), Code::Unsupported,
       {"byte 6", "version 4.0"}},
      {"version 1.1", std::string("\x93NUMPY\x01\x01\x10\x00", 10) + std::string(16, ' '), Code::Unsupported,
       {"version 1.1"}},
      {"truncated length", std::string("\x93NUMPY\x02\x00\x10", 9), Code::ParseError, {"header length"}},
      {"header longer than file", std::string("\x93NUMPY\x01\x00\xff\x00", 10) + "{'descr'", Code::ParseError,
       {"byte 8", "truncated", "255"}},
      {"garbage header", npy("hello world", good_data), Code::ParseError, {"byte 10", "bad .npy header", "'{'"}},
      {"unterminated dict", npy("{'descr': '<f8', ", good_data, 1, true), Code::ParseError, {"header ends early"}},
      {"missing shape", npy("{'descr': '<f8', 'fortran_order': False}", good_data), Code::ParseError,
       {"no 'shape'"}},
      {"missing descr", npy("{'shape': (2, 2), 'fortran_order': False}", good_data), Code::ParseError,
       {"no 'descr'"}},
      {"unknown key", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), 'x': 1}", good_data),
       Code::ParseError, {"unknown header key 'x'"}},
      {"duplicate key", npy("{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 2)}", good_data),
       Code::ParseError, {"twice"}},
      {"text after dict", npy(dict("<f8", "(2, 2)") + " junk", good_data), Code::ParseError, {"after the header"}},
      {"bad bool", npy(dict("<f8", "(2, 2)", "false"), good_data), Code::ParseError, {"True or False"}},
      {"bad shape", npy(dict("<f8", "(2, x)"), good_data), Code::ParseError, {"shape tuple"}},
      {"shape not a tuple", npy(dict("<f8", "[2, 2]"), good_data), Code::ParseError, {"'('"}},
      {"complex dtype", npy(dict("<c16", "(2, 2)"), good_data), Code::Unsupported, {"'<c16'", "not supported"}},
      {"half float", npy(dict("<f2", "(2, 2)"), good_data), Code::Unsupported, {"'<f2'"}},
      {"object dtype", npy(dict("|O", "(2, 2)"), good_data), Code::Unsupported, {"'|O'"}},
      {"bool dtype", npy(dict("|b1", "(2, 2)"), good_data), Code::Unsupported, {"'|b1'"}},
      {"string dtype", npy(dict("<U8", "(2, 2)"), good_data), Code::Unsupported, {"'<U8'"}},
      {"structured dtype", npy("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2, 2), }", good_data),
       Code::Unsupported, {"structured"}},
      {"big-endian", npy(dict(">f8", "(2, 2)"), good_data), Code::Unsupported, {"'>f8'", "big-endian"}},
      {"big-endian int", npy(dict(">i4", "(2, 2)"), good_data), Code::Unsupported, {"big-endian"}},
      {"pipe on multi-byte", npy(dict("|f8", "(2, 2)"), good_data), Code::Unsupported, {"'|'"}},
      {"fortran order", npy(dict("<f8", "(2, 2)", "True"), good_data), Code::Unsupported, {"Fortran"}},
      {"1-D", npy(dict("<f8", "(4,)"), good_data), Code::Unsupported, {"1-D", "[L][E]"}},
      {"0-D", npy(dict("<f8", "()"), le<double>({1})), Code::Unsupported, {"0-D"}},
      {"4-D", npy(dict("<f8", "(1, 1, 2, 2)"), good_data), Code::Unsupported, {"4-D"}},
      {"1-tuple without comma", npy(dict("<f8", "(4)"), good_data), Code::ParseError, {"trailing comma"}},
      {"zero dim", npy(dict("<f8", "(0, 4)"), ""), Code::ParseError, {"zero-size"}},
      {"zero dim 3-D", npy(dict("<f8", "(2, 0, 4)"), ""), Code::ParseError, {"zero-size"}},
      {"dimension too large", npy(dict("<f8", "(1, 4294967296)"), good_data), Code::ParseError,
       {"larger than 2147483647"}},
      {"shape overflow", npy(dict("<f8", "(2147483647, 2147483647, 2147483647)"), good_data), Code::ParseError,
       {"overflows"}},
      {"dimension beyond 64 bits", npy(dict("<f8", "(99999999999999999999, 1)"), good_data), Code::ParseError,
       {"64 bits"}},
      {"truncated data", npy(dict("<f8", "(2, 2)"), good_data.substr(0, 27)), Code::ParseError,
       {"truncated", "needs 32 data bytes", "has 27"}},
      {"data for a bigger dtype missing", npy(dict("<f8", "(2, 3)"), good_data), Code::ParseError, {"truncated"}},
      {"trailing bytes", npy(dict("<f8", "(2, 2)"), good_data + "xx"), Code::ParseError, {"byte 160", "2 unexpected"}},
      {"negative int", npy(dict("<i4", "(1, 3)"), le<int32_t>({1, -5, 3})), Code::ParseError,
       {"byte 132", "[0][1]", "-5", "negative"}},
      {"negative float", npy(dict("<f8", "(1, 2)"), le<double>({1, -0.5})), Code::ParseError, {"[0][1]", "negative"}},
      {"NaN", npy(dict("<f4", "(1, 2)"), le<float>({NAN, 1})), Code::ParseError, {"[0][0]", "NaN"}},
      {"Inf", npy(dict("<f8", "(2, 1, 1)"), le<double>({1, INFINITY})), Code::ParseError, {"[1][0][0]", "infinity"}},
      {"inexact int64", npy(dict("<i8", "(1, 1)"), le<int64_t>({(int64_t(1) << 53) + 1})), Code::ParseError,
       {"not exactly representable"}},
  };
  for (const auto& c : cases) EXPECT_TRUE(fails_with(parse(c.bytes), c.code, c.needles)) << c.label;
}

TEST(Npy, MissingFileAndWrongExpertsAndExtension) {
  TempDir dir;
  EXPECT_TRUE(fails_with(read_load_file(dir.file("nope.npy")), Code::IoError, {"nope.npy", "No such file"}));
  EXPECT_TRUE(fails_with(read_load_file(dir.file("")), Code::Unsupported, {"extension"}));
  std::string path = dir.write("m.npy", npy(dict("<f8", "(2, 2)"), le<double>({1, 2, 3, 4})));
  EXPECT_TRUE(read_load_file(path, 2).is_ok());
  EXPECT_TRUE(fails_with(read_load_file(path, 256), Code::ParseError, {"m.npy", "2 experts", "256"}));
  std::string text = dir.write("m.txt", "1,2\n");
  EXPECT_TRUE(fails_with(read_load_file(text), Code::Unsupported, {"m.txt", "'.txt'"}));
  EXPECT_TRUE(fails_with(read_load_file(dir.file(".")), Code::Unsupported, {}));
  // A directory named like a load file.
  std::string directory = dir.file("d.npy");
  ASSERT_EQ(::mkdir(directory.c_str(), 0755), 0);
  EXPECT_TRUE(fails_with(read_load_file(directory), Code::IoError, {"d.npy"}));
}

TEST(Npy, EveryTruncationOfAValidFileFailsCleanly) {
  std::string good = npy(dict("<i8", "(2, 3, 2)"), le<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  ASSERT_TRUE(parse(good).is_ok());
  for (size_t size = 0; size < good.size(); ++size) {
    auto result = parse(good.substr(0, size));
    EXPECT_FALSE(result.is_ok()) << size;
    EXPECT_NE(result.status().message().find("f.npy"), std::string::npos) << result.status().message();
  }
}

TEST(Npy, EncodeFloat64WritesWhatNumpyWrites) {
  std::vector<uint8_t> bytes = encode_npy_float64({2, 3}, {1, 2, 3, 4, 5, 6});
  std::string text(bytes.begin(), bytes.end());
  ASSERT_EQ(text.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(text.substr(10, 59), "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ((10 + (uint8_t(text[8]) | uint8_t(text[9]) << 8)) % 64, 0u) << "data is 64-byte aligned";
  EXPECT_EQ(text[10 + (uint8_t(text[8]) | uint8_t(text[9]) << 8) - 1], '\n');
  auto trace = parse_npy(bytes, "x");
  ASSERT_TRUE(trace.is_ok()) << trace.status().to_string();
  EXPECT_EQ(trace->values, (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace eplb
