// The `local` process group: ranks on one machine joined in a star over
// Unix-domain sockets in a private rendezvous directory. Rank 0 is the hub:
// it listens on <dir>/hub.sock, every other rank connects (retrying until
// connect_timeout) and says hello; the hub answers welcome once all joined.
// A collective: every rank sends its frame to the hub; the hub checks kind
// and sequence number of each, then sends the combined result to every rank.
// When the hub fails a collective (a rank lost, silent, late or diverging) it
// sends an abort notice naming the culprit to every other rank, so all ranks
// report the same cause. The hub stops waiting a little before the caller's
// deadline (kHubMargin) so its notice arrives before the others give up.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "connection.h"
#include "eplb/bootstrap.h"
#include "message.h"

namespace eplb {
namespace {

using bootstrap::Connection;
using bootstrap::Message;
using bootstrap::MessageKind;

constexpr double kHubMarginSeconds = 0.2;  // at most; 10% of the remaining time when shorter

std::string hub_socket_path(const std::string& dir) { return dir + "/hub.sock"; }

std::string collective_name(MessageKind kind, uint64_t sequence) {
  return std::string(bootstrap::kind_name(kind)) + " #" + std::to_string(sequence);
}

MessageKind result_kind_of(MessageKind kind) {
  switch (kind) {
    case MessageKind::Allgather: return MessageKind::AllgatherResult;
    case MessageKind::Barrier: return MessageKind::BarrierRelease;
    case MessageKind::Vote: return MessageKind::VoteResult;
    default: return MessageKind::Abort;
  }
}

Status socket_address(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  if (path.size() + 1 > sizeof address->sun_path)
    return error(Code::InvalidArgument, "rendezvous socket path '" + path + "' is " + std::to_string(path.size()) +
                                            " bytes; Unix sockets allow at most " +
                                            std::to_string(sizeof address->sun_path - 1) +
                                            " (use a shorter rendezvous directory)");
  std::memcpy(address->sun_path, path.c_str(), path.size() + 1);
  return Status::ok();
}

// Larger socket buffers: fewer poll() round trips for megabyte contributions
// (the kernel caps this at net.core.wmem_max; failure is harmless).
// Pumps the hub connection until its first message arrives (moved into
// *message), the hub is gone or the deadline passes.
Status await_hub_message(Connection* hub, Deadline deadline, std::optional<Message>* message) {
  Connection* hubs[] = {hub};
  return bootstrap::pump(hubs, deadline, [&] {
    if (!hub->inbox().empty()) {
      *message = std::move(hub->inbox().front());
      hub->inbox().pop_front();
      return true;
    }
    return !hub->alive();
  });
}

void enlarge_socket_buffers(int fd) {
  int bytes = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup(int rank, int size) : rank_(rank), size_(size), peers_(static_cast<size_t>(size)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "local"; }

  Result<std::vector<std::string>> allgather(const std::string& mine, Deadline deadline) override {
    return collective(MessageKind::Allgather, mine, deadline);
  }
  Status barrier(Deadline deadline) override {
    return collective(MessageKind::Barrier, std::string(), deadline).status();
  }
  Result<bool> vote(bool yes, const std::string& reason, Deadline deadline,
                    std::vector<std::string>* reasons) override {
    EPLB_ASSIGN_OR_RETURN(std::vector<std::string> votes,
                          collective(MessageKind::Vote, bootstrap::encode_vote(yes, reason), deadline));
    return bootstrap::tally_votes(votes, reasons);
  }

  Status join_as_hub(const std::string& dir, Deadline deadline);
  Status join_as_member(const std::string& dir, Deadline deadline);

 private:
  Result<std::vector<std::string>> collective(MessageKind kind, std::string mine, Deadline deadline);
  Result<std::vector<std::string>> hub_collective(MessageKind kind, uint64_t sequence, std::string mine,
                                                  Deadline deadline);
  Result<std::vector<std::string>> member_collective(MessageKind kind, uint64_t sequence, std::string mine,
                                                     Deadline deadline);
  // Hub only: tells every other live rank that `sequence` failed, and why.
  void abort_members(uint64_t sequence, const Status& why, int except_rank);
  std::vector<Connection*> live_members();
  Status check_member_message(const Message& message, int from, MessageKind kind, uint64_t sequence);

  int rank_;
  int size_;
  uint64_t sequence_ = 0;
  // Hub: peers_[r] is the connection to rank r (r >= 1). Member: peers_[0] is the hub.
  std::vector<std::unique_ptr<Connection>> peers_;
};

std::vector<Connection*> LocalGroup::live_members() {
  std::vector<Connection*> out;
  for (int r = 1; r < size_; ++r)
    if (peers_[r] && peers_[r]->alive()) out.push_back(peers_[r].get());
  return out;
}

void LocalGroup::abort_members(uint64_t sequence, const Status& why, int except_rank) {
  auto notice = std::make_shared<const std::string>(
      bootstrap::encode_message(MessageKind::Abort, sequence, rank_, bootstrap::encode_abort(why)));
  std::vector<Connection*> targets;
  for (Connection* member : live_members()) {
    if (member->peer() == except_rank) continue;
    member->send(notice);
    targets.push_back(member);
  }
  // Best effort, briefly: the notice is small and the members are waiting for the hub.
  (void)bootstrap::pump(targets, Deadline::after_seconds(0.5), [&] {
    return std::none_of(targets.begin(), targets.end(),
                        [](Connection* c) { return c->alive() && c->has_output(); });
  });
}

Status LocalGroup::check_member_message(const Message& message, int from, MessageKind kind, uint64_t sequence) {
  const auto& header = message.header;
  if (header.sender != from)
    return error(Code::Mismatch, "the connection of rank " + std::to_string(from) +
                                     " carried a message claiming to be from rank " + std::to_string(header.sender));
  if (header.kind != kind || header.sequence != sequence) {
    std::string detail = "rank " + std::to_string(from) + " sent " + collective_name(header.kind, header.sequence) +
                         " while rank " + std::to_string(rank_) + " is in " + collective_name(kind, sequence);
    if (header.sequence < sequence)
      detail += ": rank " + std::to_string(from) + " is late (an earlier collective failed or was skipped there)";
    else if (header.sequence > sequence)
      detail += ": rank " + std::to_string(from) + " is ahead (a collective was skipped or failed on rank " +
                std::to_string(rank_) + ")";
    else
      detail += ": collectives must be called in the same order on every rank";
    return error(Code::Mismatch, detail);
  }
  if (kind == MessageKind::Vote) {
    auto vote = bootstrap::decode_vote(message.payload);
    if (!vote.is_ok()) return vote.status().with_context("rank " + std::to_string(from));
  }
  return Status::ok();
}

Result<std::vector<std::string>> LocalGroup::collective(MessageKind kind, std::string mine, Deadline deadline) {
  uint64_t sequence = ++sequence_;
  if (size_ == 1) {
    if (kind == MessageKind::Barrier) return std::vector<std::string>{};
    return std::vector<std::string>{std::move(mine)};
  }
  uint64_t result_bytes = 4 + static_cast<uint64_t>(size_) * (8 + mine.size());
  if (mine.size() > bootstrap::kMaxPayloadBytes || result_bytes > bootstrap::kMaxPayloadBytes)
    return error(Code::InvalidArgument, collective_name(kind, sequence) + ": " + std::to_string(mine.size()) +
                                            " bytes per rank x " + std::to_string(size_) +
                                            " ranks exceeds the bootstrap message limit of " +
                                            format_bytes(bootstrap::kMaxPayloadBytes));
  if (rank_ == 0) return hub_collective(kind, sequence, std::move(mine), deadline);
  return member_collective(kind, sequence, std::move(mine), deadline);
}

Result<std::vector<std::string>> LocalGroup::hub_collective(MessageKind kind, uint64_t sequence, std::string mine,
                                                            Deadline deadline) {
  const std::string what = collective_name(kind, sequence);
  Stopwatch elapsed;
  double margin = std::min(kHubMarginSeconds, 0.1 * deadline.remaining_seconds());
  Deadline gather_deadline(deadline.at() - std::chrono::nanoseconds(static_cast<int64_t>(margin * 1e9)));

  std::vector<std::optional<std::string>> got(static_cast<size_t>(size_));
  got[0] = std::move(mine);
  Status failure;
  int failed_rank = -1;
  auto gathered = [&] {
    bool all = true;
    for (int r = 1; r < size_; ++r) {
      Connection* member = peers_[r].get();
      while (!got[r] && !member->inbox().empty()) {
        Message message = std::move(member->inbox().front());
        member->inbox().pop_front();
        Status checked = check_member_message(message, r, kind, sequence);
        if (!checked.is_ok()) {
          failure = checked;
          failed_rank = r;
          return true;
        }
        got[r] = std::move(message.payload);
      }
      if (got[r]) continue;
      if (!member->alive()) {
        failure = error(member->lost().code() == Code::RemoteDisconnect ? Code::RemoteDisconnect
                                                                          : member->lost().code(),
                        "rank " + std::to_string(r) + " lost: " + member->lost().message());
        failed_rank = r;
        return true;
      }
      all = false;
    }
    return all;
  };
  std::vector<Connection*> members;
  for (int r = 1; r < size_; ++r) members.push_back(peers_[r].get());
  Status pumped = bootstrap::pump(members, gather_deadline, gathered);
  if (failure.is_ok() && !pumped.is_ok()) {
    std::vector<int> missing, present;
    for (int r = 0; r < size_; ++r) (got[r] ? present : missing).push_back(r);
    if (pumped.code() == Code::Timeout)
      failure = error(Code::Timeout, "rank" + std::string(missing.size() > 1 ? "s " : " ") +
                                         bootstrap::rank_list(missing) + (missing.size() > 1 ? " have" : " has") +
                                         " not answered within " + format_seconds(elapsed.seconds()) +
                                         " (answered: ranks " + bootstrap::rank_list(present) + ")");
    else
      failure = pumped;
  }
  if (!failure.is_ok()) {
    failure = failure.with_context(what);
    abort_members(sequence, failure, -1);
    return failure;
  }

  std::vector<std::string> contributions(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) contributions[r] = std::move(*got[r]);
  std::string payload = kind == MessageKind::Barrier ? std::string() : bootstrap::encode_string_list(contributions);
  auto reply = std::make_shared<const std::string>(
      bootstrap::encode_message(result_kind_of(kind), sequence, rank_, payload));
  for (Connection* member : members) member->send(reply);
  pumped = bootstrap::pump(members, deadline, [&] {
    for (Connection* member : members) {
      if (!member->alive()) {
        failure = error(Code::RemoteDisconnect, "rank " + std::to_string(member->peer()) +
                                                    " lost while receiving the result: " + member->lost().message());
        failed_rank = member->peer();
        return true;
      }
    }
    return std::none_of(members.begin(), members.end(), [](Connection* c) { return c->has_output(); });
  });
  if (failure.is_ok() && !pumped.is_ok()) {
    std::vector<int> slow;
    for (Connection* member : members)
      if (member->has_output()) slow.push_back(member->peer());
    failure = error(Code::Timeout, "ranks " + bootstrap::rank_list(slow) + " did not take the result within " +
                                       format_seconds(elapsed.seconds()));
  }
  if (!failure.is_ok()) {
    failure = failure.with_context(what);
    abort_members(sequence, failure, -1);
    return failure;
  }
  if (kind == MessageKind::Barrier) return std::vector<std::string>{};
  return contributions;
}

Result<std::vector<std::string>> LocalGroup::member_collective(MessageKind kind, uint64_t sequence, std::string mine,
                                                               Deadline deadline) {
  const std::string what = collective_name(kind, sequence);
  const std::string self = "rank " + std::to_string(rank_);
  Stopwatch elapsed;
  Connection* hub = peers_[0].get();
  if (hub->alive())
    hub->send(std::make_shared<const std::string>(bootstrap::encode_message(kind, sequence, rank_, mine)));
  std::optional<Message> reply;
  Status pumped = await_hub_message(hub, deadline, &reply);
  if (reply) {
    const auto& header = reply->header;
    if (header.sender != 0)
      return error(Code::Mismatch, what + ": the hub's connection carried a message claiming to be from rank " +
                                       std::to_string(header.sender));
    if (header.kind == MessageKind::Abort && header.sequence == sequence) {
      auto reported = bootstrap::decode_abort(reply->payload);
      if (!reported.is_ok()) return reported.status().with_context(what + ": abort notice from rank 0");
      return Status(reported->code, reported->message + " (reported by rank 0 to " + self + ")");
    }
    if (header.kind != result_kind_of(kind) || header.sequence != sequence)
      return error(Code::Mismatch, what + ": rank 0 answered with " +
                                       collective_name(header.kind, header.sequence) + " while " + self + " is in " +
                                       what + (header.sequence < sequence ? " (the answer is stale: " + self +
                                                                                " gave up on an earlier collective)"
                                                                          : ""));
    if (kind == MessageKind::Barrier) {
      if (!reply->payload.empty())
        return error(Code::ParseError, what + ": barrier release from rank 0 carries " +
                                           std::to_string(reply->payload.size()) + " unexpected bytes");
      return std::vector<std::string>{};
    }
    auto items = bootstrap::decode_string_list(reply->payload, size_);
    if (!items.is_ok()) return items.status().with_context(what + ": result from rank 0");
    if ((*items)[static_cast<size_t>(rank_)] != mine)
      return error(Code::Mismatch, what + ": the result from rank 0 does not hold " + self + "'s contribution");
    return items;
  }
  if (!hub->alive())
    return error(Code::RemoteDisconnect,
                 what + ": rank 0 lost (" + hub->lost().message() + "); rank 0 is the hub of the local group");
  if (pumped.code() == Code::Timeout)
    return error(Code::Timeout, what + ": no answer from rank 0 (the hub) within " +
                                    format_seconds(elapsed.seconds()) +
                                    (hub->has_output() ? "; rank 0 did not even take " + self + "'s contribution"
                                                       : "; rank 0 answers once every rank has contributed, so "
                                                         "another rank (or rank 0) is stuck or slow"));
  return pumped.with_context(what);
}

Status LocalGroup::join_as_hub(const std::string& dir, Deadline deadline) {
  const std::string path = hub_socket_path(dir);
  sockaddr_un address;
  EPLB_TRY(socket_address(path, &address));
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener < 0) return error(Code::IoError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
  struct ListenerGuard {
    int fd;
    std::string path;
    ~ListenerGuard() {
      ::close(fd);
      ::unlink(path.c_str());
    }
  } guard{listener, path};
  ::unlink(path.c_str());
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    return error(Code::IoError, "cannot bind the rendezvous socket " + path + ": " + std::strerror(errno));
  if (::listen(listener, std::min(size_, 4096)) != 0)
    return error(Code::IoError, "cannot listen on " + path + ": " + std::strerror(errno));

  std::vector<std::unique_ptr<Connection>> pending;
  int joined = 0;
  Status failure;
  auto check_hellos = [&] {
    for (auto& connection : pending) {
      if (!connection) continue;
      if (!connection->inbox().empty()) {
        Message message = std::move(connection->inbox().front());
        connection->inbox().pop_front();
        const auto& header = message.header;
        if (header.kind != MessageKind::Hello || header.sequence != 0) {
          failure = error(Code::Mismatch, "a process in the rendezvous directory sent " +
                                              collective_name(header.kind, header.sequence) + " instead of hello");
          return true;
        }
        auto hello = bootstrap::decode_hello(message.payload);
        if (!hello.is_ok()) {
          failure = hello.status().with_context("hello of rank " + std::to_string(header.sender));
          return true;
        }
        int from = header.sender;
        if (hello->size != size_) {
          failure = error(Code::Mismatch, "rank " + std::to_string(from) + " (pid " + std::to_string(hello->pid) +
                                              ") was started for a group of " + std::to_string(hello->size) +
                                              " ranks, rank 0 for " + std::to_string(size_));
          return true;
        }
        if (from <= 0 || from >= size_) {
          failure = error(Code::Mismatch, "a process (pid " + std::to_string(hello->pid) + ") claims rank " +
                                              std::to_string(from) + " in a group of " + std::to_string(size_));
          return true;
        }
        if (peers_[from]) {
          failure = error(Code::Mismatch, "two processes claim rank " + std::to_string(from) + " (the second is pid " +
                                              std::to_string(hello->pid) + ")");
          return true;
        }
        connection->set_peer(from);
        peers_[from] = std::move(connection);
        ++joined;
      } else if (!connection->alive()) {
        connection.reset();  // went away before saying who it is
      }
    }
    for (int r = 1; r < size_; ++r) {
      if (peers_[r] && !peers_[r]->alive()) {
        failure = error(Code::RemoteDisconnect, "rank " + std::to_string(r) + " lost while the group was forming: " +
                                                    peers_[r]->lost().message());
        return true;
      }
    }
    return joined == size_ - 1;
  };

  while (true) {
    while (true) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      enlarge_socket_buffers(fd);
      pending.push_back(std::make_unique<Connection>(fd, -1));
    }
    std::vector<Connection*> watched;
    for (auto& connection : pending)
      if (connection) watched.push_back(connection.get());
    Deadline slice = Deadline::after_seconds(0.01);
    if (deadline.at() < slice.at()) slice = deadline;
    Status pumped = bootstrap::pump(watched, slice, check_hellos);
    if (!failure.is_ok()) break;
    if (pumped.is_ok()) break;  // everyone joined
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int r = 1; r < size_; ++r)
        if (!peers_[r]) missing.push_back(r);
      failure = error(Code::Timeout, "rank" + std::string(missing.size() > 1 ? "s " : " ") +
                                         bootstrap::rank_list(missing) + " did not join within the connect timeout");
      break;
    }
    if (pumped.code() == Code::RemoteDisconnect || watched.empty()) {
      // No connection to watch yet: wait for the next accept without spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (!failure.is_ok()) {
    failure = failure.with_context("local bootstrap (rank 0 of " + std::to_string(size_) + ", " + path + ")");
    // Tell everyone connected, joined or not, why the group will not form.
    for (auto& connection : pending) {
      if (!connection || !connection->alive()) continue;
      int slot = 1;
      while (slot < size_ && peers_[slot]) ++slot;
      if (slot == size_) break;
      connection->set_peer(slot);
      peers_[slot] = std::move(connection);
    }
    abort_members(0, failure, -1);
    return failure;
  }
  auto welcome = std::make_shared<const std::string>(bootstrap::encode_message(MessageKind::Welcome, 0, 0, ""));
  std::vector<Connection*> members;
  for (int r = 1; r < size_; ++r) {
    peers_[r]->send(welcome);
    members.push_back(peers_[r].get());
  }
  Status flushed = bootstrap::pump(members, deadline, [&] {
    return std::none_of(members.begin(), members.end(), [](Connection* c) { return !c->alive() || c->has_output(); });
  });
  if (!flushed.is_ok()) return flushed.with_context("local bootstrap: sending welcome");
  return Status::ok();
}

