// The wire-format checksum of common/bytes.h.
#include "bytes.h"

#include <bit>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__)
// libxxhash's run-time dispatch (Debian builds it in): XXH3_64bits and
// XXH3_64bits_update become their _dispatch versions, which pick SSE2, AVX2
// or AVX-512 by the CPU. Same hashes, 2-3x faster than the SSE2-only
// default where AVX2 exists (a checksum pass then costs less than a copy).
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>

namespace eplb::bytes {

uint64_t checksum(std::span<const uint8_t> data) { return XXH3_64bits(data.data(), data.size()); }

uint64_t checksum(std::string_view data) { return XXH3_64bits(data.data(), data.size()); }

uint64_t copy_with_checksum(uint8_t* target, const uint8_t* source, size_t length) {
  // Small enough that a piece is still in L2 when it is hashed, large enough
  // that the streaming state's per-call cost does not show.
  constexpr size_t kPiece = 64 * 1024;
  if (length <= kPiece) {
    std::memcpy(target, source, length);
    return XXH3_64bits(target, length);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t done = 0; done < length; done += kPiece) {
    const size_t piece = std::min(kPiece, length - done);
    std::memcpy(target + done, source + done, piece);
    XXH3_64bits_update(&state, target + done, piece);
  }
  return XXH3_64bits_digest(&state);
}

uint64_t dev64_digest(std::span<const uint8_t> data) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull, kSalt = 0xC2B2AE3D27D4EB4Full;
  const size_t words = data.size() / 4;
  // Eight independent lanes (word i goes to lane i % 8, each lane's multiplier
  // stepped by 16 * golden), so that the multiplies do not wait on one another
  // and the compiler can vectorize them; the sum modulo 2^64 is the same.
  constexpr size_t kLanes = 8;
  uint64_t lane_acc[kLanes] = {}, lane_mult[kLanes];
  for (size_t l = 0; l < kLanes; ++l) lane_mult[l] = (2 * l + 1) * kGolden;
  const size_t bulk = words - words % kLanes;
  // The lanes read their words with memcpy (3x load<>'s byte loop here),
  // which is little-endian only on a little-endian host.
  static_assert(std::endian::native == std::endian::little, "eplb-dev64's lanes read words in host order");
  for (size_t i = 0; i < bulk; i += kLanes) {
    uint32_t w[kLanes];
    std::memcpy(w, data.data() + 4 * i, sizeof(w));
    for (size_t l = 0; l < kLanes; ++l) {
      lane_acc[l] += uint64_t(w[l]) * lane_mult[l];
      lane_mult[l] += 2 * kLanes * kGolden;
    }
  }
  uint64_t acc = 0;
  for (size_t l = 0; l < kLanes; ++l) acc += lane_acc[l];
  uint64_t multiplier = (2 * bulk + 1) * kGolden;  // (2i + 1) * golden, stepped by 2 * golden
  const uint64_t step = 2 * kGolden;
  for (size_t i = bulk; i < words; ++i, multiplier += step) acc += uint64_t(load<uint32_t>(data.data() + 4 * i)) * multiplier;
  if (data.size() % 4) {
    uint8_t tail[4] = {0, 0, 0, 0};
    std::memcpy(tail, data.data() + 4 * words, data.size() % 4);
    acc += uint64_t(load<uint32_t>(tail)) * multiplier;
  }
  uint64_t x = acc ^ (uint64_t(data.size()) * kSalt);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace eplb::bytes
