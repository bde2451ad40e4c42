// libFuzzer target for the agent metadata parser (src/xfer/metadata.cpp) and
// Agent::load_metadata. Each input is decoded twice: as is (mostly rejected
// by the checksum) and with its total length and checksum fixed up, so the
// structural checks behind the checksum are reached. Whatever decodes must
// re-encode to the same bytes; decoded with a secret, nothing unsealed does.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../src/xfer/metadata.h"
#include "eplb/xfer.h"

namespace {

void check_round_trip(const std::vector<uint8_t>& bytes) {
  auto decoded = eplb::xfer::decode_metadata(bytes);
  if (!decoded) {
    if (decoded.status().code() != eplb::Code::Mismatch) std::abort();
    return;
  }
  // A sealed message decodes without a secret (the seal is not checked) and
  // re-encodes unsealed: only unsealed ones must come back byte for byte.
  if ((bytes[6] & eplb::xfer::kMetadataSealed) != 0) return;
  auto encoded = eplb::xfer::encode_metadata(*decoded);
  if (!encoded || *encoded != bytes) std::abort();
}

eplb::xfer::Agent& agent() {
  static std::unique_ptr<eplb::xfer::Agent> instance = [] {
    eplb::xfer::AgentConfig config;
    config.name = "fuzz";
    config.backend = "loopback";
    return std::move(eplb::xfer::Agent::create(config)).value();
  }();
  return *instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  check_round_trip(bytes);
  if (bytes.size() >= 20) {
    uint32_t total = static_cast<uint32_t>(bytes.size());
    for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<uint8_t>(total >> (8 * i));
    size_t end = bytes.size() - 8;
    uint64_t checksum = eplb::xfer::metadata_checksum({bytes.data(), end});
    for (int i = 0; i < 8; ++i) bytes[end + i] = static_cast<uint8_t>(checksum >> (8 * i));
    check_round_trip(bytes);
    // With a job's secret only a message sealed under it decodes: random
    // bytes never do (and never crash the seal check).
    auto sealed = eplb::xfer::decode_metadata(bytes, "fuzz-secret");
    if (sealed || sealed.status().code() != eplb::Code::Mismatch) std::abort();
    auto loaded = agent().load_metadata(bytes);
    if (loaded) (void)agent().invalidate_peer(*loaded);
  }
  return 0;
}
