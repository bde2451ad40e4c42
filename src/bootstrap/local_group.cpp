// The local group's collectives: the hub gathers every rank's frame, checks
// it and answers with the combined result or an abort notice naming the
// culprit (see local_group.h).
#include "local_group.h"

#include <fmt/format.h>

#include <algorithm>

namespace eplb::bootstrap {

std::string collective_name(MessageKind kind, uint64_t sequence) {
  return fmt::format("{} #{}", kind_name(kind), sequence);
}

Status await_hub_message(Connection* hub, Deadline deadline, std::optional<Message>* message) {
  Connection* hubs[] = {hub};
  return pump(hubs, deadline, [&] {
    if (!hub->inbox().empty()) {
      *message = std::move(hub->inbox().front());
      hub->inbox().pop_front();
      return true;
    }
    return !hub->alive();
  });
}

Status abort_notice_status(const Message& notice, const std::string& what, int self) {
  auto reported = decode_abort(notice.payload);
  if (!reported.is_ok()) return reported.status().with_context(what + ": abort notice from rank 0");
  return Status(reported->code, fmt::format("{} (reported by rank 0 to rank {})", reported->message, self))
      .with_peer(reported->peer);
}

namespace {

MessageKind result_kind_of(MessageKind kind) {
  switch (kind) {
    case MessageKind::Allgather: return MessageKind::AllgatherResult;
    case MessageKind::Barrier: return MessageKind::BarrierRelease;
    case MessageKind::Vote: return MessageKind::VoteResult;
    default: return MessageKind::Abort;
  }
}

std::string ranks_phrase(const std::vector<int>& ranks, const char* one, const char* many) {
  return fmt::format("rank{} {} {}", ranks.size() > 1 ? "s" : "", rank_list(ranks), ranks.size() > 1 ? many : one);
}

}  // namespace

Result<std::vector<std::string>> LocalGroup::exchange(Collective kind, std::string mine, Deadline deadline) {
  const MessageKind message = message_kind(kind);
  const uint64_t sequence = ++sequence_;
  if (size_ == 1) return std::vector<std::string>{std::move(mine)};
  uint64_t result_bytes = 4 + static_cast<uint64_t>(size_) * (8 + mine.size());
  if (mine.size() > kMaxPayloadBytes || result_bytes > kMaxPayloadBytes)
    return error(Code::InvalidArgument,
                 fmt::format("{}: {} bytes per rank x {} ranks exceeds the bootstrap message limit of {}",
                             collective_name(message, sequence), mine.size(), size_, format_bytes(kMaxPayloadBytes)));
  if (rank_ == 0) return hub_exchange(message, sequence, std::move(mine), deadline);
  return member_exchange(message, sequence, std::move(mine), deadline);
}

std::vector<Connection*> LocalGroup::live_members() {
  std::vector<Connection*> out;
  for (int r = 1; r < size_; ++r)
    if (peers_[r] && peers_[r]->alive()) out.push_back(peers_[r].get());
  return out;
}

void LocalGroup::abort_members(uint64_t sequence, const Status& why) {
  auto notice = std::make_shared<const std::string>(encode_message(MessageKind::Abort, sequence, rank_,
                                                                   encode_abort(why)));
  std::vector<Connection*> targets = live_members();
  for (Connection* member : targets) member->send(notice);
  // Best effort, briefly: the notice is small and the members are waiting for the hub.
  (void)pump(targets, Deadline::after_seconds(0.5), [&] {
    return std::none_of(targets.begin(), targets.end(), [](Connection* c) { return c->alive() && c->has_output(); });
  });
}

Status LocalGroup::check_member_message(const Message& message, int from, MessageKind kind, uint64_t sequence) {
  const auto& header = message.header;
  if (header.sender != from)
    return error(Code::Mismatch, fmt::format("the connection of rank {} carried a message claiming to be from rank {}",
                                             from, header.sender));
  if (header.kind == kind && header.sequence == sequence) return Status::ok();
  std::string detail = fmt::format("rank {} sent {} while rank {} is in {}", from,
                                   collective_name(header.kind, header.sequence), rank_,
                                   collective_name(kind, sequence));
  if (header.sequence < sequence)
    detail += fmt::format(": rank {} is late (an earlier collective failed or was skipped there)", from);
  else if (header.sequence > sequence)
    detail += fmt::format(": rank {} is ahead (a collective was skipped or failed on rank {})", from, rank_);
  else
    detail += ": collectives must be called in the same order on every rank";
  return error(Code::Mismatch, detail);
}

// Moves rank `from`'s queued frames into the round; a failure names the rank.
Status LocalGroup::hub_take_messages(HubRound& round, int from) {
  Connection* member = peers_[from].get();
  while (!round.got[from] && !member->inbox().empty()) {
    Message message = std::move(member->inbox().front());
    member->inbox().pop_front();
    EPLB_TRY(check_member_message(message, from, round.kind, round.sequence));
    round.got[from] = std::move(message.payload);
  }
  if (!round.got[from] && !member->alive())
    return error(member->lost().code(), fmt::format("rank {} lost: {}", from, member->lost().message())).with_peer(from);
  return Status::ok();
}

Status LocalGroup::hub_gather(HubRound& round, Deadline deadline) {
  Stopwatch elapsed;
  double margin = std::min(kHubMarginSeconds, 0.1 * deadline.remaining_seconds());
  Deadline gather_deadline(deadline.at() - std::chrono::nanoseconds(static_cast<int64_t>(margin * 1e9)));
  std::vector<Connection*> members;
  for (int r = 1; r < size_; ++r) members.push_back(peers_[r].get());
  Status failure;
  Status pumped = pump(members, gather_deadline, [&] {
    for (int r = 1; r < size_ && failure.is_ok(); ++r) failure = hub_take_messages(round, r);
    return !failure.is_ok() || std::all_of(round.got.begin(), round.got.end(), [](auto& got) { return got; });
  });
  if (!failure.is_ok() || pumped.is_ok()) return failure;
  if (pumped.code() != Code::Timeout) return pumped;
  std::vector<int> missing, present;
  for (int r = 0; r < size_; ++r) (round.got[r] ? present : missing).push_back(r);
  return error(Code::Timeout, fmt::format("{} not answered within {} (answered: ranks {})",
                                          ranks_phrase(missing, "has", "have"), format_seconds(elapsed.seconds()),
                                          rank_list(present)))
      .with_peer(missing.empty() ? -1 : missing.front());
}

Status LocalGroup::hub_reply(const HubRound& round, const std::string& payload, Deadline deadline) {
  Stopwatch elapsed;
  auto reply = std::make_shared<const std::string>(
      encode_message(result_kind_of(round.kind), round.sequence, rank_, payload));
  std::vector<Connection*> members;
  for (int r = 1; r < size_; ++r) members.push_back(peers_[r].get());
  for (Connection* member : members) member->send(reply);
  Status failure;
  Status pumped = pump(members, deadline, [&] {
    for (Connection* member : members)
      if (!member->alive()) {
        failure = error(Code::RemoteDisconnect, fmt::format("rank {} lost while receiving the result: {}",
                                                            member->peer(), member->lost().message()))
                      .with_peer(member->peer());
        return true;
      }
    return std::none_of(members.begin(), members.end(), [](Connection* c) { return c->has_output(); });
  });
  if (!failure.is_ok() || pumped.is_ok()) return failure;
  std::vector<int> slow;
  for (Connection* member : members)
    if (member->has_output()) slow.push_back(member->peer());
  return error(Code::Timeout, fmt::format("ranks {} did not take the result within {}", rank_list(slow),
                                          format_seconds(elapsed.seconds())));
}

Result<std::vector<std::string>> LocalGroup::hub_exchange(MessageKind kind, uint64_t sequence, std::string mine,
                                                          Deadline deadline) {
  HubRound round{kind, sequence, std::vector<std::optional<std::string>>(static_cast<size_t>(size_)), {}};
  round.got[0] = std::move(mine);
  Status failure = hub_gather(round, deadline);
  std::vector<std::string> contributions(static_cast<size_t>(size_));
  if (failure.is_ok()) {
    for (int r = 0; r < size_; ++r) contributions[r] = std::move(*round.got[r]);
    std::string payload = kind == MessageKind::Barrier ? std::string() : encode_string_list(contributions);
    failure = hub_reply(round, payload, deadline);
  }
  if (!failure.is_ok()) {
    failure = failure.with_context(collective_name(kind, sequence));
    abort_members(sequence, failure);
    return failure;
  }
  return contributions;
}

Result<std::vector<std::string>> LocalGroup::member_result(const Message& reply, MessageKind kind, uint64_t sequence,
                                                           const std::string& mine) {
  const std::string what = collective_name(kind, sequence);
  const auto& header = reply.header;
  if (header.sender != 0)
    return error(Code::Mismatch, fmt::format("{}: the hub's connection carried a message claiming to be from rank {}",
                                             what, header.sender));
  if (header.kind == MessageKind::Abort && header.sequence == sequence) return abort_notice_status(reply, what, rank_);
  if (header.kind != result_kind_of(kind) || header.sequence != sequence)
    return error(Code::Mismatch,
                 fmt::format("{}: rank 0 answered with {} while rank {} is in {}{}", what,
                             collective_name(header.kind, header.sequence), rank_, what,
                             header.sequence < sequence
                                 ? fmt::format(" (the answer is stale: rank {} gave up on an earlier collective)", rank_)
                                 : ""));
  if (kind == MessageKind::Barrier) {
    if (!reply.payload.empty())
      return error(Code::ParseError, fmt::format("{}: barrier release from rank 0 carries {} unexpected bytes", what,
                                                 reply.payload.size()));
    return std::vector<std::string>(static_cast<size_t>(size_));
  }
  auto items = decode_string_list(reply.payload, size_);
  if (!items.is_ok()) return items.status().with_context(what + ": result from rank 0");
  if ((*items)[static_cast<size_t>(rank_)] != mine)
    return error(Code::Mismatch, fmt::format("{}: the result from rank 0 does not hold rank {}'s contribution", what,
                                             rank_));
  return items;
}

Result<std::vector<std::string>> LocalGroup::member_exchange(MessageKind kind, uint64_t sequence, std::string mine,
                                                             Deadline deadline) {
  const std::string what = collective_name(kind, sequence);
  Stopwatch elapsed;
  Connection* hub = peers_[0].get();
  if (hub->alive()) hub->send(std::make_shared<const std::string>(encode_message(kind, sequence, rank_, mine)));
  std::optional<Message> reply;
  Status pumped = await_hub_message(hub, deadline, &reply);
  if (reply) return member_result(*reply, kind, sequence, mine);
  if (!hub->alive())
    return error(Code::RemoteDisconnect,
                 fmt::format("{}: rank 0 lost ({}); rank 0 is the hub of the local group", what, hub->lost().message()))
        .with_peer(0);
  if (pumped.code() == Code::Timeout)
    return error(Code::Timeout,
                 fmt::format("{}: no answer from rank 0 (the hub) within {}{}", what, format_seconds(elapsed.seconds()),
                             hub->has_output()
                                 ? fmt::format("; rank 0 did not even take rank {}'s contribution", rank_)
                                 : std::string("; rank 0 answers once every rank has contributed, so another rank "
                                               "(or rank 0) is stuck or slow")));
  return pumped.with_context(what);
}

}  // namespace eplb::bootstrap
