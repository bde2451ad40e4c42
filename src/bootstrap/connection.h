// connection.h (internal) - non-blocking framed byte streams between ranks.
//
// A Connection owns a connected stream socket, a queue of outgoing bytes and
// an inbox of decoded messages. pump() moves bytes on a set of connections
// with poll() until a caller-supplied condition holds or the deadline passes.
// A connection that reaches EOF, fails, or delivers a malformed frame records
// why in `lost` and is never read or written again; messages that arrived
// before that stay in the inbox (an abort notice can precede the EOF).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "eplb/common.h"
#include "eplb/status.h"
#include "message.h"

namespace eplb::bootstrap {

class Connection {
 public:
  Connection(int fd, int peer) : fd_(fd), peer_(peer) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  int peer() const { return peer_; }
  void set_peer(int peer) { peer_ = peer; }
  bool alive() const { return fd_ >= 0 && lost_.is_ok(); }
  // Why the connection is gone (ok while alive).
  const Status& lost() const { return lost_; }

  void send(std::shared_ptr<const std::string> bytes);
  bool has_output() const { return !out_.empty(); }
  std::deque<Message>& inbox() { return inbox_; }

  // Non-blocking I/O steps, called by pump() when poll() says so.
  void read_available();
  void write_available();

 private:
  void mark_lost(Status why);

  int fd_;
  int peer_;
  FrameReader reader_;
  std::deque<std::pair<std::shared_ptr<const std::string>, size_t>> out_;
  std::deque<Message> inbox_;
  Status lost_;
};

// Moves bytes on `connections` until done() is true (returns ok) or the
// deadline passes (Timeout, message "deadline passed"; callers say more).
// done() is evaluated before every poll and after every I/O step.
Status pump(std::span<Connection* const> connections, Deadline deadline, const std::function<bool()>& done);

// "rank 2 (pid 123)" style helpers.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace eplb::bootstrap
