// The text helpers (splitting, numbers on std::from_chars, the one byte-size
// grammar) and the little-endian byte codec of wire formats.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/bytes.h"
#include "common/text.h"

namespace eplb {
namespace {

TEST(Text, SplitsAndTrims) {
  EXPECT_EQ(text::split("a,b,,c", ','), (std::vector<std::string_view>{"a", "b", "", "c"}));
  EXPECT_EQ(text::split("", ','), (std::vector<std::string_view>{""}));
  EXPECT_EQ(text::split("x:", ':'), (std::vector<std::string_view>{"x", ""}));
  EXPECT_EQ(text::trim(" \t a b \t"), "a b");
  EXPECT_EQ(text::trim("   "), "");
}

TEST(Text, ParsesWholeNumbersOnly) {
  EXPECT_EQ(*text::parse_int("-42", "x"), -42);
  EXPECT_EQ(*text::parse_uint("18446744073709551615", "x"), UINT64_MAX);
  EXPECT_EQ(*text::parse_double("2.5e-3", "x"), 0.0025);
  EXPECT_EQ(*text::parse_int_in("7", "x", 0, 7), 7);
  for (const char* bad : {"", " 1", "1 ", "+1", "1x", "0x10", "--1"}) {
    EXPECT_FALSE(text::parse_int(bad, "x")) << bad;
    EXPECT_FALSE(text::parse_uint(bad, "x")) << bad;
  }
  EXPECT_FALSE(text::parse_uint("-1", "x"));
  EXPECT_FALSE(text::parse_uint("18446744073709551616", "x"));
  EXPECT_FALSE(text::parse_double("nan", "x"));
  EXPECT_FALSE(text::parse_double("inf", "x"));
  auto outside = text::parse_int_in("8", "EPLB_RANK", 0, 7);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.status().code(), Code::InvalidArgument);
  EXPECT_EQ(outside.status().message(), "EPLB_RANK '8' is not an integer in [0, 7]");
  EXPECT_EQ(text::parse_uint("abc", "seed").status().message(), "seed 'abc' is not a non-negative integer");
}

TEST(Text, OneByteSizeGrammar) {
  EXPECT_EQ(*parse_byte_size("4096"), 4096u);
  EXPECT_EQ(*parse_byte_size("4K"), 4096u);
  EXPECT_EQ(*parse_byte_size("4k"), 4096u);
  EXPECT_EQ(*parse_byte_size("4KB"), 4096u);
  EXPECT_EQ(*parse_byte_size("1MiB"), 1u << 20);
  EXPECT_EQ(*parse_byte_size("8M"), 8u << 20);
  EXPECT_EQ(*parse_byte_size("512KiB"), 512u << 10);
  EXPECT_EQ(*parse_byte_size("1.5KiB"), 1536u);
  EXPECT_EQ(*parse_byte_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*parse_byte_size("64g"), 64ull << 30);
  EXPECT_EQ(*parse_byte_size("1T"), 1ull << 40);
  EXPECT_EQ(*parse_byte_size("12B"), 12u);
  for (const char* bad : {"", "MiB", "1XB", "-4", "0", "1.3B", "2TiB", "1e3", "4 K", "1..2", ".", "99999999999999999999"})
    EXPECT_FALSE(parse_byte_size(bad)) << bad;
  EXPECT_NE(parse_byte_size("1XB").status().message().find("'1XB' is not a byte size"), std::string::npos);
  EXPECT_NE(parse_byte_size("0.5").status().message().find("whole number of bytes in [1 B, 1 TiB]"),
            std::string::npos);
}

TEST(Bytes, WritesLittleEndianWhateverTheHost) {
  bytes::Writer writer;
  writer.u16(0x0102);
  writer.u32(0x03040506);
  writer.u64(0x0708090a0b0c0d0eull);
  writer.i32(-2);
  writer.blob<uint32_t>("ab");
  const std::string out = writer.take();
  const std::string expected("\x02\x01\x06\x05\x04\x03\x0e\x0d\x0c\x0b\x0a\x09\x08\x07\xfe\xff\xff\xff"
                             "\x02\x00\x00\x00"
                             "ab",
                             24);
  EXPECT_EQ(out, expected);
  bytes::Reader reader(out);
  EXPECT_EQ(reader.u16(), 0x0102);
  EXPECT_EQ(reader.u32(), 0x03040506u);
  EXPECT_EQ(reader.u64(), 0x0708090a0b0c0d0eull);
  EXPECT_EQ(reader.i32(), -2);
  EXPECT_EQ(reader.blob<uint32_t>(2), "ab");
  EXPECT_TRUE(reader.at_end());
}

TEST(Bytes, ReaderRefusesWhatIsNotThere) {
  bytes::Writer writer;
  writer.raw("MAGIC");
  writer.blob("payload");
  writer.f64(1.25);
  const std::string message = writer.take();
  bytes::Reader whole(message);
  EXPECT_TRUE(whole.expect("MAGIC"));
  EXPECT_EQ(whole.blob(7), "payload");
  EXPECT_EQ(whole.f64(), 1.25);
  EXPECT_TRUE(whole.at_end());
  // A blob longer than allowed, a truncated input, a wrong magic: !ok(), zeros.
  bytes::Reader limited(message);
  EXPECT_TRUE(limited.expect("MAGIC"));
  EXPECT_EQ(limited.blob(6), "");
  EXPECT_FALSE(limited.ok());
  EXPECT_EQ(limited.position(), 5u);
  EXPECT_EQ(limited.u64(), 0u);
  for (size_t cut = 0; cut < message.size(); ++cut) {
    bytes::Reader truncated(std::string_view(message).substr(0, cut));
    (void)truncated.expect("MAGIC");
    (void)truncated.blob(100);
    (void)truncated.f64();
    EXPECT_FALSE(truncated.at_end()) << cut;
  }
  bytes::Reader wrong("MAGIX");
  EXPECT_FALSE(wrong.expect("MAGIC"));
  EXPECT_EQ(wrong.u8(), 0);
}

// bytes::checksum uses libxxhash's vector dispatch: the hashes must be the
// portable XXH3-64 ones (the test links the plain XXH3_64bits), at every
// length around the algorithm's and the piece size's boundaries, and
// copy_with_checksum must copy exactly and hash what it copied.
TEST(Bytes, ChecksumAndCopyWithChecksumGiveThePortableXxh3) {
  EXPECT_EQ(bytes::checksum(std::string_view()), 0x2D06800538D394C2ull);  // XXH3-64 of no bytes
  std::vector<uint8_t> source((1 << 20) + 70000), target(source.size() + 1, 0xEE);
  for (size_t i = 0; i < source.size(); ++i) source[i] = uint8_t(i * 2654435761u >> 13);
  for (size_t length : {size_t{0}, size_t{1}, size_t{17}, size_t{240}, size_t{241}, size_t{4099}, size_t{65535},
                        size_t{65536}, size_t{65537}, size_t{200001}, source.size()}) {
    SCOPED_TRACE(length);
    const uint64_t expected = XXH3_64bits(source.data(), length);
    EXPECT_EQ(bytes::checksum(std::span<const uint8_t>(source.data(), length)), expected);
    std::fill(target.begin(), target.end(), 0xEE);
    EXPECT_EQ(bytes::copy_with_checksum(target.data(), source.data(), length), expected);
    EXPECT_EQ(std::memcmp(target.data(), source.data(), length), 0);
    EXPECT_EQ(target[length], 0xEE);  // nothing written past the end
  }
}

TEST(Bytes, ChecksumIsXxh3) {
  const std::string data = "expert rows";
  EXPECT_EQ(bytes::checksum(data), XXH3_64bits(data.data(), data.size()));
  bytes::Writer patched;
  patched.u32(0);
  patched.u32(7);
  patched.patch_u32(0, 0xdeadbeef);
  bytes::Reader reader(patched.view());
  EXPECT_EQ(reader.u32(), 0xdeadbeefu);
  EXPECT_EQ(reader.u32(), 7u);
}

}  // namespace
}  // namespace eplb

