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

namespace {

constexpr std::string_view kFenceMagic = "EPLBFENC";
constexpr uint32_t kFenceVersion = 1;

// A fence ballot says which fence it is (layer, attempt, round): a rank in
// another fence, or in a vote (another collective kind), is named as such.
std::string encode_fence(const FenceId& id, const Status& mine) {
  bytes::Writer writer;
  writer.raw(kFenceMagic);
  writer.u32(kFenceVersion);
  writer.i32(id.layer);
  writer.i32(id.attempt);
  writer.u32(id.round);
  writer.u32(mine.is_ok() ? 1 : 0);
  writer.blob(mine.is_ok() ? std::string() : mine.to_string());
  return writer.take();
}

// Ok, or the first failure among the ballots (Aborted naming its rank), or
// Mismatch for a malformed ballot or one of another fence.
Status tally_fence(const std::vector<std::string>& ballots, const FenceId& id) {
  const std::string which = fmt::format("round {} of layer {}'s transfer schedule (attempt {})", id.round + 1,
                                        id.layer, id.attempt + 1);
  Status first_failure = Status::ok();
  for (size_t r = 0; r < ballots.size(); ++r) {
    bytes::Reader reader(ballots[r]);
    const bool header = reader.expect(kFenceMagic) && reader.u32() == kFenceVersion;
    const int32_t layer = reader.i32(), attempt = reader.i32();
    const uint32_t round = reader.u32(), landed = reader.u32();
    const std::string reason(reader.blob(kMaxReason));
    if (!header || !reader.at_end() || landed > 1)
      return error(Code::Mismatch, fmt::format("rank {} sent a malformed fence ballot ({} bytes) at the fence after {}",
                                               r, ballots[r].size(), which))
          .with_peer(int(r));
    if (layer != id.layer || attempt != id.attempt || round != id.round)
      return error(Code::Mismatch, fmt::format("rank {} is at the fence after round {} of layer {} (attempt {}), this "
                                               "rank after {}: the ranks' schedules differ",
                                               r, round + 1, layer, attempt + 1, which))
          .with_peer(int(r));
    if (!landed && first_failure.is_ok())
      first_failure = error(Code::Aborted, fmt::format("rank {} failed {}: {}", r, which, reason)).with_peer(int(r));
  }
  return first_failure;
}

}  // namespace

Status fence_round(ProcessGroup& group, const Status& mine, const FenceId& id, Deadline deadline) {
  auto ballots = group.allgather(encode_fence(id, mine), deadline);
  const Status outcome = ballots ? tally_fence(*ballots, id) : ballots.status();
  if (!mine.is_ok()) {  // this rank's own failure first; a failure of the fence itself added to it
    if (ballots && outcome.code() != Code::Mismatch) return mine;
    return error(mine.code(), fmt::format("{} (then the fence after round {} failed: {})", mine.message(),
                                          id.round + 1, outcome.to_string()))
        .with_peer(mine.peer());
  }
  if (!ballots)
    return outcome.with_context(fmt::format("the fence after round {} of layer {}", id.round + 1, id.layer));
  return outcome;
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