Status LocalGroup::join_as_member(const std::string& dir, Deadline deadline) {
  const std::string path = hub_socket_path(dir);
  const std::string self = "rank " + std::to_string(rank_);
  sockaddr_un address;
  EPLB_TRY(socket_address(path, &address));
  int last_error = 0;
  int fd = -1;
  while (true) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return error(Code::IoError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) break;
    last_error = errno;
    ::close(fd);
    fd = -1;
    if (deadline.expired())
      return error(Code::Timeout, "local bootstrap: " + self + " could not connect to rank 0 at " + path +
                                      " within the connect timeout (last error: " + std::strerror(last_error) +
                                      "); is rank 0 running?");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  enlarge_socket_buffers(fd);
  peers_[0] = std::make_unique<Connection>(fd, 0);
  Connection* hub = peers_[0].get();
  hub->send(std::make_shared<const std::string>(bootstrap::encode_message(
      MessageKind::Hello, 0, rank_, bootstrap::encode_hello({size_, static_cast<int32_t>(::getpid())}))));
  std::optional<Message> reply;
  Status pumped = await_hub_message(hub, deadline, &reply);
  if (reply) {
    if (reply->header.kind == MessageKind::Welcome && reply->header.sequence == 0 && reply->header.sender == 0)
      return Status::ok();
    if (reply->header.kind == MessageKind::Abort) {
      auto reported = bootstrap::decode_abort(reply->payload);
      if (!reported.is_ok()) return reported.status().with_context("local bootstrap: abort notice from rank 0");
      return Status(reported->code, reported->message + " (reported by rank 0 to " + self + ")");
    }
    return error(Code::Mismatch, "local bootstrap: rank 0 answered hello with " +
                                     collective_name(reply->header.kind, reply->header.sequence));
  }
  if (!hub->alive())
    return error(Code::RemoteDisconnect, "local bootstrap: rank 0 lost while the group was forming (" +
                                             hub->lost().message() + ")");
  if (pumped.code() == Code::Timeout)
    return error(Code::Timeout, "local bootstrap: " + self +
                                    " connected to rank 0, but not every rank joined within the connect timeout");
  return pumped.with_context("local bootstrap");
}

}  // namespace