namespace eplb {
namespace {

// Known answers of the "eplb-dev64" digest, computed by the plain-Python
// reference (python/eplb/digest.py reference_digest); the torch ops and this
// C++ loop must give the same values.
TEST(Dev64Digest, KnownAnswers) {
  EXPECT_EQ(bytes::dev64_digest({}), 0x0ull);
  const std::string abc = "abc";
  EXPECT_EQ(bytes::dev64_digest(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(abc.data()), 3)),
            0xb1f9597d70f30d6aull);
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[size_t(i)] = uint8_t(i);
  EXPECT_EQ(bytes::dev64_digest(all), 0x3a837acdefd578d5ull);
  // Lengths past the 8-word lanes with words and bytes left over: bytes (7i + 3) mod 256.
  std::vector<uint8_t> odd(1001);
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = uint8_t(i * 7 + 3);
  EXPECT_EQ(bytes::dev64_digest(odd), 0x6925f45a9ae561cbull);
  EXPECT_EQ(bytes::dev64_digest(std::span<const uint8_t>(odd.data(), 44)), 0x570aaafa68191d29ull);
}

TEST(Dev64Digest, EveryWordAndItsPositionCount) {
  std::vector<uint8_t> row(4096, 7);
  const uint64_t base = bytes::dev64_digest(row);
  row[1000] ^= 1;
  EXPECT_NE(bytes::dev64_digest(row), base);
  row[1000] ^= 1;
  std::swap(row[0], row[4]);  // equal words trade places: same bytes
  EXPECT_EQ(bytes::dev64_digest(row), base);
  row[0] = 9;
  const uint64_t one = bytes::dev64_digest(row);
  std::swap(row[0], row[4]);  // different words trade places
  EXPECT_NE(bytes::dev64_digest(row), one);
  EXPECT_NE(bytes::dev64_digest(std::span<const uint8_t>(row.data(), 4095)), bytes::dev64_digest(row));
}

}  // namespace
}  // namespace eplb
