// Bootstrap wire format: encoders and bounds-checked decoders (see message.h).
#include "message.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace eplb::bootstrap {
namespace {

void put_u16(std::string& out, uint16_t value) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
uint64_t get_le(const uint8_t* data, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | data[i];
  return value;
}

// Reads fixed-size fields from an untrusted payload; every read is checked.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view bytes) : bytes_(bytes) {}
  size_t left() const { return bytes_.size() - offset_; }
  bool read(int width, uint64_t* value) {
    if (left() < static_cast<size_t>(width)) return false;
    *value = get_le(reinterpret_cast<const uint8_t*>(bytes_.data() + offset_), width);
    offset_ += static_cast<size_t>(width);
    return true;
  }
  bool read_bytes(uint64_t length, std::string* out) {
    if (length > left()) return false;
    out->assign(bytes_.data() + offset_, static_cast<size_t>(length));
    offset_ += static_cast<size_t>(length);
    return true;
  }

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

}  // namespace

std::string_view kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::Hello: return "hello";
    case MessageKind::Welcome: return "welcome";
    case MessageKind::Allgather: return "allgather";
    case MessageKind::AllgatherResult: return "allgather result";
    case MessageKind::Barrier: return "barrier";
    case MessageKind::BarrierRelease: return "barrier release";
    case MessageKind::Vote: return "vote";
    case MessageKind::VoteResult: return "vote result";
    case MessageKind::Abort: return "abort";
  }
  return "unknown";
}

std::string encode_header(const MessageHeader& header) {
  std::string out;
  out.reserve(kHeaderBytes);
  put_u32(out, kMessageMagic);
  put_u16(out, kMessageVersion);
  put_u16(out, static_cast<uint16_t>(header.kind));
  put_u64(out, header.sequence);
  put_u32(out, static_cast<uint32_t>(header.sender));
  put_u32(out, 0);
  put_u64(out, header.payload_bytes);
  return out;
}

std::string encode_message(MessageKind kind, uint64_t sequence, int32_t sender, std::string_view payload) {
  std::string out = encode_header({kind, sequence, sender, payload.size()});
  out.append(payload);
  return out;
}

Result<MessageHeader> decode_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes)
    return error(Code::ParseError, "bootstrap message header truncated: " + std::to_string(bytes.size()) +
                                       " of " + std::to_string(kHeaderBytes) + " bytes");
  const uint8_t* data = bytes.data();
  uint32_t magic = static_cast<uint32_t>(get_le(data, 4));
  if (magic != kMessageMagic) {
    char text[96];
    std::snprintf(text, sizeof text, "not a bootstrap message: magic 0x%08x, expected 0x%08x", magic,
                  kMessageMagic);
    return error(Code::ParseError, text);
  }
  uint16_t version = static_cast<uint16_t>(get_le(data + 4, 2));
  if (version != kMessageVersion)
    return error(Code::Mismatch, "bootstrap message version " + std::to_string(version) + ", this eplb speaks " +
                                     std::to_string(kMessageVersion) + " (ranks from different eplb builds?)");
  uint16_t kind = static_cast<uint16_t>(get_le(data + 6, 2));
  if (kind == 0 || kind > kLastMessageKind)
    return error(Code::ParseError, "bootstrap message of unknown kind " + std::to_string(kind));
  MessageHeader header;
  header.kind = static_cast<MessageKind>(kind);
  header.sequence = get_le(data + 8, 8);
  header.sender = static_cast<int32_t>(static_cast<uint32_t>(get_le(data + 16, 4)));
  uint32_t reserved = static_cast<uint32_t>(get_le(data + 20, 4));
  header.payload_bytes = get_le(data + 24, 8);
  if (reserved != 0)
    return error(Code::ParseError, "bootstrap " + std::string(kind_name(header.kind)) +
                                       " message: reserved field is " + std::to_string(reserved) + ", not 0");
  if (header.sender < 0)
    return error(Code::ParseError, "bootstrap " + std::string(kind_name(header.kind)) +
                                       " message: negative sender rank " + std::to_string(header.sender));
  if (header.payload_bytes > kMaxPayloadBytes)
    return error(Code::ParseError, "bootstrap " + std::string(kind_name(header.kind)) + " message from rank " +
                                       std::to_string(header.sender) + ": payload of " +
                                       std::to_string(header.payload_bytes) + " bytes exceeds the maximum of " +
                                       std::to_string(kMaxPayloadBytes));
  return header;
}

