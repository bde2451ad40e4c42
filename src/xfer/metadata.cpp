// Encoder and untrusted-input decoder of agent metadata (format: metadata.h).
#include "metadata.h"

#include <fmt/format.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <unordered_set>

#include "common/bytes.h"

namespace eplb::xfer {
namespace {

constexpr uint8_t kMetadataMagic[4] = {'E', 'P', 'X', 'M'};
constexpr size_t kHeaderLength = 12;  // magic, version, flags, total length
constexpr size_t kChecksumLength = 8;
constexpr size_t kMinRegionLength = 8 + 8 + 8 + 1 + 4 + 4;

// Reads named fields from untrusted bytes over bytes::Reader; a failure
// (Mismatch) names the field and the offset where it starts.
class FieldReader {
 public:
  explicit FieldReader(std::span<const uint8_t> data) : in_(data) {}

  size_t offset() const { return in_.position(); }
  size_t remaining() const { return in_.remaining(); }

  template <typename T>
  Status integer(const char* field, T* value) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    if constexpr (sizeof(T) == 1) *value = in_.u8();
    else if constexpr (sizeof(T) == 2) *value = in_.u16();
    else if constexpr (sizeof(T) == 4) *value = in_.u32();
    else *value = in_.u64();
    return Status::ok();
  }

  // A length-prefixed byte string of at least `min` and at most `max` bytes.
  template <typename LengthType>
  Status blob(const char* field, size_t min, size_t max, std::span<const uint8_t>* data) {
    const size_t start = offset();
    LengthType length = 0;
    EPLB_TRY(integer<LengthType>(field, &length));
    if (length < min || length > max)
      return fail(start, fmt::format("{} length {} outside [{}, {}]", field, length, min, max));
    if (remaining() < length) return truncated(field, length);
    std::string_view bytes = in_.raw(length);
    *data = {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
    return Status::ok();
  }

  Status skip(const char* field, size_t length) {
    if (remaining() < length) return truncated(field, length);
    (void)in_.raw(length);
    return Status::ok();
  }

  Status fail(size_t at, const std::string& what) const {
    return error(Code::Mismatch, fmt::format("agent metadata: {} at offset {} of {} bytes", what, at, in_.size()));
  }

 private:
  Status truncated(const char* field, size_t needed) const {
    return fail(offset(), fmt::format("truncated {} (needs {} bytes, {} left)", field, needed, remaining()));
  }
  bytes::Reader in_;
};

std::string_view as_text(const std::vector<uint8_t>& data) {
  return {reinterpret_cast<const char*>(data.data()), data.size()};
}

// A name blob: 1..max printable bytes.
Result<std::string> read_name(FieldReader& reader, const char* field, size_t max) {
  const size_t at = reader.offset() + 2;
  std::span<const uint8_t> text;
  EPLB_TRY(reader.blob<uint16_t>(field, 1, max, &text));
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] < 0x20 || text[i] == 0x7f)
      return reader.fail(at + i, fmt::format("{} contains control byte {}", field, text[i]));
  return std::string(text.begin(), text.end());
}

// The seal of a message whose flags say it is sealed, checked when this
// side has a secret; the length of the seal (0 when unsealed).
Result<size_t> check_seal(std::span<const uint8_t> data, uint16_t flags, std::string_view secret,
                          const FieldReader& reader) {
  const bool sealed = (flags & kMetadataSealed) != 0;
  if (!sealed) {
    if (secret.empty()) return size_t(0);
    return reader.fail(6, "not sealed with this job's secret (EPLB_RUN_SECRET): refused before it is read");
  }
  if (data.size() < kHeaderLength + kChecksumLength + kSealLength) return reader.fail(0, "too short for its seal");
  const size_t seal_at = data.size() - kSealLength;
  if (!secret.empty()) {
    EPLB_ASSIGN_OR_RETURN(const auto expected, metadata_seal(data.first(seal_at), secret));
    if (CRYPTO_memcmp(expected.data(), data.data() + seal_at, kSealLength) != 0)
      return reader.fail(seal_at, "seal does not match this job's secret (EPLB_RUN_SECRET): refused before it is read");
  }
  return kSealLength;
}

