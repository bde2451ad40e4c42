// libFuzzer target: bootstrap messages from an untrusted peer.
// Feeds the bytes to the whole-message decoder, to the incremental stream
// reader (in chunks whose sizes come from the input), and to every payload
// decoder; a decoded message must re-encode to exactly the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

// The decoder is compiled into this translation unit so that libFuzzer's
// coverage instrumentation (applied to fuzzer sources only) sees its branches.
#include "../src/bootstrap/message.cpp"

using namespace eplb::bootstrap;

namespace {

// A decoded hello (version 2: size, pid, the 32-byte run secret) re-encodes
// to exactly its payload, secret included.
void check_hello(std::string_view payload) {
  auto hello = decode_hello(payload);
  if (!hello.is_ok()) return;
  if (hello->secret.size() != kRunSecretBytes || encode_hello(*hello) != payload) __builtin_trap();
}

void decode_payload(const Message& message) {
  switch (message.header.kind) {
    case MessageKind::Hello: check_hello(message.payload); break;
    case MessageKind::AllgatherResult: (void)decode_string_list(message.payload, 4); break;
    case MessageKind::VoteResult: {
      auto votes = decode_string_list(message.payload);
      if (votes.is_ok())
        for (const auto& vote : *votes) (void)decode_vote(vote);
      break;
    }
    case MessageKind::Vote: (void)decode_vote(message.payload); break;
    case MessageKind::Abort: (void)decode_abort(message.payload); break;
    default: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  auto whole = decode_message(bytes);
  if (whole.is_ok()) {
    decode_payload(*whole);
    std::string again = encode_message(whole->header.kind, whole->header.sequence, whole->header.sender,
                                       whole->payload);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  }

  // The stream reader, fed in chunks of 1..16 bytes chosen by the input itself.
  FrameReader reader;
  size_t offset = 0;
  size_t step = 0;
  while (offset < size) {
    auto room = reader.want();
    if (room.empty()) __builtin_trap();  // a complete message must have been taken
    size_t chunk = 1 + (data[step++ % size] & 15);
    chunk = std::min({chunk, room.size(), size - offset});
    std::memcpy(room.data(), data + offset, chunk);
    offset += chunk;
    auto complete = reader.commit(chunk);
    if (!complete.is_ok()) break;
    if (*complete) decode_payload(reader.take());
  }

  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)decode_string_list(text);
  (void)decode_vote(text);
  check_hello(text);
  (void)decode_abort(text);
  return 0;
}
