// Placement JSON: exact round trips, extra keys, and every bad-file case.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "eplb/placement_io.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace eplb {
namespace {

using testing::fails_with;
using testing::TempDir;

const Topology kTiny{2, 12, 16, 4, 2, 8};

// A placement with replicas in a non-trivial order (as a policy would emit them).
Placement replicated_placement() {
  std::vector<int32_t> phy2log;
  for (int l = 0; l < 2; ++l)
    for (int s = 0; s < 16; ++s) phy2log.push_back(s < 12 ? (s * 5 + l) % 12 : (s * 7) % 3);
  auto placement = Placement::from_phy2log(2, 12, 16, phy2log);
  EXPECT_TRUE(placement.is_ok()) << placement.status().to_string();
  return *placement;
}

TEST(PlacementJson, RoundTripIsExact) {
  TempDir dir;
  for (const Placement& placement : {default_placement(kTiny), replicated_placement()}) {
    std::string path = dir.file("p.json");
    ASSERT_TRUE(write_placement_file(path, placement, kTiny, R"({"policy": "deepseek", "metrics": {"b": 0.5}})")
                    .is_ok());
    auto back = read_placement_file(path);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->topology, kTiny);
    EXPECT_EQ(back->placement, placement);
    auto document = nlohmann::json::parse(TempDir::read(path));
    EXPECT_EQ(document["policy"], "deepseek");
    EXPECT_EQ(document["metrics"]["b"], 0.5);
    EXPECT_EQ(document["topology"]["ranks"], 8);
    EXPECT_EQ(document["phy2log"].size(), 2u);
    EXPECT_EQ(document["log2phy"][0].size(), 12u);
    EXPECT_EQ(document["logcnt"][1].size(), 12u);
  }
}

