// Non-blocking framed streams over sockets (see connection.h).
#include <fmt/format.h>
#include "connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace eplb::bootstrap {

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

void Connection::mark_lost(Status why) {
  if (lost_.is_ok()) lost_ = std::move(why);
}

void Connection::send(std::shared_ptr<const std::string> bytes) {
  if (bytes && !bytes->empty()) out_.emplace_back(std::move(bytes), 0);
}

void Connection::read_available() {
  while (alive()) {
    std::span<uint8_t> room = reader_.want();
    ssize_t got = ::recv(fd_, room.data(), room.size(), 0);
    if (got > 0) {
      Result<bool> complete = reader_.commit(static_cast<size_t>(got));
      if (!complete.is_ok()) {
        mark_lost(complete.status().with_context(fmt::format("malformed stream from rank {}", peer_)));
        return;
      }
      if (*complete) inbox_.push_back(reader_.take());
      continue;
    }
    if (got == 0) {
      mark_lost(error(Code::RemoteDisconnect,
                      reader_.at_boundary() ? "connection closed by the peer (EOF)"
                                            : "connection closed by the peer (EOF in the middle of a message)"));
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    mark_lost(error(Code::RemoteDisconnect, std::string("connection failed: ") + std::strerror(errno)));
    return;
  }
}

void Connection::write_available() {
  while (alive() && !out_.empty()) {
    auto& [bytes, offset] = out_.front();
    ssize_t sent = ::send(fd_, bytes->data() + offset, bytes->size() - offset, MSG_NOSIGNAL);
    if (sent > 0) {
      offset += static_cast<size_t>(sent);
      if (offset == bytes->size()) out_.pop_front();
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    int saved = errno;
    // The peer may have said why before closing (an abort notice): read what is there first.
    read_available();
    mark_lost(error(Code::RemoteDisconnect, std::string("connection failed while sending: ") +
                                                (sent == 0 ? "nothing written" : std::strerror(saved))));
    return;
  }
}

Status pump(std::span<Connection* const> connections, Deadline deadline, const std::function<bool()>& done) {
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  while (true) {
    if (done()) return Status::ok();
    fds.clear();
    polled.clear();
    for (Connection* connection : connections) {
      if (!connection || !connection->alive()) continue;
      short events = POLLIN;
      if (connection->has_output()) events |= POLLOUT;
      fds.push_back({connection->fd(), events, 0});
      polled.push_back(connection);
    }
    auto left = deadline.remaining();
    if (left.count() == 0) return error(Code::Timeout, "deadline passed");
    if (fds.empty()) return error(Code::RemoteDisconnect, "no live connection left");
    // Round up so we do not spin on a sub-millisecond remainder.
    int timeout_ms = static_cast<int>(std::min<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 1000));
    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return error(Code::Internal, std::string("poll failed: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      short revents = fds[i].revents;
      if (revents == 0) continue;
      if (revents & POLLOUT) polled[i]->write_available();
      if (revents & (POLLIN | POLLHUP | POLLERR)) polled[i]->read_available();
      if ((revents & POLLNVAL) && polled[i]->alive())
        return error(Code::Internal, fmt::format("poll: invalid descriptor for rank {}", polled[i]->peer()));
    }
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    if (i >= 16) {
      text += fmt::format("... ({} in all)", ranks.size());
      break;
    }
    fmt::format_to(std::back_inserter(text), "{}", ranks[i]);
  }
  return text;
}

}  // namespace eplb::bootstrap
