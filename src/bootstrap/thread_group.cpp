// In-process groups: ranks that are threads of one process share a state
// guarded by a mutex. Collective number s of every rank meets in round s;
// the last rank to arrive computes the result and wakes the others. Every
// wait is bounded by the caller's deadline. Destroying a rank's group marks
// that rank as departed, which the others report as RemoteDisconnect.
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
  return std::string(bootstrap::kind_name(kind)) + " #" + std::to_string(sequence);
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

  Result<std::vector<std::string>> allgather(const std::string& mine, Deadline deadline) override {
    return collective(MessageKind::Allgather, mine, deadline);
  }
  Status barrier(Deadline deadline) override {
    auto result = collective(MessageKind::Barrier, std::string(), deadline);
    return result.status();
  }
  Result<bool> vote(bool yes, const std::string& reason, Deadline deadline,
                    std::vector<std::string>* reasons) override {
    EPLB_ASSIGN_OR_RETURN(std::vector<std::string> votes,
                          collective(MessageKind::Vote, bootstrap::encode_vote(yes, reason), deadline));
    return bootstrap::tally_votes(votes, reasons);
  }

 private:
  Result<std::vector<std::string>> collective(MessageKind kind, std::string mine, Deadline deadline);

  int rank_;
  std::shared_ptr<SharedState> shared_;
  uint64_t sequence_ = 0;
};

Result<std::vector<std::string>> ThreadGroup::collective(MessageKind kind, std::string mine, Deadline deadline) {
  const uint64_t sequence = ++sequence_;
  const std::string what = collective_name(kind, sequence);
  const std::string self = "rank " + std::to_string(rank_);
  Stopwatch elapsed;
  SharedState& shared = *shared_;
  const int size = shared.size;
  std::unique_lock lock(shared.mutex);
  shared.position[static_cast<size_t>(rank_)] = sequence;
  for (int r = 0; r < size; ++r) {
    if (shared.position[static_cast<size_t>(r)] > sequence)
      return error(Code::Mismatch, what + ": rank " + std::to_string(r) + " is already at collective #" +
                                       std::to_string(shared.position[static_cast<size_t>(r)]) + " while " + self +
                                       " is at #" + std::to_string(sequence) + ": " + self +
                                       " is late (an earlier collective failed or was skipped here)");
  }
  Round& round = shared.rounds[sequence];
  if (round.contributions.empty()) round.contributions.resize(static_cast<size_t>(size));
  if (round.abandoned_by >= 0)
    return error(Code::Timeout, what + ": rank " + std::to_string(round.abandoned_by) +
                                    " gave up waiting here before " + self + " arrived: " + self + " is late");
  if (round.first_rank < 0) {
    round.kind = kind;
    round.first_rank = rank_;
  } else if (round.kind != kind && round.failure.is_ok()) {
    round.failure = error(Code::Mismatch, "rank " + std::to_string(rank_) + " called " + what + " while rank " +
                                              std::to_string(round.first_rank) + " called " +
                                              collective_name(round.kind, sequence) +
                                              ": collectives must be called in the same order on every rank");
    shared.changed.notify_all();
  }
  round.contributions[static_cast<size_t>(rank_)] = std::move(mine);
  if (++round.arrived == size && round.failure.is_ok()) {
    round.done = true;
    round.result.reserve(static_cast<size_t>(size));
    for (auto& contribution : round.contributions) round.result.push_back(*contribution);
    shared.changed.notify_all();
  }

  auto departed_missing = [&]() -> int {
    for (int r = 0; r < size; ++r)
      if (!round.contributions[static_cast<size_t>(r)] && shared.departed[static_cast<size_t>(r)]) return r;
    return -1;
  };
  bool finished = shared.changed.wait_until(lock, deadline.at(), [&] {
    return round.done || !round.failure.is_ok() || departed_missing() >= 0;
  });
  if (!round.failure.is_ok()) return round.failure.with_context(what);
  if (!finished || (!round.done && departed_missing() < 0)) {
    round.abandoned_by = rank_;
    std::vector<int> missing, present;
    std::string positions;
    for (int r = 0; r < size; ++r) {
      if (round.contributions[static_cast<size_t>(r)]) {
        present.push_back(r);
      } else {
        missing.push_back(r);
        if (!positions.empty()) positions += ", ";
        positions += "rank " + std::to_string(r) + " is at #" + std::to_string(shared.position[static_cast<size_t>(r)]);
      }
    }
    return error(Code::Timeout, what + ": rank" + (missing.size() > 1 ? "s " : " ") +
                                    bootstrap::rank_list(missing) + (missing.size() > 1 ? " have" : " has") +
                                    " not arrived within " + format_seconds(elapsed.seconds()) + " (" + positions +
                                    "; arrived: ranks " + bootstrap::rank_list(present) + ")");
  }
  if (!round.done) {
    int gone = departed_missing();
    return error(Code::RemoteDisconnect, what + ": rank " + std::to_string(gone) +
                                             " lost (its group was destroyed before it joined " + what + ")");
  }
  std::vector<std::string> result = round.result;
  if (++round.taken == size) shared.rounds.erase(sequence);
  if (kind == MessageKind::Barrier) return std::vector<std::string>{};
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