TEST(PlacementJson, DeepSeekShapeRoundTrip) {
  Topology topology{58, 256, 288, 8, 4, 32};
  Placement placement = default_placement(topology);
  std::string text = placement_to_json(placement, topology);
  auto back = parse_placement_json(text, "big.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->placement, placement);
  EXPECT_LT(text.size(), 400000u);  // one row per line, no pretty-printing blow-up
}

TEST(PlacementJson, ExtraKeysCannotOverrideTheMapping) {
  TempDir dir;
  Placement placement = default_placement(kTiny);
  EXPECT_TRUE(fails_with(write_placement_file(dir.file("a.json"), placement, kTiny, "[1]"), Code::InvalidArgument,
                         {"a.json", "JSON object"}));
  EXPECT_TRUE(fails_with(write_placement_file(dir.file("a.json"), placement, kTiny, "{not json"),
                         Code::InvalidArgument, {"JSON object"}));
  EXPECT_TRUE(fails_with(write_placement_file(dir.file("a.json"), placement, kTiny, R"({"phy2log": 1})"),
                         Code::InvalidArgument, {"reserved"}));
  // placement_to_json itself drops a reserved key rather than emitting a duplicate.
  auto back = parse_placement_json(placement_to_json(placement, kTiny, R"({"logcnt": 0, "x": 1})"), "p");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  Topology other{2, 12, 12, 4, 2, 4};
  EXPECT_TRUE(fails_with(write_placement_file(dir.file("a.json"), placement, other), Code::Mismatch,
                         {"a.json", "refusing"}));
}

// Replaces the JSON at `pointer` in a valid document and parses the result.
Result<PlacementFile> mutated(const std::string& pointer, const nlohmann::json& value) {
  auto document = nlohmann::json::parse(placement_to_json(replicated_placement(), kTiny));
  document[nlohmann::json::json_pointer(pointer)] = value;
  return parse_placement_json(document.dump(), "p.json");
}

Result<PlacementFile> erased(const std::string& key) {
  auto document = nlohmann::json::parse(placement_to_json(replicated_placement(), kTiny));
  document.erase(key);
  return parse_placement_json(document.dump(), "p.json");
}

TEST(PlacementJson, BadFiles) {
  using nlohmann::json;
  EXPECT_TRUE(fails_with(parse_placement_json("", "p.json"), Code::ParseError, {"p.json", "empty"}));
  EXPECT_TRUE(fails_with(parse_placement_json("{\"topology\": ", "p.json"), Code::ParseError, {"p.json", "byte"}));
  EXPECT_TRUE(fails_with(parse_placement_json("[1, 2]", "p.json"), Code::ParseError, {"top level is array"}));
  EXPECT_TRUE(fails_with(parse_placement_json(std::string(100, '[') + std::string(100, ']'), "p.json"),
                         Code::ParseError, {"byte 32", "nested deeper"}));
  EXPECT_TRUE(fails_with(erased("topology"), Code::ParseError, {"p.json", "topology: missing"}));
  EXPECT_TRUE(fails_with(erased("phy2log"), Code::ParseError, {"phy2log: missing"}));
  EXPECT_TRUE(fails_with(erased("log2phy"), Code::ParseError, {"log2phy: missing"}));
  EXPECT_TRUE(fails_with(erased("logcnt"), Code::ParseError, {"logcnt: missing"}));
  EXPECT_TRUE(fails_with(mutated("/topology", json(5)), Code::ParseError, {"topology: expected an object"}));
  EXPECT_TRUE(fails_with(mutated("/topology/ranks", json("8")), Code::ParseError,
                         {"topology.ranks", "expected an integer"}));
  EXPECT_TRUE(fails_with(mutated("/topology/slots", json(2.5)), Code::ParseError, {"topology.slots"}));
  EXPECT_TRUE(fails_with(mutated("/topology/layers", json(1ll << 40)), Code::ParseError,
                         {"topology.layers", "out of range"}));
  EXPECT_TRUE(fails_with(mutated("/topology/ranks", json(3)), Code::ParseError,
                         {"p.json", "topology", "multiple of ranks"}));
  EXPECT_TRUE(fails_with(mutated("/topology/slots", json(1 << 30)), Code::ParseError, {"topology"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log", json::array({json::array()})), Code::ParseError,
                         {"phy2log", "holds 1 entries, expected 2"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log/1", json::array({1, 2})), Code::ParseError,
                         {"phy2log[1]", "holds 2 entries, expected 16"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log/1/7", json("3")), Code::ParseError, {"phy2log[1][7]", "integer"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log/1/7", json(1.5)), Code::ParseError, {"phy2log[1][7]"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log/1/7", json(5000000000ll)), Code::ParseError,
                         {"phy2log[1][7]", "out of range"}));
  EXPECT_TRUE(fails_with(mutated("/phy2log/1/7", json(99)), Code::ParseError, {"p.json", "inconsistent", "layer 1"}));
  EXPECT_TRUE(fails_with(mutated("/logcnt/0/3", json(7)), Code::ParseError, {"inconsistent", "logcnt"}));
  EXPECT_TRUE(fails_with(mutated("/logcnt/0", json::object()), Code::ParseError, {"logcnt[0]", "expected an array"}));
  EXPECT_TRUE(fails_with(mutated("/log2phy/1/4", json::array({4})), Code::ParseError,
                         {"log2phy[1][4]", "replica width"}));
  EXPECT_TRUE(fails_with(mutated("/log2phy/0/0", json::array()), Code::ParseError, {"log2phy[0][0]", "[1, slots"}));
  EXPECT_TRUE(fails_with(mutated("/log2phy/1/2", json(1)), Code::ParseError, {"log2phy[1][2]", "array of slots"}));
  EXPECT_TRUE(fails_with(mutated("/log2phy/1/2/1", json(nullptr)), Code::ParseError, {"log2phy[1][2][1]"}));
  auto swapped = nlohmann::json::parse(placement_to_json(replicated_placement(), kTiny));
  std::swap(swapped["log2phy"][0][0][0], swapped["log2phy"][0][1][0]);
  EXPECT_TRUE(fails_with(parse_placement_json(swapped.dump(), "p.json"), Code::ParseError,
                         {"inconsistent", "log2phy"}));
  TempDir dir;
  EXPECT_TRUE(fails_with(read_placement_file(dir.file("missing.json")), Code::IoError, {"missing.json"}));
}

}  // namespace
}  // namespace eplb
