// libFuzzer target: the .csv load-file parser (untrusted text).
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto result = eplb::parse_load_csv(text, "fuzz.csv");
  eplb::fuzz::check_trace(result);
  if (result.is_ok()) {
    if (result->num_steps != 1) eplb::fuzz::finding("a CSV file gave more than one step");
    if (result->values.size() < 4096) eplb::fuzz::check_npy_round_trip(*result);
  }
  return 0;
}
