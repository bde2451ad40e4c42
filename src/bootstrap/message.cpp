// Bootstrap wire format: encoders and bounds-checked decoders (see message.h).
#include "message.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/bytes.h"

namespace eplb::bootstrap {

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

MessageKind message_kind(Collective kind) {
  switch (kind) {
    case Collective::Allgather: return MessageKind::Allgather;
    case Collective::Barrier: return MessageKind::Barrier;
    case Collective::Vote: return MessageKind::Vote;
  }
  return MessageKind::Allgather;
}

std::string encode_header(const MessageHeader& header) {
  bytes::Writer writer;
  writer.u32(kMessageMagic);
  writer.u16(kMessageVersion);
  writer.u16(static_cast<uint16_t>(header.kind));
  writer.u64(header.sequence);
  writer.i32(header.sender);
  writer.u32(0);
  writer.u64(header.payload_bytes);
  return writer.take();
}

std::string encode_message(MessageKind kind, uint64_t sequence, int32_t sender, std::string_view payload) {
  std::string out = encode_header({kind, sequence, sender, payload.size()});
  out.append(payload);
  return out;
}

Result<MessageHeader> decode_header(std::span<const uint8_t> data) {
  if (data.size() < kHeaderBytes)
    return error(Code::ParseError,
                 fmt::format("bootstrap message header truncated: {} of {} bytes", data.size(), kHeaderBytes));
  bytes::Reader reader(data.first(kHeaderBytes));
  uint32_t magic = reader.u32();
  if (magic != kMessageMagic)
    return error(Code::ParseError,
                 fmt::format("not a bootstrap message: magic {:#010x}, expected {:#010x}", magic, kMessageMagic));
  uint16_t version = reader.u16();
  if (version != kMessageVersion)
    return error(Code::Mismatch, fmt::format("bootstrap message version {}, this eplb speaks {} (ranks from "
                                             "different eplb builds?)",
                                             version, kMessageVersion));
  uint16_t kind = reader.u16();
  if (kind == 0 || kind > kLastMessageKind)
    return error(Code::ParseError, fmt::format("bootstrap message of unknown kind {}", kind));
  MessageHeader header;
  header.kind = static_cast<MessageKind>(kind);
  header.sequence = reader.u64();
  header.sender = reader.i32();
  uint32_t reserved = reader.u32();
  header.payload_bytes = reader.u64();
  const std::string_view name = kind_name(header.kind);
  if (reserved != 0)
    return error(Code::ParseError, fmt::format("bootstrap {} message: reserved field is {}, not 0", name, reserved));
  if (header.sender < 0)
    return error(Code::ParseError, fmt::format("bootstrap {} message: negative sender rank {}", name, header.sender));
  if (header.payload_bytes > kMaxPayloadBytes)
    return error(Code::ParseError, fmt::format("bootstrap {} message from rank {}: payload of {} bytes exceeds the "
                                               "maximum of {}",
                                               name, header.sender, header.payload_bytes, kMaxPayloadBytes));
  return header;
}

Result<Message> decode_message(std::span<const uint8_t> data) {
  EPLB_ASSIGN_OR_RETURN(MessageHeader header, decode_header(data));
  size_t available = data.size() - kHeaderBytes;
  if (header.payload_bytes != available)
    return error(Code::ParseError, fmt::format("bootstrap {} message from rank {} says {} payload bytes, has {}",
                                               kind_name(header.kind), header.sender, header.payload_bytes,
                                               available));
  Message message;
  message.header = header;
  message.payload.assign(reinterpret_cast<const char*>(data.data() + kHeaderBytes), available);
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
  bytes::Writer writer;
  writer.i32(hello.size);
  writer.i32(hello.pid);
  std::string secret = hello.secret;
  secret.resize(kRunSecretBytes, '\0');
  return writer.take() + secret;
}

Result<Hello> decode_hello(std::string_view payload) {
  constexpr size_t kHelloBytes = 8 + kRunSecretBytes;
  if (payload.size() != kHelloBytes)
    return error(Code::ParseError, fmt::format("bootstrap hello payload has {} bytes, expected {}", payload.size(),
                                               kHelloBytes));
  bytes::Reader reader(payload);
  Hello hello;
  hello.size = reader.i32();
  hello.pid = reader.i32();
  hello.secret = std::string(payload.substr(8, kRunSecretBytes));
  if (hello.size <= 0)
    return error(Code::ParseError, fmt::format("bootstrap hello: group size {} is not positive", hello.size));
  return hello;
}

std::string encode_string_list(const std::vector<std::string>& items) {
  bytes::Writer writer;
  writer.u32(static_cast<uint32_t>(items.size()));
  for (const auto& item : items) writer.blob(item);
  return writer.take();
}

Result<std::vector<std::string>> decode_string_list(std::string_view payload, int64_t expected_count) {
  bytes::Reader reader(payload);
  uint64_t count = reader.u32();
  if (!reader.ok()) return error(Code::ParseError, fmt::format("bootstrap list truncated: {} bytes", payload.size()));
  if (expected_count >= 0 && count != static_cast<uint64_t>(expected_count))
    return error(Code::Mismatch, fmt::format("bootstrap list has {} items, expected {}", count, expected_count));
  // Every item needs at least its 8-byte length: reject counts the bytes cannot hold
  // before reserving anything.
  if (count > reader.remaining() / 8)
    return error(Code::ParseError,
                 fmt::format("bootstrap list claims {} items in {} bytes", count, reader.remaining()));
  std::vector<std::string> items(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    if (reader.remaining() < 8)
      return error(Code::ParseError, fmt::format("bootstrap list item {}: length truncated", i));
    const uint64_t length = bytes::load<uint64_t>(reinterpret_cast<const uint8_t*>(payload.data()) + reader.position());
    items[i] = std::string(reader.blob(reader.remaining()));
    if (!reader.ok())
      return error(Code::ParseError, fmt::format("bootstrap list item {} claims {} bytes, {} left", i, length,
                                                 reader.remaining() - 8));
  }
  if (reader.remaining() != 0)
    return error(Code::ParseError, fmt::format("bootstrap list: {} trailing bytes", reader.remaining()));
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
  if (flag > 1) return error(Code::ParseError, fmt::format("bootstrap vote: yes flag is {}, not 0/1", flag));
  Vote vote;
  vote.yes = flag == 1;
  vote.reason.assign(payload.substr(1));
  return vote;
}

std::string encode_abort(const Status& status) {
  bytes::Writer writer;
  writer.u8(static_cast<uint8_t>(status.code()));
  writer.i32(status.peer());
  writer.raw(status.message());
  return writer.take();
}

Result<AbortNotice> decode_abort(std::string_view payload) {
  bytes::Reader reader(payload);
  const uint8_t code = reader.u8();
  const int32_t peer = reader.i32();
  if (!reader.ok()) return error(Code::ParseError, fmt::format("bootstrap abort: {} bytes, too short", payload.size()));
  if (code == 0 || code > static_cast<uint8_t>(Code::Internal))
    return error(Code::ParseError, fmt::format("bootstrap abort: status code {} is not a failure", code));
  if (peer < -1) return error(Code::ParseError, fmt::format("bootstrap abort: peer {} is not a rank", peer));
  return AbortNotice{static_cast<Code>(code), peer, std::string(reader.raw(reader.remaining()))};
}

Result<bool> tally_votes(std::vector<std::string>& votes, std::vector<std::string>* reasons) {
  bool all_yes = true;
  if (reasons) reasons->assign(votes.size(), std::string());
  for (size_t r = 0; r < votes.size(); ++r) {
    auto vote = decode_vote(votes[r]);
    if (!vote.is_ok()) return vote.status().with_context(fmt::format("vote of rank {}", r));
    all_yes = all_yes && vote->yes;
    if (reasons) (*reasons)[r] = std::move(vote->reason);
  }
  return all_yes;
}

}  // namespace eplb::bootstrap
