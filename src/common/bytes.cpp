// The wire-format checksum of common/bytes.h.
#include "bytes.h"

#include <xxhash.h>

namespace eplb::bytes {

uint64_t checksum(std::span<const uint8_t> data) { return XXH3_64bits(data.data(), data.size()); }

uint64_t checksum(std::string_view data) { return XXH3_64bits(data.data(), data.size()); }

}  // namespace eplb::bytes