Result<Message> decode_message(std::span<const uint8_t> bytes) {
  EPLB_ASSIGN_OR_RETURN(MessageHeader header, decode_header(bytes));
  size_t available = bytes.size() - kHeaderBytes;
  if (header.payload_bytes != available)
    return error(Code::ParseError, "bootstrap " + std::string(kind_name(header.kind)) + " message from rank " +
                                       std::to_string(header.sender) + " says " +
                                       std::to_string(header.payload_bytes) + " payload bytes, has " +
                                       std::to_string(available));
  Message message;
  message.header = header;
  message.payload.assign(reinterpret_cast<const char*>(bytes.data() + kHeaderBytes), available);
  return message;
}

std::span<uint8_t> FrameReader::want() {
  if (complete_) return {};
  if (!have_header_) return {header_ + header_filled_, kHeaderBytes - header_filled_};
  // Grow with the bytes that actually arrive (at most doubling), so a header
  // that merely claims a large payload does not make us allocate it.
  if (payload_filled_ == message_.payload.size()) {
    size_t wanted = static_cast<size_t>(message_.header.payload_bytes);
    size_t grown = std::max<size_t>(kPayloadChunkBytes, 2 * message_.payload.size());
    message_.payload.resize(std::min(wanted, grown));
  }
  auto* base = reinterpret_cast<uint8_t*>(message_.payload.data());
  return {base + payload_filled_, message_.payload.size() - payload_filled_};
}

Result<bool> FrameReader::commit(size_t bytes) {
  if (complete_) return error(Code::Internal, "FrameReader::commit before take()");
  if (!have_header_) {
    if (bytes > kHeaderBytes - header_filled_) return error(Code::Internal, "FrameReader: header overrun");
    header_filled_ += bytes;
    if (header_filled_ < kHeaderBytes) return false;
    EPLB_ASSIGN_OR_RETURN(MessageHeader header, decode_header({header_, kHeaderBytes}));
    have_header_ = true;
    message_.header = header;
    message_.payload.clear();
    payload_filled_ = 0;
  } else {
    if (bytes > message_.payload.size() - payload_filled_) return error(Code::Internal, "FrameReader: overrun");
    payload_filled_ += bytes;
  }
  if (payload_filled_ == message_.header.payload_bytes) {
    message_.payload.resize(payload_filled_);
    complete_ = true;
  }
  return complete_;
}

Message FrameReader::take() {
  Message out = std::move(message_);
  message_ = Message{};
  header_filled_ = 0;
  payload_filled_ = 0;
  have_header_ = false;
  complete_ = false;
  return out;
}

std::string encode_hello(const Hello& hello) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(hello.size));
  put_u32(out, static_cast<uint32_t>(hello.pid));
  return out;
}

Result<Hello> decode_hello(std::string_view payload) {
  if (payload.size() != 8)
    return error(Code::ParseError, "bootstrap hello payload has " + std::to_string(payload.size()) +
                                       " bytes, expected 8");
  PayloadReader reader(payload);
  uint64_t size = 0, pid = 0;
  reader.read(4, &size);
  reader.read(4, &pid);
  Hello hello;
  hello.size = static_cast<int32_t>(static_cast<uint32_t>(size));
  hello.pid = static_cast<int32_t>(static_cast<uint32_t>(pid));
  if (hello.size <= 0)
    return error(Code::ParseError, "bootstrap hello: group size " + std::to_string(hello.size) + " is not positive");
  return hello;
}

