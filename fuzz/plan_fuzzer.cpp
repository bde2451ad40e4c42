// Fuzzes plan_layer with arbitrary small topologies and arbitrary (often
// invalid) old/new phy2log arrays: it must either refuse with a clear error
// exactly when the input is invalid, or return a plan that satisfies every
// rule checked by tests/plan/plan_check.h.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../tests/plan/plan_check.h"
#include "eplb/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int nodes = 1 + data[0] % 4;
  const int ranks_per_node = 1 + data[1] % 3;
  const int slots_per_rank = 1 + data[2] % 4;
  const int ranks = nodes * ranks_per_node;
  const int slots = ranks * slots_per_rank;
  const int experts = 1 + data[3] % slots;
  const eplb::Topology topology{1, experts, slots, 1, nodes, ranks};
  data += 4;
  size -= 4;
  // Values in [-1, experts]: both ends out of range.
  auto value = [&](size_t i) { return i < size ? int32_t(data[i] % (experts + 2)) - 1 : int32_t(i % size_t(experts)); };
  std::vector<int32_t> old_layer(static_cast<size_t>(slots)), new_layer(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    old_layer[size_t(s)] = value(size_t(s));
    new_layer[size_t(s)] = value(size_t(slots + s));
  }
  bool valid = true;
  std::vector<bool> in_old(size_t(experts), false);
  for (int32_t e : old_layer) {
    if (e < 0 || e >= experts) valid = false;
    else in_old[size_t(e)] = true;
  }
  for (int32_t e : new_layer)
    if (e < 0 || e >= experts || !in_old[size_t(e)]) valid = false;

  auto plan = eplb::plan_layer(old_layer, new_layer, topology, 0);
  if (plan.is_ok() != valid) {
    std::fprintf(stderr, "plan_layer %s a %s input: %s\n", plan.is_ok() ? "accepted" : "refused",
                 valid ? "valid" : "invalid", plan.status().to_string().c_str());
    std::abort();
  }
  if (!plan.is_ok()) {
    if (plan.status().code() != eplb::Code::InvalidArgument || plan.status().message().empty()) std::abort();
    return 0;
  }
  const std::string violation = eplb::plan_test::check_plan(*plan, old_layer, new_layer, topology);
  if (!violation.empty()) {
    std::fprintf(stderr, "%s\n%s", violation.c_str(), eplb::plan_test::dump(*plan).c_str());
    std::abort();
  }
  return 0;
}