Result<std::unique_ptr<ProcessGroup>> make_local_group(const LocalGroupOptions& options) {
  if (options.size < 1 || options.size > 65536)
    return error(Code::InvalidArgument, "local group size " + std::to_string(options.size) + " is not in [1, 65536]");
  if (options.rank < 0 || options.rank >= options.size)
    return error(Code::InvalidArgument, "local group rank " + std::to_string(options.rank) + " is not in [0, " +
                                            std::to_string(options.size) + ")");
  if (!(options.connect_timeout_seconds > 0))
    return error(Code::InvalidArgument, "local group connect timeout must be positive");
  auto group = std::make_unique<LocalGroup>(options.rank, options.size);
  if (options.size == 1) return std::unique_ptr<ProcessGroup>(std::move(group));
  if (options.rendezvous_dir.empty())
    return error(Code::InvalidArgument, "local group of " + std::to_string(options.size) +
                                            " ranks needs a rendezvous directory");
  Deadline deadline = Deadline::after_seconds(options.connect_timeout_seconds);
  Status joined = options.rank == 0 ? group->join_as_hub(options.rendezvous_dir, deadline)
                                    : group->join_as_member(options.rendezvous_dir, deadline);
  if (!joined.is_ok()) return joined;
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

}  // namespace eplb
