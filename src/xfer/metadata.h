// metadata.h - the binary format of an agent's exported metadata.
// Internal to src/xfer/.
//
// Layout (all integers little-endian):
//   magic "EPXM" (4) | version u16 (=2) | flags u16 | total length u32
//   flags: bit 0 (kMetadataComplete) = the export lists every region the
//   agent has registered (export_metadata()); clear for a partial export
//   (export_metadata(regions)). Other bits are refused.
//   agent name      u16 length + bytes (1..255, no NUL)
//   backend name    u16 length + bytes (1..64)
//   connection info u32 length + bytes (<= 1 MiB)
//   region count    u32 (<= 65536)
//   per region: id u64 (!= 0) | address u64 | length u64 (> 0, no overflow)
//               | kind u8 (0 host, 1 device) | device id u32
//               | packed key u32 length + bytes (<= 64 KiB)
//   checksum u64 (XXH3-64 of every byte before it)
//   flags bit 1 (kMetadataSealed): then a 32-byte HMAC-SHA256 of every byte
//   before it under the job's secret follows the checksum (and counts in the
//   total length). XXH3 only catches garbling; the seal authenticates.
// decode_metadata() treats its input as untrusted: every length is checked
// against the remaining bytes and its maximum; any violation is Mismatch
// naming the field and its byte offset.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/status.h"
#include "eplb/xfer.h"

namespace eplb::xfer {

inline constexpr uint16_t kMetadataVersion = 2;  // 2: XXH3 checksum (1 had FNV-1a)
inline constexpr size_t kMaxAgentNameLength = 255;
inline constexpr size_t kMaxBackendNameLength = 64;
inline constexpr size_t kMaxConnectionInfoLength = 1u << 20;
inline constexpr size_t kMaxRegionCount = 65536;
inline constexpr size_t kMaxPackedKeyLength = 64u << 10;
inline constexpr size_t kMaxMetadataLength = 64u << 20;
inline constexpr uint16_t kMetadataComplete = 1;  // flags bit 0
inline constexpr uint16_t kMetadataSealed = 2;    // flags bit 1
inline constexpr size_t kSealLength = 32;         // HMAC-SHA256

struct RegionMetadata {
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::Host;
  uint32_t device_id = 0;
  std::vector<uint8_t> packed_key;

  bool operator==(const RegionMetadata&) const = default;
};

struct AgentMetadata {
  std::string agent_name;
  std::string backend_name;
  std::vector<uint8_t> connection_info;
  std::vector<RegionMetadata> regions;
  bool complete = false;  // every region the agent has (kMetadataComplete)

  bool operator==(const AgentMetadata&) const = default;
};

// Fails (InvalidArgument) only if a field exceeds its maximum. A non-empty
// `secret` seals the message (kMetadataSealed).
Result<std::vector<uint8_t>> encode_metadata(const AgentMetadata& metadata, std::string_view secret = {});
// With a non-empty `secret`, only a message sealed under it is decoded: an
// unsealed or wrongly sealed one is Mismatch ("not sealed with this job's
// secret") before any field is read. Without one, a seal is not checked.
Result<AgentMetadata> decode_metadata(std::span<const uint8_t> bytes, std::string_view secret = {});

// XXH3-64 over `bytes` (the format's checksum; exposed for tests/fuzzer).
uint64_t metadata_checksum(std::span<const uint8_t> bytes);
// HMAC-SHA256 of `bytes` under `secret` (OpenSSL).
Result<std::array<uint8_t, kSealLength>> metadata_seal(std::span<const uint8_t> bytes, std::string_view secret);

}  // namespace eplb::xfer
