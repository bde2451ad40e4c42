// Forming the local group: the hub accepts every rank's hello on
// <dir>/hub.sock and answers welcome; a member connects (retrying until the
// connect timeout) and waits for the welcome (see local_group.h).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/text.h"
#include "local_group.h"
#include "run_dirs.h"

namespace eplb {
namespace bootstrap {
namespace {

// The main group's hub is <dir>/hub.sock; another group of the same ranks
// (a channel) has <dir>/<channel>.sock.
std::string hub_socket_path(const std::string& dir, const std::string& channel) {
  return dir + "/" + (channel.empty() ? std::string("hub") : channel) + ".sock";
}

Status socket_address(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  if (path.size() + 1 > sizeof address->sun_path)
    return error(Code::InvalidArgument,
                 fmt::format("rendezvous socket path '{}' is {} bytes; Unix sockets allow at most {} (use a shorter "
                             "rendezvous directory)",
                             path, path.size(), sizeof address->sun_path - 1));
  std::memcpy(address->sun_path, path.c_str(), path.size() + 1);
  return Status::ok();
}

// Larger socket buffers: fewer poll() round trips for megabyte contributions
// (the kernel caps this at net.core.wmem_max; failure is harmless).
void enlarge_socket_buffers(int fd) {
  int bytes = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// The listening socket of the hub; closes and unlinks it when done.
struct Listener {
  int fd = -1;
  std::string path;
  ~Listener() {
    if (fd >= 0) ::close(fd);
    if (!path.empty()) ::unlink(path.c_str());
  }
};

Status listen_on(const std::string& path, int backlog, Listener& listener) {
  sockaddr_un address;
  EPLB_TRY(socket_address(path, &address));
  listener.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener.fd < 0) return error(Code::IoError, fmt::format("socket(AF_UNIX): {}", std::strerror(errno)));
  listener.path = path;
  ::unlink(path.c_str());
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    return error(Code::IoError, fmt::format("cannot bind the rendezvous socket {}: {}", path, std::strerror(errno)));
  if (::listen(listener.fd, backlog) != 0)
    return error(Code::IoError, fmt::format("cannot listen on {}: {}", path, std::strerror(errno)));
  return Status::ok();
}

// Equal secrets, compared in time independent of where they differ.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

// The parent of `pid`, or -1.
int parent_of(pid_t pid) {
  std::vector<std::string> fields = process_stat_fields(pid);
  if (fields.size() < 2) return -1;
  auto parent = text::parse_int(fields[1], "ppid");
  return parent ? int(*parent) : -1;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

Result<std::string> secret_bytes(const std::string& hex) {
  if (hex.empty()) return std::string();
  if (hex.size() != 2 * kRunSecretBytes)
    return error(Code::InvalidArgument, fmt::format("run secret has {} hex digits, expected {}", hex.size(),
                                                    2 * kRunSecretBytes));
  std::string raw;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int high = hex_digit(hex[i]), low = hex_digit(hex[i + 1]);
    if (high < 0 || low < 0) return error(Code::InvalidArgument, "run secret is not lowercase hex digits");
    raw.push_back(static_cast<char>(high * 16 + low));
  }
  return raw;
}

// pump() may still hold the connection: it is shut down now (the joiner sees
// EOF, pump stops polling it) and destroyed after the pump returns.
void LocalGroup::drop(std::unique_ptr<Connection>& connection, const std::string& why) {
  if (admission_.on_dropped) admission_.on_dropped("local bootstrap: dropped " + why + "; the group keeps forming");
  ::shutdown(connection->fd(), SHUT_RDWR);
  dropped_.push_back(std::move(connection));
}

// SO_PEERCRED: the same user, and a child of our launcher when we have one.
bool LocalGroup::admit_peer(int fd) {
  ucred peer{};
  socklen_t length = sizeof peer;
  std::string why;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    why = fmt::format("a connection whose credentials are unknown ({})", std::strerror(errno));
  } else if (peer.uid != ::geteuid()) {
    why = fmt::format("a connection from pid {} of uid {} (this run is uid {})", peer.pid, peer.uid, ::geteuid());
  } else if (admission_.launcher_pid > 0 && admission_.launcher_pid == ::getppid() &&
             parent_of(peer.pid) != admission_.launcher_pid) {
    why = fmt::format("a connection from pid {}, which the launcher (pid {}) did not start", peer.pid,
                      admission_.launcher_pid);
  }
  if (why.empty()) return true;
  if (admission_.on_dropped) admission_.on_dropped("local bootstrap: dropped " + why + "; the group keeps forming");
  return false;
}

// One pending connection's hello: registers it as rank `from`, drops a
// forged or malformed one, or says why the group cannot form.
Status LocalGroup::take_hello(std::unique_ptr<Connection>& connection, int& joined) {
  Message message = std::move(connection->inbox().front());
  connection->inbox().pop_front();
  const auto& header = message.header;
  if (header.kind != MessageKind::Hello || header.sequence != 0) {
    drop(connection, "a process that sent " + collective_name(header.kind, header.sequence) + " instead of hello");
    return Status::ok();
  }
  auto hello = decode_hello(message.payload);
  if (!hello.is_ok()) {
    drop(connection, fmt::format("a malformed hello claiming rank {}: {}", header.sender, hello.status().message()));
    return Status::ok();
  }
  const int from = header.sender;
  if (!admission_.secret.empty() && !same_secret(hello->secret, admission_.secret)) {
    drop(connection, fmt::format("a hello claiming rank {} from pid {} without the run's secret", from, hello->pid));
    return Status::ok();
  }
  if (hello->size != size_)
    return error(Code::Mismatch, fmt::format("rank {} (pid {}) was started for a group of {} ranks, rank 0 for {}",
                                             from, hello->pid, hello->size, size_));
  if (from <= 0 || from >= size_)
    return error(Code::Mismatch, fmt::format("a process (pid {}) claims rank {} in a group of {}", hello->pid, from,
                                             size_));
  if (peers_[from])
    return error(Code::Mismatch,
                 fmt::format("two processes claim rank {} (the second is pid {})", from, hello->pid));
  connection->set_peer(from);
  peers_[from] = std::move(connection);
  ++joined;
  return Status::ok();
}

// Accepts connections and their hellos until every rank joined or the deadline.
Status LocalGroup::accept_hellos(int listener, Deadline deadline,
                                 std::vector<std::unique_ptr<Connection>>& pending) {
  int joined = 0;
  Status failure;
  auto check_hellos = [&] {
    for (auto& connection : pending) {
      if (!connection) continue;
      if (!connection->inbox().empty()) failure = take_hello(connection, joined);
      else if (!connection->alive()) dropped_.push_back(std::move(connection));  // went away before saying who it is
      if (!failure.is_ok()) return true;
    }
    for (int r = 1; r < size_; ++r)
      if (peers_[r] && !peers_[r]->alive()) {
        failure = error(Code::RemoteDisconnect, fmt::format("rank {} lost while the group was forming: {}", r,
                                                            peers_[r]->lost().message()))
                      .with_peer(r);
        return true;
      }
    return joined == size_ - 1;
  };
  while (true) {
    for (int fd; (fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
      if (!admit_peer(fd)) {
        ::close(fd);
        continue;
      }
      enlarge_socket_buffers(fd);
      pending.push_back(std::make_unique<Connection>(fd, -1));
    }
    std::vector<Connection*> watched;
    for (auto& connection : pending)
      if (connection) watched.push_back(connection.get());
    Deadline slice = std::min(Deadline::after_seconds(0.01), deadline, [](auto& a, auto& b) { return a.at() < b.at(); });
    Status pumped = pump(watched, slice, check_hellos);
    dropped_.clear();  // no pump holds them any more
    if (!failure.is_ok() || pumped.is_ok()) return failure;
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int r = 1; r < size_; ++r)
        if (!peers_[r]) missing.push_back(r);
      return error(Code::Timeout, fmt::format("rank{} {} did not join within the connect timeout",
                                              missing.size() > 1 ? "s" : "", rank_list(missing)));
    }
    // No connection to watch yet: wait for the next accept without spinning.
    if (pumped.code() == Code::RemoteDisconnect || watched.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// So that an abort notice reaches them: connected processes that never said
// hello take the free rank slots.
void LocalGroup::adopt_pending_for_abort(std::vector<std::unique_ptr<Connection>>& pending) {
  for (auto& connection : pending) {
    if (!connection || !connection->alive()) continue;
    int slot = 1;
    while (slot < size_ && peers_[slot]) ++slot;
    if (slot == size_) return;
    connection->set_peer(slot);
    peers_[slot] = std::move(connection);
  }
}

Status LocalGroup::send_welcome(Deadline deadline) {
  auto welcome = std::make_shared<const std::string>(encode_message(MessageKind::Welcome, 0, 0, ""));
  std::vector<Connection*> members;
  for (int r = 1; r < size_; ++r) {
    peers_[r]->send(welcome);
    members.push_back(peers_[r].get());
  }
  Status flushed = pump(members, deadline, [&] {
    return std::none_of(members.begin(), members.end(), [](Connection* c) { return !c->alive() || c->has_output(); });
  });
  return flushed.with_context("local bootstrap: sending welcome");
}

Status LocalGroup::join_as_hub(const std::string& path, Deadline deadline) {
  Listener listener;
  EPLB_TRY(listen_on(path, std::min(size_, 4096), listener));
  std::vector<std::unique_ptr<Connection>> pending;
  Status failure = accept_hellos(listener.fd, deadline, pending);
  if (failure.is_ok()) return send_welcome(deadline);
  failure = failure.with_context(fmt::format("local bootstrap (rank 0 of {}, {})", size_, path));
  // Tell everyone connected, joined or not, why the group will not form.
  adopt_pending_for_abort(pending);
  abort_members(0, failure);
  return failure;
}

Status LocalGroup::join_as_member(const std::string& path, Deadline deadline) {
  sockaddr_un address;
  EPLB_TRY(socket_address(path, &address));
  int fd = -1;
  for (int last_error = 0;; std::this_thread::sleep_for(std::chrono::milliseconds(10))) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return error(Code::IoError, fmt::format("socket(AF_UNIX): {}", std::strerror(errno)));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) break;
    last_error = errno;
    ::close(fd);
    if (deadline.expired())
      return error(Code::Timeout, fmt::format("local bootstrap: rank {} could not connect to rank 0 at {} within the "
                                              "connect timeout (last error: {}); is rank 0 running?",
                                              rank_, path, std::strerror(last_error)));
  }
  enlarge_socket_buffers(fd);
  peers_[0] = std::make_unique<Connection>(fd, 0);
  Connection* hub = peers_[0].get();
  hub->send(std::make_shared<const std::string>(encode_message(
      MessageKind::Hello, 0, rank_, encode_hello({size_, static_cast<int32_t>(::getpid()), admission_.secret}))));
  std::optional<Message> reply;
  Status pumped = await_hub_message(hub, deadline, &reply);
  if (reply) {
    const auto& header = reply->header;
    if (header.kind == MessageKind::Welcome && header.sequence == 0 && header.sender == 0) return Status::ok();
    if (header.kind == MessageKind::Abort) return abort_notice_status(*reply, "local bootstrap", rank_);
    return error(Code::Mismatch, "local bootstrap: rank 0 answered hello with " +
                                     collective_name(header.kind, header.sequence));
  }
  if (!hub->alive())
    return error(Code::RemoteDisconnect,
                 fmt::format("local bootstrap: rank 0 lost while the group was forming ({})", hub->lost().message()));
  if (pumped.code() == Code::Timeout)
    return error(Code::Timeout, fmt::format("local bootstrap: rank {} connected to rank 0, but not every rank joined "
                                            "within the connect timeout",
                                            rank_));
  return pumped.with_context("local bootstrap");
}

}  // namespace bootstrap

Result<std::string> run_secret_bytes(const std::string& hex) { return bootstrap::secret_bytes(hex); }

Result<std::unique_ptr<ProcessGroup>> make_local_group(const LocalGroupOptions& options, const std::string& channel) {
  if (options.size < 1 || options.size > 65536)
    return error(Code::InvalidArgument, fmt::format("local group size {} is not in [1, 65536]", options.size));
  if (options.rank < 0 || options.rank >= options.size)
    return error(Code::InvalidArgument,
                 fmt::format("local group rank {} is not in [0, {})", options.rank, options.size));
  if (!(options.connect_timeout_seconds > 0))
    return error(Code::InvalidArgument, "local group connect timeout must be positive");
  auto group = std::make_unique<bootstrap::LocalGroup>(options.rank, options.size);
  EPLB_ASSIGN_OR_RETURN(std::string secret, bootstrap::secret_bytes(options.secret));
  group->set_admission({std::move(secret), options.launcher_pid, options.on_dropped});
  if (options.size == 1) return std::unique_ptr<ProcessGroup>(std::move(group));
  if (options.rendezvous_dir.empty())
    return error(Code::InvalidArgument,
                 fmt::format("local group of {} ranks needs a rendezvous directory", options.size));
  const bool channel_ok = channel.size() <= 32 && std::all_of(channel.begin(), channel.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!channel_ok || channel == "hub")
    return error(Code::InvalidArgument, fmt::format("local group channel '{}' is not [a-z0-9-]{{0,32}} (nor 'hub')",
                                                    channel));
  Deadline deadline = Deadline::after_seconds(options.connect_timeout_seconds);
  const std::string path = bootstrap::hub_socket_path(options.rendezvous_dir, channel);
  EPLB_TRY(options.rank == 0 ? group->join_as_hub(path, deadline) : group->join_as_member(path, deadline));
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

}  // namespace eplb
