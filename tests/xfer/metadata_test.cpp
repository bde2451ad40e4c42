// The metadata format: round trip, and every way untrusted bytes can be
// wrong gives Mismatch naming the field and offset, never a crash.
#include <gmock/gmock.h>
#include <xxhash.h>
#include <gtest/gtest.h>

#include "../../src/xfer/metadata.h"
#include "agent_fixture.h"

namespace eplb::xfer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

AgentMetadata sample() {
  AgentMetadata metadata;
  metadata.agent_name = "rank-3";
  metadata.backend_name = "loopback";
  metadata.connection_info = {1, 2, 3, 4, 5};
  metadata.regions.push_back({7, 0x1000, 4096, MemoryKind::Host, 0, {9, 9, 9}});
  metadata.regions.push_back({8, 0x7f0000000000, 1ull << 30, MemoryKind::Device, 2, {}});
  return metadata;
}

std::vector<uint8_t> encoded(const AgentMetadata& metadata) {
  auto bytes = encode_metadata(metadata);
  EXPECT_TRUE(bytes) << bytes.status().to_string();
  return bytes ? *bytes : std::vector<uint8_t>{};
}

// Recomputes the trailing checksum so structural checks are reached.
void fix_checksum(std::vector<uint8_t>& bytes) {
  size_t end = bytes.size() - 8;
  uint64_t checksum = metadata_checksum({bytes.data(), end});
  for (int i = 0; i < 8; ++i) bytes[end + i] = static_cast<uint8_t>(checksum >> (8 * i));
}

void expect_mismatch(const std::vector<uint8_t>& bytes, const std::string& piece) {
  auto decoded = decode_metadata(bytes);
  ASSERT_FALSE(decoded) << "accepted bad metadata (expected: " << piece << ")";
  EXPECT_EQ(decoded.status().code(), Code::Mismatch);
  EXPECT_THAT(decoded.status().message(), AllOf(HasSubstr(piece), HasSubstr("offset")));
}

// Offsets in sample(): header 12, name 2+6, backend 2+8, info 4+5, count 4.
constexpr size_t kNameOffset = 12;
constexpr size_t kCountOffset = 12 + 8 + 10 + 9;
constexpr size_t kFirstRegion = kCountOffset + 4;

TEST(MetadataTest, RoundTripKeepsEveryField) {
  AgentMetadata metadata = sample();
  auto decoded = decode_metadata(encoded(metadata));
  ASSERT_TRUE(decoded) << decoded.status().to_string();
  EXPECT_EQ(*decoded, metadata);
  metadata.complete = true;  // the full export's flag
  auto complete = decode_metadata(encoded(metadata));
  ASSERT_TRUE(complete) << complete.status().to_string();
  EXPECT_TRUE(complete->complete);
  EXPECT_EQ(*complete, metadata);
  metadata.regions.clear();
  metadata.connection_info.clear();
  auto empty = decode_metadata(encoded(metadata));
  ASSERT_TRUE(empty) << empty.status().to_string();
  EXPECT_EQ(*empty, metadata);
}

TEST(MetadataTest, EveryTruncationIsMismatch) {
  std::vector<uint8_t> bytes = encoded(sample());
  for (size_t length = 0; length < bytes.size(); ++length) {
    auto decoded = decode_metadata({bytes.data(), length});
    ASSERT_FALSE(decoded) << "length " << length;
    EXPECT_EQ(decoded.status().code(), Code::Mismatch);
  }
  expect_mismatch({bytes.begin(), bytes.end() - 1}, "truncated");
}

TEST(MetadataTest, EverySingleByteChangeIsMismatch) {
  std::vector<uint8_t> bytes = encoded(sample());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> garbled = bytes;
      garbled[i] ^= flip;
      auto decoded = decode_metadata(garbled);
      ASSERT_FALSE(decoded) << "byte " << i << " ^ " << int(flip);
      EXPECT_EQ(decoded.status().code(), Code::Mismatch);
    }
  }
}

TEST(MetadataTest, TrailingGarbageIsMismatch) {
  std::vector<uint8_t> bytes = encoded(sample());
  bytes.push_back(0);
  expect_mismatch(bytes, "trailing garbage");
}

TEST(MetadataTest, HeaderProblemsAreNamed) {
  std::vector<uint8_t> bytes = encoded(sample());
  auto magic = bytes;
  magic[0] = 'X';
  expect_mismatch(magic, "bad magic");
  auto version = bytes;
  version[4] = 1;  // version 1 had an FNV-1a checksum
  fix_checksum(version);
  expect_mismatch(version, "unsupported version 1 (this build reads version 2)");
  auto flags = bytes;
  flags[6] = 4;  // bits 0 (complete) and 1 (sealed) are known
  fix_checksum(flags);
  expect_mismatch(flags, "unknown flags");
  expect_mismatch({}, "only 0 bytes");
  auto checksum = bytes;
  checksum[kNameOffset + 2] ^= 1;
  expect_mismatch(checksum, "checksum mismatch");
}