// The header, the seal and the checksum of the whole message; the body's end.
Result<size_t> check_frame(std::span<const uint8_t> data, std::string_view secret) {
  FieldReader reader(data);
  if (data.size() < kHeaderLength + kChecksumLength)
    return reader.fail(0, fmt::format("only {} bytes, a header and checksum need {}", data.size(),
                                      kHeaderLength + kChecksumLength));
  if (data.size() > kMaxMetadataLength)
    return reader.fail(0, fmt::format("oversized: more than {} bytes", kMaxMetadataLength));
  if (std::memcmp(data.data(), kMetadataMagic, sizeof kMetadataMagic) != 0)
    return reader.fail(0, "bad magic (not eplb agent metadata)");
  const uint16_t version = bytes::load<uint16_t>(data.data() + 4);
  if (version != kMetadataVersion)
    return reader.fail(4, fmt::format("unsupported version {} (this build reads version {})", version,
                                      kMetadataVersion));
  const uint16_t flags = bytes::load<uint16_t>(data.data() + 6);
  if ((flags & ~(kMetadataComplete | kMetadataSealed)) != 0)
    return reader.fail(6, fmt::format("unknown flags {}", flags));
  EPLB_ASSIGN_OR_RETURN(size_t seal, check_seal(data, flags, secret, reader));
  const uint32_t total = bytes::load<uint32_t>(data.data() + 8);
  if (total < data.size()) return reader.fail(total, fmt::format("trailing garbage: header says {} bytes", total));
  if (total > data.size()) return reader.fail(data.size(), fmt::format("truncated: header says {} bytes", total));
  const size_t body_end = data.size() - seal - kChecksumLength;
  if (bytes::load<uint64_t>(data.data() + body_end) != metadata_checksum(data.first(body_end)))
    return reader.fail(body_end, "checksum mismatch (garbled)");
  return body_end;
}

Result<RegionMetadata> read_region(FieldReader& body, uint32_t index, std::unordered_set<uint64_t>& ids) {
  RegionMetadata region;
  const size_t at = body.offset();
  uint8_t kind = 0;
  EPLB_TRY(body.integer("region id", &region.id));
  EPLB_TRY(body.integer("region address", &region.address));
  EPLB_TRY(body.integer("region length", &region.length));
  EPLB_TRY(body.integer("region kind", &kind));
  EPLB_TRY(body.integer("region device id", &region.device_id));
  const std::string which = fmt::format("region {}", index);
  if (region.id == 0) return body.fail(at, which + " has id 0");
  if (!ids.insert(region.id).second) return body.fail(at, fmt::format("{} repeats id {}", which, region.id));
  if (region.length == 0) return body.fail(at + 16, which + " has length 0");
  if (region.address + region.length < region.address)
    return body.fail(at + 8, which + " wraps around the address space");
  if (kind > static_cast<uint8_t>(MemoryKind::Device))
    return body.fail(at + 24, fmt::format("{} has unknown memory kind {}", which, kind));
  region.kind = static_cast<MemoryKind>(kind);
  std::span<const uint8_t> key;
  EPLB_TRY(body.blob<uint32_t>("packed remote key", 0, kMaxPackedKeyLength, &key));
  region.packed_key.assign(key.begin(), key.end());
  return region;
}

Status read_regions(FieldReader& body, std::vector<RegionMetadata>& regions) {
  const size_t at = body.offset();
  uint32_t count = 0;
  EPLB_TRY(body.integer("region count", &count));
  if (count > kMaxRegionCount)
    return body.fail(at, fmt::format("region count {} above {}", count, kMaxRegionCount));
  if (static_cast<uint64_t>(count) * kMinRegionLength > body.remaining())
    return body.fail(at, fmt::format("region count {} needs at least {} bytes, {} left", count,
                                     static_cast<uint64_t>(count) * kMinRegionLength, body.remaining()));
  regions.reserve(count);
  std::unordered_set<uint64_t> ids;
  for (uint32_t i = 0; i < count; ++i) {
    EPLB_ASSIGN_OR_RETURN(RegionMetadata region, read_region(body, i, ids));
    regions.push_back(std::move(region));
  }
  return Status::ok();
}

}  // namespace

uint64_t metadata_checksum(std::span<const uint8_t> data) { return bytes::checksum(data); }

