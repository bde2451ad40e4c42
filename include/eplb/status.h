// eplb/status.h - errors as values.
//
// Contract: every fallible eplb function returns a Status or a Result<T>.
// A failure carries a Code (NIXL's taxonomy plus Timeout and file/parse
// errors) and a message with context: the layer, expert, peer, operation,
// state, bytes and elapsed time that apply. Messages are built innermost
// first and widened with with_context() on the way up. Nothing here throws;
// exceptions and exit codes exist only at the edges (the CLI today).
// Reading the value of a Result that holds an error is a bug in the caller:
// it stops the process with the error's message (never undefined behaviour).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace eplb {

enum class Code : uint8_t {
  Ok = 0,
  InvalidArgument,   // invalid parameter: bad option, bad shape, bad index
  NotFound,          // unknown peer, descriptor outside every registered region
  Mismatch,          // peers disagree (layout, metadata version, checksum)
  NotAllowed,        // operation not allowed in the current state
  Backend,           // the transport reported an error
  RemoteDisconnect,  // the peer vanished
  Canceled,          // released or aborted before completion
  Timeout,           // a deadline passed
  IoError,           // cannot open / read / write a file
  ParseError,        // a file's or message's content is malformed
  Unsupported,       // valid but not supported (dtype, feature)
  Aborted,           // a migration round stopped; state kept consistent
  Internal,          // a broken invariant inside eplb (a bug)
};

// Short lower-case name of a code, e.g. "remote disconnect".
std::string_view code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == Code::Ok; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<context>: <message>"; a no-op on an ok status. Keeps peer().
  Status with_context(std::string_view context) const;
  // "<code name>: <message>", for logs and the CLI.
  std::string to_string() const;
  // The rank (of the process group) the failure is about, when one is: the
  // rank that was lost, did not answer, or voted no; -1 otherwise. Set by
  // whoever knows it, so that callers need not find it in the message.
  int peer() const { return peer_; }
  Status with_peer(int rank) const {
    Status copy = *this;
    if (!copy.is_ok()) copy.peer_ = rank;
    return copy;
  }

 private:
  Code code_ = Code::Ok;
  std::string message_;
  int peer_ = -1;
};

inline Status error(Code code, std::string message) { return Status(code, std::move(message)); }

// Prints "eplb: Result::value() on an error: <status>" to stderr and aborts.
[[noreturn]] void fail_on_missing_value(const Status& status);

// A value or the Status saying why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.is_ok()) status_ = Status(Code::Internal, "Result built from an ok Status without a value");
  }

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }

  T& value() & { return checked(); }
  const T& value() const& { return checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return checked(); }

 private:
  T& checked() {
    if (!value_) [[unlikely]] fail_on_missing_value(status_);
    return *value_;
  }
  const T& checked() const {
    if (!value_) [[unlikely]] fail_on_missing_value(status_);
    return *value_;
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace eplb

#define EPLB_CONCAT_INNER_(a, b) a##b
#define EPLB_CONCAT_(a, b) EPLB_CONCAT_INNER_(a, b)

// Return the Status if it is a failure.
#define EPLB_TRY(expr)                                    \
  do {                                                    \
    ::eplb::Status eplb_try_status_ = (expr);             \
    if (!eplb_try_status_.is_ok()) return eplb_try_status_; \
  } while (0)

// `EPLB_ASSIGN_OR_RETURN(auto x, make_x());` declares x or returns the failure.
#define EPLB_ASSIGN_OR_RETURN(lhs, expr) \
  EPLB_ASSIGN_OR_RETURN_IMPL_(EPLB_CONCAT_(eplb_result_, __LINE__), lhs, expr)
#define EPLB_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
