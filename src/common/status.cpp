#include "eplb/status.h"

#include <cstdio>
#include <cstdlib>

namespace eplb {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::Ok: return "ok";
    case Code::InvalidArgument: return "invalid argument";
    case Code::NotFound: return "not found";
    case Code::Mismatch: return "mismatch";
    case Code::NotAllowed: return "not allowed";
    case Code::Backend: return "backend error";
    case Code::RemoteDisconnect: return "remote disconnect";
    case Code::Canceled: return "canceled";
    case Code::Timeout: return "timeout";
    case Code::IoError: return "I/O error";
    case Code::ParseError: return "parse error";
    case Code::Unsupported: return "unsupported";
    case Code::Aborted: return "aborted";
    case Code::Internal: return "internal error";
  }
  return "unknown";
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  std::string message;
  message.reserve(context.size() + 2 + message_.size());
  message.append(context).append(": ").append(message_);
  return Status(code_, std::move(message)).with_peer(peer_);
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string text(code_name(code_));
  text.append(": ").append(message_);
  return text;
}

void fail_on_missing_value(const Status& status) {
  std::fprintf(stderr, "eplb: Result::value() on an error: %s\n", status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace eplb
