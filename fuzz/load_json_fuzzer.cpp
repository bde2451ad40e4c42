// libFuzzer target: the .json load-file parser (untrusted text).
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto result = eplb::parse_load_json(text, "fuzz.json");
  eplb::fuzz::check_trace(result);
  if (result.is_ok() && result->values.size() < 4096) eplb::fuzz::check_npy_round_trip(*result);
  return 0;
}
