// xfer_bench_wire.cpp - the control socket of `eplb xfer-bench` between the
// initiator and the target, and the --check content (see xfer_bench.h).
#include <fmt/format.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/bytes.h"
#include "eplb/bootstrap.h"
#include "common/text.h"
#include "xfer_bench.h"

namespace eplb::cli::xfer_bench {
namespace {

bool write_all(int fd, const void* data, size_t length) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = ::write(fd, bytes, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t length) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = ::read(fd, bytes, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

constexpr uint64_t kMaxMessageBytes = 1 << 24;

}  // namespace

// Bounds every blocking read and write on the control socket `fd`: one
// that waits longer than `seconds` fails (EAGAIN), so read_all / write_all
// return false instead of hanging on a stopped peer.
void set_io_timeout(int fd, double seconds) {
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(seconds);
  limit.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(limit.tv_sec)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
}

bool send_message(int fd, char type, const std::vector<uint8_t>& payload) {
  uint8_t header[9];
  header[0] = static_cast<uint8_t>(type);
  bytes::store<uint64_t>(header + 1, payload.size());
  return write_all(fd, header, sizeof header) && write_all(fd, payload.data(), payload.size());
}

bool receive_message(int fd, char* type, std::vector<uint8_t>* payload) {
  uint8_t header[9];
  if (!read_all(fd, header, sizeof header)) return false;
  const uint64_t length = bytes::load<uint64_t>(header + 1);
  if (length > kMaxMessageBytes) return false;
  *type = static_cast<char>(header[0]);
  payload->resize(length);
  return read_all(fd, payload->data(), length);
}

uint8_t pattern_byte(uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x ^ (x >> 29));
}

void fill_pattern(uint8_t* data, size_t length, uint64_t salt) {
  for (size_t i = 0; i < length; ++i) data[i] = pattern_byte(i + salt);
}

Status check_peer(const std::string& peer) {
  const auto colon = peer.rfind(':');
  if (colon == std::string::npos) return error(Code::InvalidArgument, "--peer must be HOST:PORT, got '" + peer + "'");
  if (auto number = text::parse_int_in(peer.substr(colon + 1), "--peer port", 1, 65535); !number)
    return number.status();
  return Status::ok();
}

Result<int> connect_to(const std::string& peer) {
  EPLB_TRY(check_peer(peer));
  const auto colon = peer.rfind(':');
  const std::string host = peer.substr(0, colon), port = peer.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return error(Code::InvalidArgument, "--peer: cannot resolve '" + peer + "'");
  }
  int fd = -1;
  for (addrinfo* at = found; at != nullptr && fd < 0; at = at->ai_next) {
    fd = ::socket(at->ai_family, at->ai_socktype, at->ai_protocol);
    if (fd >= 0 && ::connect(fd, at->ai_addr, at->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return error(Code::RemoteDisconnect, "--peer: cannot connect to " + peer);
  return fd;
}

// Waits up to `timeout_seconds` for one connection on `bind_address`:`port`.
Result<int> accept_one(const std::string& bind_address, int port, double timeout_seconds) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (port < 1 || port > 65535)
    return error(Code::InvalidArgument, fmt::format("--listen: port {} is not in 1-65535", port));
  if (::inet_pton(AF_INET, bind_address.c_str(), &address.sin_addr) != 1)
    return error(Code::InvalidArgument, "--bind: '" + bind_address + "' is not an IPv4 address");
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return error(Code::IoError, "socket failed");
  const int yes = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(listener, 1) != 0) {
    const int saved = errno;
    ::close(listener);
    return error(Code::IoError, fmt::format("--listen: cannot listen on {}:{}: {}", bind_address, port,
                                            std::strerror(saved)));
  }
  std::fprintf(stderr, "xfer-bench: target listening on %s:%d (for %s)\n", bind_address.c_str(), port,
               format_seconds(timeout_seconds).c_str());
  const Deadline deadline = Deadline::after_seconds(timeout_seconds);
  for (;;) {
    pollfd ready{listener, POLLIN, 0};
    const int waited = ::poll(&ready, 1, static_cast<int>(std::clamp(deadline.remaining_seconds() * 1e3, 1.0, 1000.0)));
    if (waited > 0) break;
    if (waited < 0 && errno != EINTR) {
      ::close(listener);
      return error(Code::IoError, std::string("--listen: poll failed: ") + std::strerror(errno));
    }
    if (deadline.expired()) {
      ::close(listener);
      return error(Code::Timeout, fmt::format("--listen: no --peer connected to port {} within {} (--listen-timeout)",
                                              port, format_seconds(timeout_seconds)));
    }
  }
  const int fd = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  if (fd < 0) return error(Code::IoError, "--listen: accept failed");
  return fd;
}

namespace {
Result<std::string> secret_from_environment(const char* hex) {
  auto raw = run_secret_bytes(hex);
  if (!raw) return raw.status().with_context("EPLB_XFER_BENCH_SECRET");
  return raw;
}
}  // namespace

Result<std::string> listen_secret() {
  const char* hex = std::getenv("EPLB_XFER_BENCH_SECRET");
  if (hex && *hex) return secret_from_environment(hex);
  EPLB_ASSIGN_OR_RETURN(std::string fresh, make_run_secret());
  std::fprintf(stderr, "eplb xfer-bench: this target's secret; give it to the --peer side as\n"
                       "  EPLB_XFER_BENCH_SECRET=%s\n", fresh.c_str());
  return run_secret_bytes(fresh);
}

Result<std::string> peer_secret() {
  const char* hex = std::getenv("EPLB_XFER_BENCH_SECRET");
  if (!hex || !*hex)
    return error(Code::InvalidArgument, "--peer: set EPLB_XFER_BENCH_SECRET to the secret the --listen target "
                                        "printed (or gave it in its own environment)");
  return secret_from_environment(hex);
}

bool send_secret(int fd, const std::string& raw_secret) {
  return send_message(fd, 'A', std::vector<uint8_t>(raw_secret.begin(), raw_secret.end()));
}

Status check_secret(int fd, const std::string& raw_secret, double timeout_seconds) {
  pollfd readable{fd, POLLIN, 0};
  const double milliseconds = std::min(timeout_seconds * 1e3, 86400e3);
  if (::poll(&readable, 1, static_cast<int>(std::ceil(milliseconds))) <= 0)
    return error(Code::Timeout, fmt::format("xfer-bench target: no message from the initiator for {} (--timeout)",
                                            format_seconds(timeout_seconds)));
  char type = 0;
  std::vector<uint8_t> payload;
  if (!receive_message(fd, &type, &payload))
    return error(Code::NotAllowed, "xfer-bench target: the initiator sent no secret (a malformed, truncated or "
                                   "missing first message, or none within --timeout); nothing was sent to it");
  uint8_t differ = payload.size() == raw_secret.size() ? 0 : 1;
  for (size_t i = 0; i < payload.size() && i < raw_secret.size(); ++i)
    differ |= static_cast<uint8_t>(payload[i] ^ static_cast<uint8_t>(raw_secret[i]));
  if (type != 'A' || differ != 0)
    return error(Code::NotAllowed, fmt::format("xfer-bench target: the initiator's first message (type 0x{:02x}, {} "
                                               "bytes) does not carry EPLB_XFER_BENCH_SECRET; nothing was sent to it",
                                               static_cast<uint8_t>(type), payload.size()));
  return Status::ok();
}

}  // namespace eplb::cli::xfer_bench
