// Encoder and untrusted-input decoder of agent metadata (format: metadata.h).
#include "metadata.h"

#include <cstring>
#include <unordered_set>

namespace eplb::xfer {
namespace {

constexpr uint8_t kMagic[4] = {'E', 'P', 'X', 'M'};
constexpr size_t kHeaderLength = 12;  // magic, version, flags, total length
constexpr size_t kChecksumLength = 8;
constexpr size_t kMinRegionLength = 8 + 8 + 8 + 1 + 4 + 4;

class Writer {
 public:
  void bytes(const void* data, size_t length) {
    const auto* begin = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), begin, begin + length);
  }
  template <typename T>
  void integer(T value) {
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i)));
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields from untrusted bytes; every read is bounds-checked and a
// failure names the field and the offset where it starts.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }

  template <typename T>
  Status integer(const char* field, T* value) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    uint64_t result = 0;
    for (size_t i = 0; i < sizeof(T); ++i) result |= static_cast<uint64_t>(bytes_[offset_ + i]) << (8 * i);
    *value = static_cast<T>(result);
    offset_ += sizeof(T);
    return Status::ok();
  }

  Status raw(const char* field, size_t length, const uint8_t** data) {
    if (remaining() < length) return truncated(field, length);
    *data = bytes_.data() + offset_;
    offset_ += length;
    return Status::ok();
  }

  // A length-prefixed byte string of at most `max` bytes (and at least `min`).
  template <typename LengthType>
  Status blob(const char* field, size_t min, size_t max, std::span<const uint8_t>* data) {
    size_t start = offset_;
    LengthType length = 0;
    EPLB_TRY(integer<LengthType>(field, &length));
    if (length < min || length > max)
      return fail(start, std::string(field) + " length " + std::to_string(length) + " outside [" + std::to_string(min) +
                             ", " + std::to_string(max) + "]");
    const uint8_t* begin = nullptr;
    EPLB_TRY(raw(field, length, &begin));
    *data = {begin, static_cast<size_t>(length)};
    return Status::ok();
  }

  Status fail(size_t at, const std::string& what) const {
    return error(Code::Mismatch, "agent metadata: " + what + " at offset " + std::to_string(at) + " of " +
                                     std::to_string(bytes_.size()) + " bytes");
  }

 private:
  Status truncated(const char* field, size_t needed) const {
    return fail(offset_, std::string("truncated ") + field + " (needs " + std::to_string(needed) + " bytes, " +
                             std::to_string(remaining()) + " left)");
  }

  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

Status check_name(const Reader& reader, size_t at, const char* field, std::span<const uint8_t> text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] < 0x20 || text[i] == 0x7f)
      return reader.fail(at + i, std::string(field) + " contains control byte " + std::to_string(text[i]));
  return Status::ok();
}

}  // namespace

