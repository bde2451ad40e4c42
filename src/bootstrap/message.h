// message.h (internal) - the wire format of bootstrap messages.
//
// Every message is a 32-byte little-endian header followed by a payload:
//   offset  0  u32  magic            "EPBS" (0x53425045)
//           4  u16  version          kMessageVersion
//           6  u16  kind             MessageKind
//           8  u64  sequence         collective number (0 for hello/welcome)
//          16  i32  sender           rank of the sender
//          20  u32  reserved         must be 0
//          24  u64  payload_bytes    <= kMaxPayloadBytes
// Decoders treat every byte as untrusted: a wrong magic, version, kind,
// reserved field or length is a ParseError (a Mismatch for a version from
// another eplb release); payload decoders check every count and length
// against the bytes actually present.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/bootstrap.h"
#include "eplb/status.h"

namespace eplb::bootstrap {

inline constexpr uint32_t kMessageMagic = 0x53425045;  // "EPBS" in memory order
// 2: the hello carries the run secret.
inline constexpr uint16_t kMessageVersion = 2;
// The per-run secret of launch_local_ranks, in raw bytes (256 bits).
inline constexpr size_t kRunSecretBytes = 32;
inline constexpr size_t kHeaderBytes = 32;
// Largest payload accepted: bounds what a corrupted length can make us allocate.
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{256} << 20;  // 256 MiB
// The stream reader's payload buffer grows by at most doubling from this size.
inline constexpr size_t kPayloadChunkBytes = 64 << 10;

enum class MessageKind : uint16_t {
  Hello = 1,        // rank -> hub: payload = encode_hello
  Welcome = 2,      // hub -> rank: every rank has joined; empty payload
  Allgather = 3,    // rank -> hub: the rank's contribution
  AllgatherResult,  // hub -> rank: encode_string_list of all contributions
  Barrier,          // rank -> hub: empty
  BarrierRelease,   // hub -> rank: empty
  Vote,             // rank -> hub: encode_vote
  VoteResult,       // hub -> rank: encode_string_list of every rank's encode_vote
  Abort,            // hub -> rank: encode_abort; the collective failed
};
inline constexpr uint16_t kLastMessageKind = static_cast<uint16_t>(MessageKind::Abort);

// "allgather", "vote result", ...
std::string_view kind_name(MessageKind kind);
// The request message of a collective.
MessageKind message_kind(Collective kind);

struct MessageHeader {
  MessageKind kind = MessageKind::Hello;
  uint64_t sequence = 0;
  int32_t sender = 0;
  uint64_t payload_bytes = 0;
};

struct Message {
  MessageHeader header;
  std::string payload;
};

// Header bytes for a message with this header (payload_bytes must be the real length).
std::string encode_header(const MessageHeader& header);
// Header + payload in one string.
std::string encode_message(MessageKind kind, uint64_t sequence, int32_t sender, std::string_view payload);
// Decodes and validates a header from exactly kHeaderBytes bytes.
Result<MessageHeader> decode_header(std::span<const uint8_t> bytes);
// Decodes exactly one whole message (no trailing bytes).
Result<Message> decode_message(std::span<const uint8_t> bytes);

// Incremental decoder for a byte stream: write up to want().size() bytes into
// want().data(), then commit(n). commit returns true when a message is complete
// (take() it before writing more); a malformed header is an error and the
// stream is unusable afterwards. Memory grows with the bytes received, not
// with the length a header claims.
class FrameReader {
 public:
  std::span<uint8_t> want();
  Result<bool> commit(size_t bytes);
  Message take();
  // True when no partial message is buffered.
  bool at_boundary() const { return header_filled_ == 0 && !complete_; }

 private:
  uint8_t header_[kHeaderBytes] = {};
  size_t header_filled_ = 0;
  bool have_header_ = false;
  bool complete_ = false;
  Message message_;
  size_t payload_filled_ = 0;
};

// Payload codecs.
// Payload: i32 size, i32 pid, then kRunSecretBytes of the run secret
// (zeros when the rank has none): exactly 40 bytes.
struct Hello {
  int32_t size = 0;    // the group size the sender was started with
  int32_t pid = 0;     // for error messages
  std::string secret;  // kRunSecretBytes raw bytes, or empty (sent as zeros)
};
std::string encode_hello(const Hello& hello);
Result<Hello> decode_hello(std::string_view payload);

// A list of byte strings: u32 count, then per item u64 length + bytes.
std::string encode_string_list(const std::vector<std::string>& items);
// `expected_count` < 0 accepts any count.
Result<std::vector<std::string>> decode_string_list(std::string_view payload, int64_t expected_count = -1);

// A vote: u8 yes (0 or 1) + the reason bytes.
std::string encode_vote(bool yes, std::string_view reason);
struct Vote {
  bool yes = false;
  std::string reason;
};
Result<Vote> decode_vote(std::string_view payload);
// Decodes every rank's encoded vote: true when all voted yes. `reasons`
// (optional) receives each rank's reason. A malformed vote names its rank.
Result<bool> tally_votes(std::vector<std::string>& votes, std::vector<std::string>* reasons);

// An abort: u8 status code, i32 the rank it names (Status::peer, -1 none),
// then the message bytes.
std::string encode_abort(const Status& status);
struct AbortNotice {
  Code code = Code::Internal;
  int peer = -1;
  std::string message;
  Status status() const { return Status(code, message).with_peer(peer); }
};
Result<AbortNotice> decode_abort(std::string_view payload);

}  // namespace eplb::bootstrap