TEST(MetadataTest, LittleEndianFieldsAndAnXxh3Checksum) {
  std::vector<uint8_t> bytes = encoded(sample());
  EXPECT_EQ(bytes[4], 2);  // version, little-endian
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[8] | bytes[9] << 8 | bytes[10] << 16 | bytes[11] << 24, int(bytes.size()));  // total length
  const size_t end = bytes.size() - 8;
  uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) stored |= uint64_t(bytes[end + i]) << (8 * i);
  EXPECT_EQ(stored, XXH3_64bits(bytes.data(), end));
}

TEST(MetadataTest, StructuralProblemsBehindAValidChecksumAreNamed) {
  std::vector<uint8_t> base = encoded(sample());
  auto patch = [&](size_t offset, std::vector<uint8_t> values) {
    auto bytes = base;
    for (size_t i = 0; i < values.size(); ++i) bytes[offset + i] = values[i];
    fix_checksum(bytes);
    return bytes;
  };
  expect_mismatch(patch(kNameOffset, {0, 0}), "agent name length 0");
  expect_mismatch(patch(kNameOffset, {0xFF, 0x7F}), "agent name length");
  expect_mismatch(patch(kNameOffset + 2, {'\n'}), "control byte");
  expect_mismatch(patch(kCountOffset, {0xFF, 0xFF, 0xFF, 0x7F}), "region count");
  expect_mismatch(patch(kCountOffset, {3, 0, 0, 0}), "region count 3 needs");
  expect_mismatch(patch(kCountOffset, {1, 0, 0, 0}), "unexpected bytes after the last region");
  expect_mismatch(patch(kFirstRegion, {0, 0, 0, 0, 0, 0, 0, 0}), "has id 0");
  expect_mismatch(patch(kFirstRegion, {8}), "repeats id 8");
  expect_mismatch(patch(kFirstRegion + 16, {0, 0, 0, 0, 0, 0, 0, 0}), "has length 0");
  expect_mismatch(patch(kFirstRegion + 16, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}), "wraps around");
  expect_mismatch(patch(kFirstRegion + 24, {7}), "unknown memory kind 7");
  expect_mismatch(patch(kFirstRegion + 29, {0xFF, 0xFF, 0xFF, 0x00}), "packed remote key length");
  expect_mismatch(patch(kFirstRegion + 29, {0xFF, 0x00, 0x00, 0x00}), "truncated packed remote key");
}

TEST(MetadataTest, EncodeRefusesOversizedFields) {
  AgentMetadata metadata = sample();
  metadata.agent_name.assign(300, 'a');
  EXPECT_EQ(encode_metadata(metadata).status().code(), Code::InvalidArgument);
  metadata = sample();
  metadata.regions[0].packed_key.assign(kMaxPackedKeyLength + 1, 0);
  EXPECT_EQ(encode_metadata(metadata).status().code(), Code::InvalidArgument);
}

TEST(MetadataTest, AgentRejectsGarbledAndForeignMetadata) {
  AgentConfig config;
  config.name = "reader";
  config.backend = "loopback";
  auto agent = Agent::create(config);
  ASSERT_TRUE(agent);
  std::vector<uint8_t> garbage = {'E', 'P', 'X', 'M', 1, 0};
  auto loaded = (*agent)->load_metadata(garbage);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.status().code(), Code::Mismatch);
  EXPECT_THAT(loaded.status().message(), AllOf(HasSubstr("agent reader: loading peer metadata"), HasSubstr("offset")));
  // Well-formed, but from another backend.
  AgentMetadata foreign = sample();
  foreign.backend_name = "ucx";
  auto refused = (*agent)->load_metadata(encoded(foreign));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::Mismatch);
  EXPECT_THAT(refused.status().message(), AllOf(HasSubstr("uses backend ucx"), HasSubstr("loopback")));
  // Well-formed loopback metadata whose connection info is not a loopback address.
  auto bad_connection = (*agent)->load_metadata(encoded(sample()));
  ASSERT_FALSE(bad_connection);
  EXPECT_EQ(bad_connection.status().code(), Code::Mismatch);
  EXPECT_FALSE((*agent)->knows_peer("rank-3"));
}

}  // namespace
}  // namespace eplb::xfer
