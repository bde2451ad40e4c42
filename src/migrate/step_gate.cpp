// step_gate.cpp - the meeting point of an AsyncMigration's progress thread
// and the serving thread (StepGate), and the two-phase vote whose second
// phase carries each rank's serving step (stepped_vote).
#include <fmt/format.h>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb::migrate {
namespace {

constexpr std::string_view kStepMagic = "EPLBCOMMITSTEP";

}  // namespace

Result<int64_t> StepGate::vote_cast(double vote_seconds, double serving_wait_seconds) {
  std::unique_lock lock(mutex_);
  // Before the serving thread's first commit_ready on this handle its step
  // is unknown (a caller's steps run on across rounds): casting 0 would let
  // the others agree on a step this rank has long passed.
  const Deadline deadline = Deadline::after_seconds(vote_seconds);
  if (!changed_.wait_until(lock, deadline.at(), [&] { return step_ >= 0 || closed_; }))
    return error(Code::Timeout, fmt::format("the serving thread did not call commit_ready within {:.1f} s, so this "
                                            "rank has no serving step to agree a commit step on",
                                            vote_seconds));
  if (closed_) return error(Code::Aborted, "the async migration was closed before its vote");
  cast_step_ = step_;
  serving_wait_seconds_ = serving_wait_seconds;
  return *cast_step_;
}

Status StepGate::commit_at(int layer, int64_t step, std::function<Status()> commit, Deadline deadline, bool* owed) {
  std::unique_lock lock(mutex_);
  *owed = false;
  pending_ = Pending{layer, step, std::move(commit)};
  cast_step_.reset();
  commit_result_.reset();
  // A closing handle's serving thread waits in close() for this thread.
  if (closed_) return run_now();
  changed_.notify_all();
  changed_.wait_until(lock, deadline.at(), [&] { return commit_result_.has_value(); });
  if (commit_result_) {
    Status result = *commit_result_;
    pending_.reset();
    commit_result_.reset();
    return result;
  }
  pending_->owed = *owed = true;
  return error(Code::Timeout, fmt::format("layer {} was voted to commit at serving step {}, but this rank's serving "
                                          "thread is still at step {} (it must call commit_ready once per step); "
                                          "the commit is owed: it runs at this rank's first commit_ready from step "
                                          "{} on, or at close()",
                                          layer, step, step_, step));
}

Status StepGate::run_now() {
  Status result = pending_->commit();
  if (pending_->owed || closed_) pending_.reset();
  else commit_result_ = result;
  changed_.notify_all();
  return result;
}

void StepGate::finish(Status status) {
  std::lock_guard lock(mutex_);
  if (failure_.is_ok()) failure_ = std::move(status);
  done_ = true;
  cast_step_.reset();
  changed_.notify_all();
}

bool StepGate::abort_requested() const {
  std::lock_guard lock(mutex_);
  return abort_;
}

void StepGate::request_abort() {
  std::lock_guard lock(mutex_);
  abort_ = true;
}

void StepGate::close() {
  std::lock_guard lock(mutex_);
  if (pending_ && !commit_result_) {
    Status result = run_now();
    if (!result.is_ok() && failure_.is_ok()) failure_ = result;
  }
  closed_ = abort_ = true;
  changed_.notify_all();
}

Status StepGate::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

bool StepGate::ready() const {
  std::lock_guard lock(mutex_);
  return pending_.has_value() && !commit_result_.has_value();
}

bool StepGate::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

// A rank at step cast + lead must know the result before it serves: the
// commit step may be this one.
Status StepGate::wait_for_result(std::unique_lock<std::mutex>& lock, int64_t step) {
  if (!cast_step_ || pending_ || step < *cast_step_ + lead_) return Status::ok();
  const Deadline deadline = Deadline::after_seconds(serving_wait_seconds_);
  const bool known = changed_.wait_until(lock, deadline.at(), [&] { return !cast_step_ || pending_ || done_; });
  if (known) return Status::ok();
  failure_ = error(Code::Timeout, fmt::format("serving step {}: the vote cast at step {} has no result after {:.1f} s; "
                                              "this rank cannot know whether to commit",
                                              step, *cast_step_, serving_wait_seconds_));
  abort_ = true;
  return failure_;
}

Result<std::vector<int>> StepGate::run_pending(int64_t step) {
  std::vector<int> committed;
  if (!pending_ || commit_result_) return committed;
  if (!pending_->owed && pending_->step >= 0 && pending_->step < step)
    return error(Code::Internal, fmt::format("layer {} was to commit at step {}, the serving thread is at step {}",
                                             pending_->layer, pending_->step, step));
  if (pending_->step >= 0 && step < pending_->step) return committed;
  const int layer = pending_->layer;
  Status result = run_now();
  if (!result.is_ok()) return result;
  committed.push_back(layer);
  return committed;
}

Result<std::vector<int>> StepGate::commit_ready(int64_t step, int max_layers) {
  std::unique_lock lock(mutex_);
  if (max_layers < 1) return error(Code::InvalidArgument, fmt::format("commit_ready: max_layers {} < 1", max_layers));
  if (step <= step_)
    return error(Code::InvalidArgument, fmt::format("commit_ready: step {} after step {} (steps must increase)",
                                                    step, step_));
  if (step_ < 0) changed_.notify_all();  // a vote may wait for the first step (vote_cast)
  step_ = step;
  if (pending_ && pending_->owed) {  // the round has stopped on this rank; the commit it owes runs first
    auto late = run_pending(step);
    if (!late || !failure_.is_ok()) return late ? Result<std::vector<int>>(failure_) : late;
    return late;
  }
  EPLB_TRY(wait_for_result(lock, step));
  if (!failure_.is_ok()) return failure_;
  return run_pending(step);
}

namespace {

// Phase 2 (after a unanimous yes): every rank's current step; C = max + D.
Result<int64_t> agree_on_step(ProcessGroup& group, StepGate& gate, double vote_seconds, double serving_wait_seconds) {
  bytes::Writer writer;
  writer.raw(kStepMagic);
  EPLB_ASSIGN_OR_RETURN(const int64_t my_step, gate.vote_cast(vote_seconds, serving_wait_seconds));
  writer.u64(uint64_t(my_step));
  auto gathered = group.allgather(writer.take(), Deadline::after_seconds(vote_seconds));
  if (!gathered) return gathered.status();
  int64_t latest = 0;
  for (size_t r = 0; r < gathered->size(); ++r) {
    bytes::Reader reader((*gathered)[r]);
    const bool header = reader.expect(kStepMagic);
    const uint64_t their_step = reader.u64();
    if (!header || !reader.at_end() || their_step > (uint64_t(1) << 62))
      return error(Code::Mismatch, fmt::format("rank {} sent a malformed commit step message ({} bytes)", r,
                                               (*gathered)[r].size()));
    latest = std::max(latest, int64_t(their_step));
  }
  return latest + gate.lead();
}

}  // namespace

Result<Ballots> stepped_vote(ProcessGroup& group, StepGate& gate, bool yes, bool stop, const std::string& reason,
                             double vote_seconds, double serving_wait_seconds, int64_t* commit_step) {
  EPLB_ASSIGN_OR_RETURN(Ballots ballots,
                        exchange_votes(group, yes, stop, reason, Deadline::after_seconds(vote_seconds)));
  if (!ballots.unanimous) return ballots;
  EPLB_ASSIGN_OR_RETURN(*commit_step, agree_on_step(group, gate, vote_seconds, serving_wait_seconds));
  return ballots;
}

}  // namespace eplb::migrate
