// fuzz_check.h - invariants every fuzzer asserts on a successful parse.
// A violated invariant aborts, which libFuzzer reports as a finding.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "eplb/placement_io.h"

namespace eplb::fuzz {

[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

// A parsed trace must have a positive shape, the matching number of values,
// and only finite values >= 0 (never a silently wrong matrix).
inline void check_trace(const Result<LoadTrace>& result) {
  if (!result.is_ok()) {
    if (result.status().message().empty()) finding("an error without a message");
    return;
  }
  const LoadTrace& trace = *result;
  if (trace.num_steps <= 0 || trace.num_layers <= 0 || trace.num_experts <= 0) finding("non-positive shape");
  if (trace.values.size() != size_t(trace.num_steps) * size_t(trace.num_layers) * size_t(trace.num_experts))
    finding("values do not match the shape");
  for (double value : trace.values)
    if (!std::isfinite(value) || value < 0) finding("a non-finite or negative value was accepted");
}

// Encoding an accepted trace as .npy and parsing it again gives the same trace.
inline void check_npy_round_trip(const LoadTrace& trace) {
  std::vector<size_t> shape{size_t(trace.num_steps), size_t(trace.num_layers), size_t(trace.num_experts)};
  std::vector<uint8_t> bytes = encode_npy_float64(shape, trace.values);
  auto again = parse_npy(bytes, "round-trip");
  if (!again.is_ok()) finding("re-encoded trace does not parse");
  if (again->values != trace.values || again->num_steps != trace.num_steps || again->num_layers != trace.num_layers ||
      again->num_experts != trace.num_experts)
    finding("re-encoded trace differs");
}

}  // namespace eplb::fuzz