Result<std::array<uint8_t, kSealLength>> metadata_seal(std::span<const uint8_t> data, std::string_view secret) {
  std::array<uint8_t, kSealLength> seal{};
  unsigned int length = 0;
  // A failed HMAC is an error, never a zero seal (which a forger could send).
  if (HMAC(EVP_sha256(), secret.data(), int(secret.size()), data.data(), data.size(), seal.data(), &length) == nullptr ||
      length != kSealLength)
    return error(Code::Internal, "agent metadata: HMAC-SHA256 of the seal failed (OpenSSL)");
  return seal;
}

Result<std::vector<uint8_t>> encode_metadata(const AgentMetadata& metadata, std::string_view secret) {
  auto too_long = [](const char* field, size_t length, size_t max) {
    return error(Code::InvalidArgument,
                 fmt::format("agent metadata: {} has {} bytes, at most {} allowed", field, length, max));
  };
  if (metadata.agent_name.empty() || metadata.agent_name.size() > kMaxAgentNameLength)
    return too_long("agent name", metadata.agent_name.size(), kMaxAgentNameLength);
  if (metadata.backend_name.empty() || metadata.backend_name.size() > kMaxBackendNameLength)
    return too_long("backend name", metadata.backend_name.size(), kMaxBackendNameLength);
  if (metadata.connection_info.size() > kMaxConnectionInfoLength)
    return too_long("connection info", metadata.connection_info.size(), kMaxConnectionInfoLength);
  if (metadata.regions.size() > kMaxRegionCount) return too_long("region list", metadata.regions.size(), kMaxRegionCount);
  bytes::Writer writer;
  writer.raw(std::span<const uint8_t>(kMetadataMagic, sizeof kMetadataMagic));
  writer.u16(kMetadataVersion);
  writer.u16(uint16_t((metadata.complete ? kMetadataComplete : 0) | (secret.empty() ? 0 : kMetadataSealed)));
  writer.u32(0);  // total length, patched below
  writer.blob<uint16_t>(metadata.agent_name);
  writer.blob<uint16_t>(metadata.backend_name);
  writer.blob<uint32_t>(as_text(metadata.connection_info));
  writer.u32(static_cast<uint32_t>(metadata.regions.size()));
  for (const RegionMetadata& region : metadata.regions) {
    if (region.packed_key.size() > kMaxPackedKeyLength)
      return too_long("packed remote key", region.packed_key.size(), kMaxPackedKeyLength);
    writer.u64(region.id);
    writer.u64(region.address);
    writer.u64(region.length);
    writer.u8(static_cast<uint8_t>(region.kind));
    writer.u32(region.device_id);
    writer.blob<uint32_t>(as_text(region.packed_key));
  }
  size_t total = writer.size() + kChecksumLength + (secret.empty() ? 0 : kSealLength);
  if (total > kMaxMetadataLength) return too_long("metadata", total, kMaxMetadataLength);
  writer.patch_u32(8, static_cast<uint32_t>(total));
  writer.u64(bytes::checksum(writer.view()));
  if (secret.empty()) return writer.take_vector();
  std::vector<uint8_t> sealed = writer.take_vector();
  EPLB_ASSIGN_OR_RETURN(const auto seal, metadata_seal(sealed, secret));
  sealed.insert(sealed.end(), seal.begin(), seal.end());
  return sealed;
}

Result<AgentMetadata> decode_metadata(std::span<const uint8_t> data, std::string_view secret) {
  EPLB_ASSIGN_OR_RETURN(size_t body_end, check_frame(data, secret));
  // The body is parsed up to body_end: the checksum is not part of it.
  FieldReader body(data.first(body_end));
  EPLB_TRY(body.skip("header", kHeaderLength));  // checked by check_frame
  AgentMetadata metadata;
  metadata.complete = (bytes::load<uint16_t>(data.data() + 6) & kMetadataComplete) != 0;
  EPLB_ASSIGN_OR_RETURN(metadata.agent_name, read_name(body, "agent name", kMaxAgentNameLength));
  EPLB_ASSIGN_OR_RETURN(metadata.backend_name, read_name(body, "backend name", kMaxBackendNameLength));
  std::span<const uint8_t> connection;
  EPLB_TRY(body.blob<uint32_t>("connection info", 0, kMaxConnectionInfoLength, &connection));
  metadata.connection_info.assign(connection.begin(), connection.end());
  EPLB_TRY(read_regions(body, metadata.regions));
  if (body.remaining() != 0)
    return body.fail(body.offset(), fmt::format("{} unexpected bytes after the last region", body.remaining()));
  return metadata;
}

}  // namespace eplb::xfer
