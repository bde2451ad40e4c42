// The wire-format checksum of common/bytes.h.
#include "bytes.h"

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

}  // namespace eplb::bytes