uint64_t metadata_checksum(std::span<const uint8_t> bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (uint8_t byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

Result<std::vector<uint8_t>> encode_metadata(const AgentMetadata& metadata) {
  auto too_long = [](const char* field, size_t length, size_t max) {
    return error(Code::InvalidArgument, std::string("agent metadata: ") + field + " has " + std::to_string(length) +
                                            " bytes, at most " + std::to_string(max) + " allowed");
  };
  if (metadata.agent_name.empty() || metadata.agent_name.size() > kMaxAgentNameLength)
    return too_long("agent name", metadata.agent_name.size(), kMaxAgentNameLength);
  if (metadata.backend_name.empty() || metadata.backend_name.size() > kMaxBackendNameLength)
    return too_long("backend name", metadata.backend_name.size(), kMaxBackendNameLength);
  if (metadata.connection_info.size() > kMaxConnectionInfoLength)
    return too_long("connection info", metadata.connection_info.size(), kMaxConnectionInfoLength);
  if (metadata.regions.size() > kMaxRegionCount) return too_long("region list", metadata.regions.size(), kMaxRegionCount);

  Writer writer;
  writer.bytes(kMagic, sizeof kMagic);
  writer.integer<uint16_t>(kMetadataVersion);
  writer.integer<uint16_t>(0);
  writer.integer<uint32_t>(0);  // total length, patched below
  writer.integer<uint16_t>(static_cast<uint16_t>(metadata.agent_name.size()));
  writer.bytes(metadata.agent_name.data(), metadata.agent_name.size());
  writer.integer<uint16_t>(static_cast<uint16_t>(metadata.backend_name.size()));
  writer.bytes(metadata.backend_name.data(), metadata.backend_name.size());
  writer.integer<uint32_t>(static_cast<uint32_t>(metadata.connection_info.size()));
  writer.bytes(metadata.connection_info.data(), metadata.connection_info.size());
  writer.integer<uint32_t>(static_cast<uint32_t>(metadata.regions.size()));
  for (const RegionMetadata& region : metadata.regions) {
    if (region.packed_key.size() > kMaxPackedKeyLength)
      return too_long("packed remote key", region.packed_key.size(), kMaxPackedKeyLength);
    writer.integer<uint64_t>(region.id);
    writer.integer<uint64_t>(region.address);
    writer.integer<uint64_t>(region.length);
    writer.integer<uint8_t>(static_cast<uint8_t>(region.kind));
    writer.integer<uint32_t>(region.device_id);
    writer.integer<uint32_t>(static_cast<uint32_t>(region.packed_key.size()));
    writer.bytes(region.packed_key.data(), region.packed_key.size());
  }
  std::vector<uint8_t>& out = writer.out();
  size_t total = out.size() + kChecksumLength;
  if (total > kMaxMetadataLength) return too_long("metadata", total, kMaxMetadataLength);
  for (size_t i = 0; i < 4; ++i) out[8 + i] = static_cast<uint8_t>(total >> (8 * i));
  uint64_t checksum = metadata_checksum(out);
  writer.integer<uint64_t>(checksum);
  return std::move(out);
}

Result<AgentMetadata> decode_metadata(std::span<const uint8_t> bytes) {
  Reader reader(bytes);
  if (bytes.size() < kHeaderLength + kChecksumLength)
    return reader.fail(0, "only " + std::to_string(bytes.size()) + " bytes, a header and checksum need " +
                              std::to_string(kHeaderLength + kChecksumLength));
  if (bytes.size() > kMaxMetadataLength)
    return reader.fail(0, "oversized: more than " + std::to_string(kMaxMetadataLength) + " bytes");
  const uint8_t* magic = nullptr;
  EPLB_TRY(reader.raw("magic", sizeof kMagic, &magic));
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) return reader.fail(0, "bad magic (not eplb agent metadata)");
  uint16_t version = 0, flags = 0;
  uint32_t total = 0;
  EPLB_TRY(reader.integer("version", &version));
  if (version != kMetadataVersion)
    return reader.fail(4, "unsupported version " + std::to_string(version) + " (this build reads version " +
                              std::to_string(kMetadataVersion) + ")");
  EPLB_TRY(reader.integer("flags", &flags));
  if (flags != 0) return reader.fail(6, "unknown flags " + std::to_string(flags));
  EPLB_TRY(reader.integer("total length", &total));
  if (total < bytes.size()) return reader.fail(total, "trailing garbage: header says " + std::to_string(total) + " bytes");
  if (total > bytes.size())
    return reader.fail(bytes.size(), "truncated: header says " + std::to_string(total) + " bytes");
  size_t body_end = bytes.size() - kChecksumLength;
  uint64_t stored = 0;
  for (size_t i = 0; i < kChecksumLength; ++i) stored |= static_cast<uint64_t>(bytes[body_end + i]) << (8 * i);
  if (stored != metadata_checksum(bytes.first(body_end))) return reader.fail(body_end, "checksum mismatch (garbled)");
  // From here the body is parsed against body_end: the checksum is not part of it.
  Reader body(bytes.first(body_end));
  const uint8_t* skip = nullptr;
  EPLB_TRY(body.raw("header", kHeaderLength, &skip));

  AgentMetadata metadata;
  std::span<const uint8_t> text;
  size_t at = body.offset();
  EPLB_TRY(body.blob<uint16_t>("agent name", 1, kMaxAgentNameLength, &text));
  EPLB_TRY(check_name(body, at + 2, "agent name", text));
  metadata.agent_name.assign(text.begin(), text.end());
  at = body.offset();
  EPLB_TRY(body.blob<uint16_t>("backend name", 1, kMaxBackendNameLength, &text));
  EPLB_TRY(check_name(body, at + 2, "backend name", text));
  metadata.backend_name.assign(text.begin(), text.end());
  EPLB_TRY(body.blob<uint32_t>("connection info", 0, kMaxConnectionInfoLength, &text));
  metadata.connection_info.assign(text.begin(), text.end());

  at = body.offset();
  uint32_t count = 0;
  EPLB_TRY(body.integer("region count", &count));
  if (count > kMaxRegionCount)
    return body.fail(at, "region count " + std::to_string(count) + " above " + std::to_string(kMaxRegionCount));
  if (static_cast<uint64_t>(count) * kMinRegionLength > body.remaining())
    return body.fail(at, "region count " + std::to_string(count) + " needs at least " +
                             std::to_string(static_cast<uint64_t>(count) * kMinRegionLength) + " bytes, " +
                             std::to_string(body.remaining()) + " left");
  metadata.regions.reserve(count);
  std::unordered_set<uint64_t> ids;
  for (uint32_t i = 0; i < count; ++i) {
    RegionMetadata region;
    size_t region_at = body.offset();
    uint8_t kind = 0;
    EPLB_TRY(body.integer("region id", &region.id));
    EPLB_TRY(body.integer("region address", &region.address));
    EPLB_TRY(body.integer("region length", &region.length));
    EPLB_TRY(body.integer("region kind", &kind));
    EPLB_TRY(body.integer("region device id", &region.device_id));
    std::string which = "region " + std::to_string(i);
    if (region.id == 0) return body.fail(region_at, which + " has id 0");
    if (!ids.insert(region.id).second) return body.fail(region_at, which + " repeats id " + std::to_string(region.id));
    if (region.length == 0) return body.fail(region_at + 16, which + " has length 0");
    if (region.address + region.length < region.address)
      return body.fail(region_at + 8, which + " wraps around the address space");
    if (kind > static_cast<uint8_t>(MemoryKind::Device))
      return body.fail(region_at + 24, which + " has unknown memory kind " + std::to_string(kind));
    region.kind = static_cast<MemoryKind>(kind);
    EPLB_TRY(body.blob<uint32_t>("packed remote key", 0, kMaxPackedKeyLength, &text));
    region.packed_key.assign(text.begin(), text.end());
    metadata.regions.push_back(std::move(region));
  }
  if (body.remaining() != 0)
    return body.fail(body.offset(), std::to_string(body.remaining()) + " unexpected bytes after the last region");
  return metadata;
}

}  // namespace eplb::xfer
