// expert_content.h - expert rows for the migrate tests, made here: the
// migrate tests link only the migrate module (not sim), so that the
// executor can be shown to move bytes it knows nothing about.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "eplb/migrate.h"

namespace eplb::testing {

// Three tensors adding up to `bytes` (>= 16): 1/2, 1/4 and the rest.
inline std::vector<TensorSpec> three_tensors(uint64_t bytes) {
  return {{"gate_up", bytes / 2}, {"down", bytes / 4}, {"scales", bytes - bytes / 2 - bytes / 4}};
}

// Byte `offset` of tensor `tensor` of expert `expert` in layer `layer`
// (0 for an empty slot, expert < 0): a splitmix64 mix, so different
// (layer, expert, tensor) differ in almost every byte.
inline uint8_t content_byte(int layer, int expert, int tensor, uint64_t offset) {
  if (expert < 0) return 0;
  uint64_t x = (uint64_t(layer) << 40) ^ (uint64_t(expert) << 20) ^ uint64_t(tensor) ^ ((offset / 8) << 48);
  x += 0x9E3779B97F4A7C15ull * (offset / 8 + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint8_t(x >> (8 * (offset % 8)));
}

// Writes every row of `layer` (-1: all layers) with its expert's content.
inline void fill_rows(ExpertStore& store, const Placement& placement, int layer = -1) {
  for (int l = 0; l < store.layout().num_layers(); ++l) {
    if (layer >= 0 && l != layer) continue;
    for (int s = 0; s < store.slots_per_rank(); ++s)
      for (int t = 0; t < int(store.layout().layers[l].size()); ++t) {
        const int expert = placement.phy2log(l, store.first_slot() + s);
        uint8_t* row = store.row(l, s, t);
        for (uint64_t i = 0; i < store.row_bytes(l, t); ++i) row[i] = content_byte(l, expert, t, i);
      }
    store.forget_checksums(l);
  }
}

// Ok, or the first row that does not hold its expert's content.
inline Status verify_rows(const ExpertStore& store, const Placement& placement) {
  for (int l = 0; l < store.layout().num_layers(); ++l)
    for (int s = 0; s < store.slots_per_rank(); ++s)
      for (int t = 0; t < int(store.layout().layers[l].size()); ++t) {
        const int slot = store.first_slot() + s, expert = placement.phy2log(l, slot);
        const uint8_t* row = store.row(l, s, t);
        for (uint64_t i = 0; i < store.row_bytes(l, t); ++i)
          if (row[i] != content_byte(l, expert, t, i))
            return error(Code::Mismatch, "layer " + std::to_string(l) + " slot " + std::to_string(slot) +
                                             " should hold expert " + std::to_string(expert) + ", tensor " +
                                             std::to_string(t) + " differs at byte " + std::to_string(i));
      }
  return Status::ok();
}

}  // namespace eplb::testing