std::string encode_string_list(const std::vector<std::string>& items) {
  size_t total = 4;
  for (const auto& item : items) total += 8 + item.size();
  std::string out;
  out.reserve(total);
  put_u32(out, static_cast<uint32_t>(items.size()));
  for (const auto& item : items) {
    put_u64(out, item.size());
    out.append(item);
  }
  return out;
}

Result<std::vector<std::string>> decode_string_list(std::string_view payload, int64_t expected_count) {
  PayloadReader reader(payload);
  uint64_t count = 0;
  if (!reader.read(4, &count))
    return error(Code::ParseError, "bootstrap list truncated: " + std::to_string(payload.size()) + " bytes");
  if (expected_count >= 0 && count != static_cast<uint64_t>(expected_count))
    return error(Code::Mismatch, "bootstrap list has " + std::to_string(count) + " items, expected " +
                                     std::to_string(expected_count));
  // Every item needs at least its 8-byte length: reject counts the bytes cannot hold
  // before reserving anything.
  if (count > reader.left() / 8)
    return error(Code::ParseError, "bootstrap list claims " + std::to_string(count) + " items in " +
                                       std::to_string(reader.left()) + " bytes");
  std::vector<std::string> items(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t length = 0;
    if (!reader.read(8, &length))
      return error(Code::ParseError, "bootstrap list item " + std::to_string(i) + ": length truncated");
    if (!reader.read_bytes(length, &items[i]))
      return error(Code::ParseError, "bootstrap list item " + std::to_string(i) + " claims " +
                                         std::to_string(length) + " bytes, " + std::to_string(reader.left()) +
                                         " left");
  }
  if (reader.left() != 0)
    return error(Code::ParseError, "bootstrap list: " + std::to_string(reader.left()) + " trailing bytes");
  return items;
}

std::string encode_vote(bool yes, std::string_view reason) {
  std::string out;
  out.reserve(1 + reason.size());
  out.push_back(yes ? 1 : 0);
  out.append(reason);
  return out;
}

Result<Vote> decode_vote(std::string_view payload) {
  if (payload.empty()) return error(Code::ParseError, "bootstrap vote: empty payload");
  uint8_t flag = static_cast<uint8_t>(payload[0]);
  if (flag > 1) return error(Code::ParseError, "bootstrap vote: yes flag is " + std::to_string(flag) + ", not 0/1");
  Vote vote;
  vote.yes = flag == 1;
  vote.reason.assign(payload.substr(1));
  return vote;
}

std::string encode_abort(const Status& status) {
  std::string out;
  out.push_back(static_cast<char>(status.code()));
  out.append(status.message());
  return out;
}

Result<AbortNotice> decode_abort(std::string_view payload) {
  if (payload.empty()) return error(Code::ParseError, "bootstrap abort: empty payload");
  uint8_t code = static_cast<uint8_t>(payload[0]);
  if (code == 0 || code > static_cast<uint8_t>(Code::Internal))
    return error(Code::ParseError, "bootstrap abort: status code " + std::to_string(code) + " is not a failure");
  return AbortNotice{static_cast<Code>(code), std::string(payload.substr(1))};
}

Result<bool> tally_votes(std::vector<std::string>& votes, std::vector<std::string>* reasons) {
  bool all_yes = true;
  if (reasons) reasons->assign(votes.size(), std::string());
  for (size_t r = 0; r < votes.size(); ++r) {
    auto vote = decode_vote(votes[r]);
    if (!vote.is_ok()) return vote.status().with_context("vote of rank " + std::to_string(r));
    all_yes = all_yes && vote->yes;
    if (reasons) (*reasons)[r] = std::move(vote->reason);
  }
  return all_yes;
}

}  // namespace eplb::bootstrap
