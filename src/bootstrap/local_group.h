// local_group.h (internal) - the `local` process group: ranks on one machine
// joined in a star over Unix-domain sockets in a private rendezvous
// directory. Rank 0 is the hub: it listens on <dir>/hub.sock, every other
// rank connects (retrying until the connect timeout) and says hello; the hub
// answers welcome once all joined (local_join.cpp). A collective: every rank
// sends its frame to the hub; the hub checks kind and sequence number of
// each, then sends the combined result to every rank (local_group.cpp).
// When the hub fails a collective (a rank lost, silent, late or diverging) it
// sends an abort notice naming the culprit to every other rank, so all ranks
// report the same cause. The hub stops waiting a little before the caller's
// deadline (kHubMarginSeconds) so its notice arrives before the others give up.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connection.h"
#include "eplb/bootstrap.h"
#include "message.h"

namespace eplb::bootstrap {

inline constexpr double kHubMarginSeconds = 0.2;  // at most; 10% of the remaining time when shorter

// A run secret of 64 hex digits as its 32 raw bytes ("" stays "").
Result<std::string> secret_bytes(const std::string& hex);
// "allgather #3"
std::string collective_name(MessageKind kind, uint64_t sequence);
// Pumps the hub connection until its first message arrives (moved into
// *message), the hub is gone or the deadline passes.
Status await_hub_message(Connection* hub, Deadline deadline, std::optional<Message>* message);
// The status an abort notice from rank 0 carries, as seen by rank `self`.
Status abort_notice_status(const Message& notice, const std::string& what, int self);

class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup(int rank, int size) : rank_(rank), size_(size), peers_(static_cast<size_t>(size)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "local"; }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override;

  // Who may join (see LocalGroupOptions); `secret` in raw bytes.
  struct Admission {
    std::string secret;
    int launcher_pid = 0;
    std::function<void(const std::string&)> on_dropped;
  };
  void set_admission(Admission admission) { admission_ = std::move(admission); }

  Status join_as_hub(const std::string& socket_path, Deadline deadline);
  Status join_as_member(const std::string& socket_path, Deadline deadline);

 private:
  // One collective as the hub sees it.
  struct HubRound {
    MessageKind kind;
    uint64_t sequence;
    std::vector<std::optional<std::string>> got;  // contributions by rank
    Status failure;
  };
  Result<std::vector<std::string>> hub_exchange(MessageKind kind, uint64_t sequence, std::string mine,
                                                Deadline deadline);
  Status hub_gather(HubRound& round, Deadline deadline);
  Status hub_take_messages(HubRound& round, int from);
  Status hub_reply(const HubRound& round, const std::string& payload, Deadline deadline);
  Result<std::vector<std::string>> member_exchange(MessageKind kind, uint64_t sequence, std::string mine,
                                                   Deadline deadline);
  Result<std::vector<std::string>> member_result(const Message& reply, MessageKind kind, uint64_t sequence,
                                                 const std::string& mine);
  // Hub only: tells every other live rank that `sequence` failed, and why.
  void abort_members(uint64_t sequence, const Status& why);
  std::vector<Connection*> live_members();
  Status check_member_message(const Message& message, int from, MessageKind kind, uint64_t sequence);
  // Hub, while joining.
  Status accept_hellos(int listener, Deadline deadline, std::vector<std::unique_ptr<Connection>>& pending);
  Status take_hello(std::unique_ptr<Connection>& connection, int& joined);
  // Hub: whether the process behind a new connection may join; else says why.
  bool admit_peer(int fd);
  void drop(std::unique_ptr<Connection>& connection, const std::string& why);
  void adopt_pending_for_abort(std::vector<std::unique_ptr<Connection>>& pending);
  Status send_welcome(Deadline deadline);

  int rank_;
  int size_;
  uint64_t sequence_ = 0;
  // Hub: peers_[r] is the connection to rank r (r >= 1). Member: peers_[0] is the hub.
  std::vector<std::unique_ptr<Connection>> peers_;
  Admission admission_;
  // Hub, while joining: connections dropped during a pump, destroyed after it.
  std::vector<std::unique_ptr<Connection>> dropped_;
};

}  // namespace eplb::bootstrap
