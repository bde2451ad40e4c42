// vote.cpp - the protocol's one vote (sync and async rounds): every rank's
// yes/no, whether it stops the round, and its reason, in one collective;
// the fence between a fenced transfer schedule's rounds; and the stop
// request a rank carries into the vote (an abort, a failed per-layer
// callback).
#include <fmt/format.h>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb::migrate {
namespace {

constexpr std::string_view kVoteMagic = "EPLBVOTE";
constexpr uint32_t kVoteVersion = 3;
constexpr uint64_t kMaxReason = 1 << 20;

std::string encode_ballot(bool yes, bool stop, const std::string& reason) {
  bytes::Writer writer;
  writer.raw(kVoteMagic);
  writer.u32(kVoteVersion);
  writer.u32(yes ? 1 : 0);
  writer.u32(stop ? 1 : 0);
  writer.blob(reason);
  return writer.take();
}

}  // namespace

Result<Ballots> exchange_votes(ProcessGroup& group, bool yes, bool stop, const std::string& reason, Deadline deadline) {
  EPLB_ASSIGN_OR_RETURN(auto gathered, group.exchange(Collective::Vote, encode_ballot(yes, stop, reason), deadline));
  if (gathered.size() != size_t(group.size()))
    return error(Code::Internal, fmt::format("vote: {} ballots for {} ranks", gathered.size(), group.size()));
  Ballots ballots;
  ballots.reasons.assign(gathered.size(), "");
  for (size_t r = 0; r < gathered.size(); ++r) {
    bytes::Reader reader(gathered[r]);
    const bool header = reader.expect(kVoteMagic) && reader.u32() == kVoteVersion;
    const uint32_t their_yes = reader.u32(), their_stop = reader.u32();
    ballots.reasons[r] = std::string(reader.blob(kMaxReason));
    if (!header || !reader.at_end() || their_yes > 1 || their_stop > 1)
      return error(Code::Mismatch, fmt::format("rank {} sent a malformed vote ({} bytes)", r, gathered[r].size()));
    ballots.unanimous = ballots.unanimous && their_yes == 1;
    if (their_stop && ballots.stop_rank < 0) ballots.stop_rank = int(r);
  }
  ballots.unanimous = ballots.unanimous && ballots.stop_rank < 0;
  return ballots;
}

Status fence_round(ProcessGroup& group, const Status& mine, int layer, size_t round, Deadline deadline) {
  std::vector<std::string> reasons;
  auto all_landed = group.vote(mine.is_ok(), mine.is_ok() ? std::string() : mine.to_string(), deadline, &reasons);
  if (!all_landed)
    return all_landed.status().with_context(fmt::format("the fence after round {} of layer {}", round + 1, layer));
  if (!mine.is_ok() || *all_landed) return mine;
  for (size_t r = 0; r < reasons.size(); ++r)
    if (!reasons[r].empty())
      return error(Code::Aborted, fmt::format("rank {} failed round {} of layer {}'s transfer schedule: {}", r,
                                              round + 1, layer, reasons[r]))
          .with_peer(int(r));
  return error(Code::Aborted, fmt::format("a rank failed round {} of layer {}'s transfer schedule", round + 1, layer));
}

void StopRequest::request(Status why) {
  std::lock_guard lock(mutex_);
  if (reason_.is_ok()) reason_ = std::move(why);
}

Status StopRequest::reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

void StopRequest::clear() {
  std::lock_guard lock(mutex_);
  reason_ = Status::ok();
}

}  // namespace eplb::migrate
