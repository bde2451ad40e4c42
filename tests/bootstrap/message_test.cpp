// Bootstrap wire format: round trips and every kind of malformed frame.
#include <gtest/gtest.h>

#include <cstring>

#include "../../src/bootstrap/message.h"

namespace eplb::bootstrap {
namespace {

std::span<const uint8_t> bytes_of(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

TEST(BootstrapMessage, RoundTripEveryKind) {
  for (uint16_t kind = 1; kind <= kLastMessageKind; ++kind) {
    std::string payload = "payload of kind " + std::to_string(kind);
    std::string wire = encode_message(static_cast<MessageKind>(kind), 0x0102030405060708ull + kind, 7, payload);
    ASSERT_EQ(wire.size(), kHeaderBytes + payload.size());
    auto decoded = decode_message(bytes_of(wire));
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    EXPECT_EQ(decoded->header.kind, static_cast<MessageKind>(kind));
    EXPECT_EQ(decoded->header.sequence, 0x0102030405060708ull + kind);
    EXPECT_EQ(decoded->header.sender, 7);
    EXPECT_EQ(decoded->payload, payload);
  }
}

TEST(BootstrapMessage, HeaderIsLittleEndianAndVersioned) {
  std::string wire = encode_message(MessageKind::Vote, 1, 2, "");
  EXPECT_EQ(wire.substr(0, 4), "EPBS");
  EXPECT_EQ(static_cast<uint8_t>(wire[4]), kMessageVersion);
  EXPECT_EQ(static_cast<uint8_t>(wire[6]), static_cast<uint8_t>(MessageKind::Vote));
}

TEST(BootstrapMessage, MalformedHeadersAreRejected) {
  const std::string good = encode_message(MessageKind::Allgather, 3, 1, "abc");
  auto expect_error = [](std::string wire, Code code, const std::string& needle) {
    auto decoded = decode_message(bytes_of(wire));
    ASSERT_FALSE(decoded.is_ok());
    EXPECT_EQ(decoded.status().code(), code) << decoded.status().to_string();
    EXPECT_NE(decoded.status().message().find(needle), std::string::npos) << decoded.status().to_string();
  };
  expect_error("", Code::ParseError, "truncated");
  expect_error(good.substr(0, kHeaderBytes - 1), Code::ParseError, "truncated");
  std::string wrong_magic = good;
  wrong_magic[0] = 'X';
  expect_error(wrong_magic, Code::ParseError, "magic");
  std::string wrong_version = good;
  wrong_version[4] = 9;
  expect_error(wrong_version, Code::Mismatch, "version 9");
  std::string zero_kind = good;
  zero_kind[6] = 0;
  expect_error(zero_kind, Code::ParseError, "unknown kind 0");
  std::string big_kind = good;
  big_kind[6] = 77;
  expect_error(big_kind, Code::ParseError, "unknown kind 77");
  std::string reserved = good;
  reserved[21] = 1;
  expect_error(reserved, Code::ParseError, "reserved");
  std::string negative_sender = good;
  negative_sender[19] = static_cast<char>(0x80);
  expect_error(negative_sender, Code::ParseError, "negative sender");
  std::string huge = good;
  huge[31] = 0x10;  // 2^60 bytes
  expect_error(huge, Code::ParseError, "exceeds the maximum");
  expect_error(good.substr(0, good.size() - 1), Code::ParseError, "says 3 payload bytes, has 2");
  expect_error(good + "x", Code::ParseError, "says 3 payload bytes, has 4");
}

TEST(BootstrapMessage, FrameReaderReassemblesAByteAtATime) {
  std::string stream = encode_message(MessageKind::Hello, 0, 3, encode_hello({4, 99, {}})) +
                       encode_message(MessageKind::Barrier, 1, 3, "") +
                       encode_message(MessageKind::Allgather, 2, 3, std::string(1000, 'z'));
  FrameReader reader;
  std::vector<Message> messages;
  for (char byte : stream) {
    auto room = reader.want();
    ASSERT_FALSE(room.empty());
    room[0] = static_cast<uint8_t>(byte);
    auto complete = reader.commit(1);
    ASSERT_TRUE(complete.is_ok()) << complete.status().to_string();
    if (*complete) messages.push_back(reader.take());
  }
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_TRUE(reader.at_boundary());
  EXPECT_EQ(messages[0].header.kind, MessageKind::Hello);
  EXPECT_EQ(messages[1].header.kind, MessageKind::Barrier);
  EXPECT_EQ(messages[1].payload, "");
  EXPECT_EQ(messages[2].payload, std::string(1000, 'z'));
  auto hello = decode_hello(messages[0].payload);
  ASSERT_TRUE(hello.is_ok());
  EXPECT_EQ(hello->size, 4);
  EXPECT_EQ(hello->pid, 99);
}

TEST(BootstrapMessage, FrameReaderRejectsGarbageHeader) {
  FrameReader reader;
  auto room = reader.want();
  ASSERT_EQ(room.size(), kHeaderBytes);
  std::fill(room.begin(), room.end(), 0xAB);
  auto complete = reader.commit(kHeaderBytes);
  ASSERT_FALSE(complete.is_ok());
  EXPECT_EQ(complete.status().code(), Code::ParseError);
}

// Found while fuzzing (peak RSS): the reader used to allocate the payload a
// header merely claims. It must grow with the bytes that actually arrive.
TEST(BootstrapMessage, FrameReaderDoesNotAllocateTheClaimedLength) {
  std::string header = encode_header({MessageKind::Allgather, 1, 1, kMaxPayloadBytes});
  FrameReader reader;
  auto room = reader.want();
  std::memcpy(room.data(), header.data(), kHeaderBytes);
  auto complete = reader.commit(kHeaderBytes);
  ASSERT_TRUE(complete.is_ok()) << complete.status().to_string();
  EXPECT_FALSE(*complete);
  room = reader.want();
  EXPECT_LE(room.size(), kPayloadChunkBytes);
  EXPECT_GT(room.size(), 0u);
  // Filling it grows the buffer by at most doubling.
  ASSERT_TRUE(reader.commit(room.size()).is_ok());
  EXPECT_LE(reader.want().size(), kPayloadChunkBytes);
}

TEST(BootstrapMessage, StringListRoundTripAndBounds) {
  std::vector<std::string> items = {"", "a", std::string(300, '\0'), "last"};
  std::string encoded = encode_string_list(items);
  auto decoded = decode_string_list(encoded, 4);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_EQ(*decoded, items);
  EXPECT_EQ(decode_string_list(encoded, 5).status().code(), Code::Mismatch);
  EXPECT_EQ(decode_string_list("").status().code(), Code::ParseError);
  EXPECT_EQ(decode_string_list(encoded.substr(0, encoded.size() - 1)).status().code(), Code::ParseError);
  EXPECT_EQ(decode_string_list(encoded + "!").status().code(), Code::ParseError);
  // A count far beyond what the bytes can hold is refused before allocating.
  std::string huge_count = encoded;
  huge_count[0] = huge_count[1] = huge_count[2] = huge_count[3] = static_cast<char>(0xff);
  auto refused = decode_string_list(huge_count);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("claims 4294967295 items"), std::string::npos);
  // An item length beyond the payload.
  std::string long_item = encode_string_list({"abc"});
  long_item[4] = static_cast<char>(0xff);
  long_item[11] = static_cast<char>(0x7f);
  EXPECT_EQ(decode_string_list(long_item).status().code(), Code::ParseError);
}

TEST(BootstrapMessage, VoteHelloAbortCodecs) {
  auto yes = decode_vote(encode_vote(true, ""));
  ASSERT_TRUE(yes.is_ok());
  EXPECT_TRUE(yes->yes);
  auto no = decode_vote(encode_vote(false, "layer 3: checksum mismatch"));
  ASSERT_TRUE(no.is_ok());
  EXPECT_FALSE(no->yes);
  EXPECT_EQ(no->reason, "layer 3: checksum mismatch");
  EXPECT_EQ(decode_vote("").status().code(), Code::ParseError);
  EXPECT_EQ(decode_vote(std::string("\x02", 1)).status().code(), Code::ParseError);

  EXPECT_EQ(decode_hello("short").status().code(), Code::ParseError);
  EXPECT_EQ(decode_hello(encode_hello({0, 1, {}})).status().code(), Code::ParseError);
  EXPECT_EQ(decode_hello(encode_hello({-3, 1, {}})).status().code(), Code::ParseError);

  auto abort = decode_abort(encode_abort(error(Code::Timeout, "rank 3 silent").with_peer(3)));
  ASSERT_TRUE(abort.is_ok());
  EXPECT_EQ(abort->code, Code::Timeout);
  EXPECT_EQ(abort->message, "rank 3 silent");
  EXPECT_EQ(abort->peer, 3);
  EXPECT_EQ(abort->status().peer(), 3);
  EXPECT_EQ(decode_abort(encode_abort(error(Code::Aborted, "x"))).value().peer, -1);
  EXPECT_EQ(decode_abort("").status().code(), Code::ParseError);
  EXPECT_EQ(decode_abort(std::string("\x08\xff\xff\xff", 4)).status().code(), Code::ParseError);  // truncated
  EXPECT_EQ(decode_abort(std::string("\0\xff\xff\xff\xffx", 6)).status().code(), Code::ParseError);
  EXPECT_EQ(decode_abort(std::string("\x7f\xff\xff\xff\xffx", 6)).status().code(), Code::ParseError);
  EXPECT_EQ(decode_abort(std::string("\x08\xfe\xff\xff\xffx", 6)).status().code(), Code::ParseError);  // peer -2
}

}  // namespace
}  // namespace eplb::bootstrap
