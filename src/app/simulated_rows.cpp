// Synthetic expert weights in an expert store: fill_simulated writes every
// row with sim's bytes for the expert the placement maps it to,
// verify_simulated checks them byte for byte.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "eplb/app.h"

namespace eplb {
namespace {

// Compares one live row with the synthetic bytes of `expert`; the first
// differing byte, or -1.
int64_t first_difference(const uint8_t* live, uint64_t bytes, int layer, int expert, int tensor,
                         std::vector<uint8_t>& expected) {
  for (uint64_t offset = 0; offset < bytes; offset += expected.size()) {
    const uint64_t length = std::min<uint64_t>(expected.size(), bytes - offset);
    std::span<uint8_t> want(expected.data(), length);
    if (expert < 0) std::memset(want.data(), 0, length);
    else fill_expert_bytes(layer, expert, tensor, offset, want);
    if (std::memcmp(live + offset, want.data(), length) == 0) continue;
    uint64_t first = offset;
    while (live[first] == want[first - offset]) ++first;
    return int64_t(first);
  }
  return -1;
}

}  // namespace

void fill_simulated(ExpertStore& store, const Placement& placement, int layer) {
  const int tensors = int(store.layout().layers[layer].size());
  for (int s = 0; s < store.slots_per_rank(); ++s) {
    const int expert = placement.phy2log(layer, store.first_slot() + s);
    for (int t = 0; t < tensors; ++t) {
      std::span<uint8_t> out(store.row(layer, s, t), store.row_bytes(layer, t));
      if (expert < 0) std::memset(out.data(), 0, out.size());
      else fill_expert_bytes(layer, expert, t, 0, out);
      store.remember_checksum(layer, s, t, bytes::checksum(out));
    }
  }
}

void fill_simulated(ExpertStore& store, const Placement& placement) {
  for (int l = 0; l < store.layout().num_layers(); ++l) fill_simulated(store, placement, l);
}

Status verify_simulated(const ExpertStore& store, const Placement& placement) {
  const StoreLayout& layout = store.layout();
  if (placement.num_layers() != layout.num_layers() ||
      placement.num_slots() < store.first_slot() + store.slots_per_rank())
    return error(Code::InvalidArgument,
                 fmt::format("verify: the placement ({} layers, {} slots) does not cover this store ({}, first slot "
                             "{})",
                             placement.num_layers(), placement.num_slots(), layout.to_string(), store.first_slot()));
  std::vector<uint8_t> expected(256 * 1024);
  for (int l = 0; l < layout.num_layers(); ++l)
    for (int s = 0; s < store.slots_per_rank(); ++s) {
      const int slot = store.first_slot() + s, expert = placement.phy2log(l, slot);
      for (int t = 0; t < int(layout.layers[l].size()); ++t) {
        const uint64_t bytes = store.row_bytes(l, t);
        const int64_t at = first_difference(store.row(l, s, t), bytes, l, expert, t, expected);
        if (at >= 0)
          return error(Code::Mismatch,
                       fmt::format("verify: layer {} slot {} should hold expert {} but tensor '{}' differs at byte "
                                   "{} of {}",
                                   l, slot, expert, layout.layers[l][t].name, at, bytes));
      }
    }
  return Status::ok();
}

}  // namespace eplb
