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
// decode_metadata() treats its input as untrusted: every length is checked
// against the remaining bytes and its maximum; any violation is Mismatch
// naming the field and its byte offset.
#pragma once

#include <cstdint>
#include <span>
#include <string>
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

// Fails (InvalidArgument) only if a field exceeds its maximum.
Result<std::vector<uint8_t>> encode_metadata(const AgentMetadata& metadata);
Result<AgentMetadata> decode_metadata(std::span<const uint8_t> bytes);

// XXH3-64 over `bytes` (the format's checksum; exposed for tests/fuzzer).
uint64_t metadata_checksum(std::span<const uint8_t> bytes);

}  // namespace eplb::xfer
