// libFuzzer target: the .npy load-file parser (untrusted bytes).
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto result = eplb::parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
  eplb::fuzz::check_trace(result);
  if (result.is_ok() && result->values.size() < 4096) eplb::fuzz::check_npy_round_trip(*result);
  return 0;
}
