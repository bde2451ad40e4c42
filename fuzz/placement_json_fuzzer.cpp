// libFuzzer target: the placement JSON parser (untrusted text). An accepted
// placement must validate against its topology and survive a write/read round trip.
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto result = eplb::parse_placement_json(text, "fuzz.json");
  if (!result.is_ok()) {
    if (result.status().message().empty()) eplb::fuzz::finding("an error without a message");
    return 0;
  }
  if (!result->topology.validate().is_ok()) eplb::fuzz::finding("an invalid topology was accepted");
  if (!result->placement.validate_against(result->topology).is_ok()) eplb::fuzz::finding("an invalid placement was accepted");
  std::string again = eplb::placement_to_json(result->placement, result->topology);
  auto reparsed = eplb::parse_placement_json(again, "round-trip");
  if (!reparsed.is_ok()) eplb::fuzz::finding("a written placement does not parse");
  if (!(reparsed->placement == result->placement) || !(reparsed->topology == result->topology))
    eplb::fuzz::finding("a written placement reads back differently");
  return 0;
}
