// Synthetic expert weights: deterministic bytes for (layer, expert, tensor).
//
// Byte p of a tensor is byte p % 8 (little-endian order) of the 64-bit word
// W(p / 8) = mix64(base + (p / 8) * C), where mix64 is the splitmix64
// finalizer (a bijection) and base is an injective function of
// (layer, expert, tensor) for layer < 2^20, expert < 2^24, tensor < 2^20.
// So two different such tuples differ in every aligned 8-byte word at the
// same offset; larger indices are folded in by hashing (distinct with
// overwhelming probability). One mix per 8 bytes: several GB/s per core.
#include <bit>
#include <cstring>

#include "eplb/sim.h"
#include "random.h"

namespace eplb {
namespace {

constexpr uint64_t kWordStep = 0xD1B54A32D192ED03ull;

uint64_t tensor_base(int layer, int expert, int tensor) {
  uint64_t l = uint32_t(layer), e = uint32_t(expert), t = uint32_t(tensor);
  uint64_t packed = (l & 0xFFFFF) << 44 | (e & 0xFFFFFF) << 20 | (t & 0xFFFFF);
  uint64_t high = (l >> 20) << 40 | (e >> 24) << 20 | (t >> 20);  // zero for the common range
  uint64_t base = (packed * sim::kGolden) ^ 0x243F6A8885A308D3ull;  // salt: no all-zero word at (0, 0, 0)
  if (high != 0) base ^= sim::mix64(high + 0x5851F42D4C957F2Dull);
  return base;
}

inline uint64_t word_at(uint64_t base, uint64_t index) { return sim::mix64(base + index * kWordStep); }

}  // namespace

void fill_expert_bytes(int layer, int expert, int tensor, uint64_t offset, std::span<uint8_t> out) {
  const uint64_t base = tensor_base(layer, expert, tensor);
  uint8_t* data = out.data();
  size_t size = out.size(), done = 0;
  uint64_t position = offset;
  if (size == 0) return;
  if (position % 8 != 0) {  // head: the rest of a partly covered word
    uint64_t word = word_at(base, position / 8);
    while (position % 8 != 0 && done < size) {
      data[done++] = uint8_t(word >> (8 * (position % 8)));
      ++position;
    }
  }
  uint64_t index = position / 8;
  size_t words = (size - done) / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t word = word_at(base, index + w);
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(data + done + w * 8, &word, 8);
    } else {
      for (int b = 0; b < 8; ++b) data[done + w * 8 + size_t(b)] = uint8_t(word >> (8 * b));
    }
  }
  done += words * 8;
  if (done < size) {  // tail: the start of one more word
    uint64_t word = word_at(base, index + words);
    for (int b = 0; done < size; ++b) data[done++] = uint8_t(word >> (8 * b));
  }
}

}  // namespace eplb
