// .csv and .json load readers: accepted variants and every bad-file case.
#include <gtest/gtest.h>

#include "eplb/placement_io.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace eplb {
namespace {

using testing::fails_with;

Result<LoadTrace> csv(std::string_view text) { return parse_load_csv(text, "f.csv"); }
Result<LoadTrace> json(std::string_view text) { return parse_load_json(text, "f.json"); }

TEST(Csv, AcceptsCommonVariants) {
  const std::vector<double> expected{1, 2, 3, 4, 5, 6};
  for (std::string_view text : {"1,2,3\n4,5,6\n", "1,2,3\n4,5,6", "1,2,3\r\n4,5,6\r\n", " 1 , 2,\t3 \n4,5 ,6\n\n\n",
                                "\xEF\xBB\xBF" "1,2,3\n4,5,6\n", "1.0,2e0,+3\n0.4e1,5.000,6\n"}) {
    auto trace = csv(text);
    ASSERT_TRUE(trace.is_ok()) << text << ": " << trace.status().to_string();
    EXPECT_EQ(trace->num_steps, 1);
    EXPECT_EQ(trace->num_layers, 2);
    EXPECT_EQ(trace->num_experts, 3);
    EXPECT_EQ(trace->values, expected) << text;
  }
  auto fractions = csv("0.1,1e-300,1e-400\n");
  ASSERT_TRUE(fractions.is_ok()) << fractions.status().to_string();
  EXPECT_EQ(fractions->values[0], 0.1);
  EXPECT_EQ(fractions->values[1], 1e-300);
  EXPECT_EQ(fractions->values[2], 0.0);  // underflows to the nearest double
  auto exact = csv("9007199254740992,1152921504606846976\n");  // 2^53, 2^60: exact
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
  EXPECT_EQ(exact->values[1], 1152921504606846976.0);
}

TEST(Csv, BadFiles) {
  struct Case {
    const char* label;
    std::string_view text;
    std::initializer_list<const char*> needles;
  } cases[] = {
      {"empty", "", {"f.csv", "empty file"}},
      {"blank", " \n\r\n\n", {"empty file"}},
      {"header line", "e0,e1,e2\n1,2,3\n", {"line 1:1", "'e0'", "not a number", "no header"}},
      {"text cell", "1,2,3\n4,five,6\n", {"line 2:3", "'five'", "not a number"}},
      {"two numbers in a cell", "1,2 3\n", {"line 1:3", "'2 3'"}},
      {"empty cell", "1,,3\n", {"line 1:3", "empty cell"}},
      {"trailing comma", "1,2,\n", {"line 1:5", "empty cell"}},
      {"empty line inside", "1,2\n\n3,4\n", {"line 2:1", "empty line"}},
      {"ragged short", "1,2,3\n4,5\n", {"line 2:1", "ragged", "2 values", "line 1 has 3"}},
      {"ragged long", "1,2\n3,4\n5,6,7\n", {"line 3:1", "ragged", "3 values"}},
      {"negative", "1,2\n3,-4\n", {"line 2:3", "-4", "negative"}},
      {"negative zero point five", "-0.5,1\n", {"line 1:1", "negative"}},
      {"nan", "1,nan\n", {"line 1:3", "NaN"}},
      {"NaN caps", "NaN,1\n", {"NaN"}},
      {"inf", "1,inf\n", {"line 1:3", "infinity"}},
      {"Infinity", "Infinity,1\n", {"infinity"}},
      {"overflow", "1,1e999\n", {"line 1:3", "overflows"}},
      {"hex", "0x10,1\n", {"'0x10'", "not a number"}},
      {"double sign", "+-1,1\n", {"not a number"}},
      {"inexact integer", "9007199254740993,1\n", {"line 1:1", "not exactly representable"}},
      {"huge integer", "123456789012345678901234567890,1\n", {"not exactly representable"}},
      {"semicolons", "1;2;3\n", {"'1;2;3'", "not a number"}},
      {"nul byte", std::string_view("1,\0\n", 4), {"line 1:3", "not a number"}},
  };
  for (const auto& c : cases) EXPECT_TRUE(fails_with(csv(c.text), Code::ParseError, c.needles)) << c.label;
}

TEST(Json, AcceptsEveryShape) {
  auto two = json("[[1, 2, 3], [4, 5, 6]]");
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  EXPECT_EQ(two->num_steps, 1);
  EXPECT_EQ(two->num_layers, 2);
  EXPECT_EQ(two->values, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  auto object = json(R"({"model": {"name": "x", "list": [[1], {"a": []}]}, "load": [[1.5, 2e3]], "note": null})");
  ASSERT_TRUE(object.is_ok()) << object.status().to_string();
  EXPECT_EQ(object->values, (std::vector<double>{1.5, 2000}));
  auto three = json(" [ [[1,2],[3,4]], [[5,6],[7,8]], [[9,10],[11,12]] ] \n");
  ASSERT_TRUE(three.is_ok()) << three.status().to_string();
  EXPECT_EQ(three->num_steps, 3);
  EXPECT_EQ(three->num_layers, 2);
  EXPECT_EQ(three->num_experts, 2);
  EXPECT_EQ(three->at(2, 1, 0), 11);
  auto big = json("[[18446744073709551615, 9223372036854775807]]");  // beyond 2^53 and not exact: refused
  EXPECT_FALSE(big.is_ok());
  auto exact = json("[[1152921504606846976]]");  // 2^60 is exact
  ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();
}

TEST(Json, BadFiles) {
  struct Case {
    const char* label;
    std::string_view text;
    std::initializer_list<const char*> needles;
  } cases[] = {
      {"empty", "", {"f.json", "empty file"}},
      {"blank", "  \n", {"empty file"}},
      {"syntax", "[[1, 2], [3, 4]", {"f.json", "byte", "line 1"}},
      {"trailing garbage", "[[1]] x", {"byte"}},
      {"number", "42", {"top level is a number"}},
      {"string", "\"load\"", {"top level is a string"}},
      {"object without load", R"({"Load": [[1]]})", {"no key \"load\""}},
      {"load not an array", R"({"load": 5})", {"load: expected an array"}},
      {"duplicate load", R"({"load": [[1]], "load": [[2]]})", {"twice"}},
      {"empty array", "[]", {"$", "empty array"}},
      {"empty row", "[[]]", {"$[0]", "empty"}},
      {"empty row later", "[[1], []]", {"$[1]", "empty"}},
      {"flat array", "[1, 2, 3]", {"$[0]", "expected an array"}},
      {"ragged", R"({"load": [[1, 2, 3], [4, 5, 6], [7, 8]]})", {"load[2]", "ragged", "2 values", "expected 3"}},
      {"ragged 3-D layers", "[[[1],[2]], [[3]]]", {"$[1]", "ragged", "1 layers"}},
      {"ragged 3-D rows", "[[[1],[2]], [[3],[4,5]]]", {"$[1][1]", "ragged"}},
      {"mixed", "[[1, 2], [[3], [4]]]", {"$[1][0]", "expected a number", "mix"}},
      {"mixed 3-D", "[[[1]], [2]]", {"$[1][0]", "expected an array"}},
      {"too deep", "[[[[1]]]]", {"$[0][0][0]", "expected a number, found an array"}},
      {"string cell", R"({"load": [[1, "2"]]})", {"load[0][1]", "found a string"}},
      {"null cell", "[[1, null]]", {"$[0][1]", "null"}},
      {"bool cell", "[[true]]", {"$[0][0]", "boolean"}},
      {"object cell", "[[{}]]", {"$[0][0]", "an object"}},
      {"negative int", "[[1, 2], [3, -4]]", {"$[1][1]", "-4", "negative"}},
      {"negative float", "[[1, -0.25]]", {"$[0][1]", "negative"}},
      {"overflowing float", "[[1e999]]", {"f.json", "byte"}},
      {"NaN literal", "[[NaN]]", {"byte"}},
      {"inexact integer", "[[9007199254740993]]", {"$[0][0]", "not exactly representable"}},
      {"inexact negative integer", "[[-9007199254740993]]", {"$[0][0]", "negative"}},
  };
  for (const auto& c : cases) EXPECT_TRUE(fails_with(json(c.text), Code::ParseError, c.needles)) << c.label;
}

TEST(Json, DeepNestingDoesNotExhaustTheStack) {
  std::string deep(200000, '[');
  EXPECT_TRUE(fails_with(json(deep), Code::ParseError, {"expected a number"}));
  std::string deep_skipped = "{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + ", \"load\": [[1]]}";
  auto skipped = json(deep_skipped);
  ASSERT_TRUE(skipped.is_ok()) << skipped.status().to_string();
  EXPECT_EQ(skipped->values, std::vector<double>{1});
}

TEST(LoadFiles, ReadLoadFileNamesTheFileForEveryFormat) {
  testing::TempDir dir;
  EXPECT_TRUE(fails_with(read_load_file(dir.write("bad.csv", "1,x\n")), Code::ParseError, {"bad.csv", "line 1:3"}));
  EXPECT_TRUE(fails_with(read_load_file(dir.write("bad.json", "[[1,-1]]")), Code::ParseError,
                         {"bad.json", "$[0][1]"}));
  EXPECT_TRUE(fails_with(read_load_file(dir.write("wide.json", "[[1,2,3]]"), 4), Code::ParseError,
                         {"wide.json", "3 experts", "4"}));
  auto upper = read_load_file(dir.write("upper.CSV", "1,2\n"), 2);
  EXPECT_TRUE(upper.is_ok()) << upper.status().to_string();
}

}  // namespace
}  // namespace eplb
