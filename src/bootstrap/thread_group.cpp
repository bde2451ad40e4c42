// In-process groups: ranks that are threads of one process share a state
// guarded by a mutex. Collective number s of every rank meets in round s;
// the last rank to arrive computes the result and wakes the others. Every
// wait is bounded by the caller's deadline. Destroying a rank's group marks
// that rank as departed, which the others report as RemoteDisconnect.
#include <fmt/format.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include "connection.h"
#include "eplb/bootstrap.h"
#include "message.h"

namespace eplb {
namespace {

using bootstrap::MessageKind;

struct Round {
  MessageKind kind = MessageKind::Allgather;
  int first_rank = -1;
  std::vector<std::optional<std::string>> contributions;
  int arrived = 0;
  int taken = 0;
  bool done = false;
  int abandoned_by = -1;  // a rank that timed out here
  Status failure;         // set for everyone when ranks diverge
  std::vector<std::string> result;
};

struct SharedState {
  explicit SharedState(int size)
      : size(size), position(static_cast<size_t>(size), 0), departed(static_cast<size_t>(size), false) {}
  std::mutex mutex;
  std::condition_variable changed;
  const int size;
  std::map<uint64_t, Round> rounds;
  std::vector<uint64_t> position;  // the collective each rank is in (or last was in)
  std::vector<bool> departed;
};

std::string collective_name(MessageKind kind, uint64_t sequence) {
  return fmt::format("{} #{}", bootstrap::kind_name(kind), sequence);
}

class ThreadGroup final : public ProcessGroup {
 public:
  ThreadGroup(int rank, std::shared_ptr<SharedState> shared) : rank_(rank), shared_(std::move(shared)) {}
  ~ThreadGroup() override {
    std::lock_guard lock(shared_->mutex);
    shared_->departed[static_cast<size_t>(rank_)] = true;
    shared_->changed.notify_all();
  }

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  std::string backend_name() const override { return "thread"; }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override;

 private:
  // Under the lock: Mismatch when another rank is past `sequence` already.
  Status check_not_late(const std::string& what, uint64_t sequence);
  // Under the lock: joins round `sequence` with `mine`; a failure when a
  // rank gave up on the round or the round's kind differs.
  Status arrive(Round& round, MessageKind kind, uint64_t sequence, std::string mine);
  int departed_missing(const Round& round) const;
  Status timed_out(Round& round, const std::string& what, double seconds) const;

  int rank_;
  std::shared_ptr<SharedState> shared_;
  uint64_t sequence_ = 0;
};

Status ThreadGroup::check_not_late(const std::string& what, uint64_t sequence) {
  SharedState& shared = *shared_;
  shared.position[static_cast<size_t>(rank_)] = sequence;
  for (int r = 0; r < shared.size; ++r)
    if (shared.position[static_cast<size_t>(r)] > sequence)
      return error(Code::Mismatch, fmt::format("{}: rank {} is already at collective #{} while rank {} is at #{}: "
                                               "rank {} is late (an earlier collective failed or was skipped here)",
                                               what, r, shared.position[static_cast<size_t>(r)], rank_, sequence,
                                               rank_));
  return Status::ok();
}

Status ThreadGroup::arrive(Round& round, MessageKind kind, uint64_t sequence, std::string mine) {
  SharedState& shared = *shared_;
  const std::string what = collective_name(kind, sequence);
  if (round.contributions.empty()) round.contributions.resize(static_cast<size_t>(shared.size));
  if (round.abandoned_by >= 0)
    return error(Code::Timeout, fmt::format("{}: rank {} gave up waiting here before rank {} arrived: rank {} is late",
                                            what, round.abandoned_by, rank_, rank_));
  if (round.first_rank < 0) {
    round.kind = kind;
    round.first_rank = rank_;
  } else if (round.kind != kind && round.failure.is_ok()) {
    round.failure = error(Code::Mismatch, fmt::format("rank {} called {} while rank {} called {}: collectives must be "
                                                      "called in the same order on every rank",
                                                      rank_, what, round.first_rank,
                                                      collective_name(round.kind, sequence)));
    shared.changed.notify_all();
  }
  round.contributions[static_cast<size_t>(rank_)] = std::move(mine);
  if (++round.arrived == shared.size && round.failure.is_ok()) {
    round.done = true;
    for (auto& contribution : round.contributions) round.result.push_back(*contribution);
    shared.changed.notify_all();
  }
  return Status::ok();
}

int ThreadGroup::departed_missing(const Round& round) const {
  for (int r = 0; r < shared_->size; ++r)
    if (!round.contributions[static_cast<size_t>(r)] && shared_->departed[static_cast<size_t>(r)]) return r;
  return -1;
}

Status ThreadGroup::timed_out(Round& round, const std::string& what, double seconds) const {
  round.abandoned_by = rank_;
  std::vector<int> missing, present;
  std::string positions;
  for (int r = 0; r < shared_->size; ++r) {
    if (round.contributions[static_cast<size_t>(r)]) {
      present.push_back(r);
      continue;
    }
    missing.push_back(r);
    positions += fmt::format("{}rank {} is at #{}", positions.empty() ? "" : ", ", r,
                             shared_->position[static_cast<size_t>(r)]);
  }
  return error(Code::Timeout, fmt::format("{}: rank{} {} {} not arrived within {} ({}; arrived: ranks {})", what,
                                          missing.size() > 1 ? "s" : "", bootstrap::rank_list(missing),
                                          missing.size() > 1 ? "have" : "has", format_seconds(seconds), positions,
                                          bootstrap::rank_list(present)))
      .with_peer(missing.empty() ? -1 : missing.front());
}

Result<std::vector<std::string>> ThreadGroup::exchange(Collective collective, std::string mine, Deadline deadline) {
  const MessageKind kind = bootstrap::message_kind(collective);
  const uint64_t sequence = ++sequence_;
  const std::string what = collective_name(kind, sequence);
  Stopwatch elapsed;
  SharedState& shared = *shared_;
  std::unique_lock lock(shared.mutex);
  EPLB_TRY(check_not_late(what, sequence));
  Round& round = shared.rounds[sequence];
  EPLB_TRY(arrive(round, kind, sequence, std::move(mine)));
  bool finished = shared.changed.wait_until(lock, deadline.at(), [&] {
    return round.done || !round.failure.is_ok() || departed_missing(round) >= 0;
  });
  if (!round.failure.is_ok()) return round.failure.with_context(what);
  if (!finished || (!round.done && departed_missing(round) < 0)) return timed_out(round, what, elapsed.seconds());
  if (!round.done)
    return error(Code::RemoteDisconnect, fmt::format("{}: rank {} lost (its group was destroyed before it joined {})",
                                                     what, departed_missing(round), what))
        .with_peer(departed_missing(round));
  std::vector<std::string> result = round.result;
  if (++round.taken == shared.size) shared.rounds.erase(sequence);
  return result;
}

}  // namespace

std::vector<std::unique_ptr<ProcessGroup>> make_thread_groups(int size) {
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  if (size < 1) return groups;
  auto shared = std::make_shared<SharedState>(size);
  for (int r = 0; r < size; ++r) groups.push_back(std::make_unique<ThreadGroup>(r, shared));
  return groups;
}

}  // namespace eplb
