// migrator_state.h (internal) - what the Migrator keeps between calls and
// the pieces of the per-layer protocol, shared by migrator.cpp (set-up),
// layer_round.cpp (the per-layer loop), layer_attempt.cpp (one attempt),
// round_opening.cpp, vote.cpp and step_gate.cpp. Rows move through the
// rank's DataPlane (eplb/data_plane.h), never here.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "eplb/data_plane.h"
#include "eplb/migrate.h"
#include "eplb/plan.h"

namespace eplb::migrate {

// What one rank tells the others at set-up.
struct RankMap {
  std::string layout;  // StoreLayout::encode()
  uint32_t first_slot = 0;
  bool has_spare = false;    // its store has spare buffers (the swap commit)
  std::string plane;         // DataPlane::name()
  std::string digest_kind;   // DataPlane::digest_kind()
  std::string transfer_schedule;  // transfer_schedule_name(): every rank must use the same
  std::string plane_blob;    // DataPlane::describe()
  std::string setup_error;   // non-empty: this rank failed locally before the exchange
};
std::string encode_map(const RankMap& map);
Result<RankMap> decode_map(std::string_view message, int rank);

// InvalidArgument for the swap commit on a store without spare buffers.
Status check_commit_mode(CommitMode mode, const ExpertStore& store);
// "3,7,12,... (40 in all)"
std::string join_ints(const std::vector<int>& values, size_t limit = 12);

// Runs a collective on a helper thread while this thread keeps driving the
// transfer agent: with transports that emulate one-sided READs in software
// (UCX over shared memory without CMA, for example) a source only serves
// its peers' READs while it progresses, and it must keep serving them while
// it waits for the slowest rank in a vote. The collective has its own
// deadline, so the loop ends. Between rounds of progress it waits on the
// collective itself: 20 us after a round that handled events, doubling up
// to 500 us while none arrive, so that ranks sharing cores with the ones
// still working (more ranks than cores) do not take their CPU time with
// wake-ups; the collective's end wakes it at once.
template <typename Collective>
auto with_progress(DataPlane& plane, Collective&& collective) {
  constexpr auto kBusyPause = std::chrono::microseconds(20), kIdlePause = std::chrono::microseconds(500);
  auto pending = std::async(std::launch::async, std::forward<Collective>(collective));
  auto pause = kBusyPause;
  while (pending.wait_for(pause) != std::future_status::ready)
    pause = plane.progress() ? kBusyPause : std::min(pause * 2, kIdlePause);
  return pending.get();
}

// The checksums every source published for one layer, the expert each
// published slot holds (by the source's placement in force), and which of
// its two buffers is live (always 0 without spare buffers).
struct PublishedSums {
  std::vector<std::vector<uint64_t>> sums;        // [source rank][row], row = position * tensors + tensor
  std::vector<std::vector<int32_t>> experts;      // [source rank][position]
  std::vector<int> live;                          // [source rank] 0 or 1
  std::vector<std::map<int, size_t>> index;       // [source rank] slot -> position in slots_read_from
  Status status;                                  // a malformed message, if any
  double seconds = 0;  // the round's allgather, counted in its first changed layer's report
};
// One source's publication for one layer: per published slot (in
// slots_read_from order) the expert it holds and its rows' checksums.
struct SourceSums {
  std::vector<uint64_t> sums;    // [position * tensors + tensor]
  std::vector<int32_t> experts;  // [position]
  int live = 0;
};
std::string encode_sums(const SourceSums& sums);
// What a rank published for `slots` slots of `tensors` tensors; Mismatch when
// malformed or when it names buffer 1 but `has_spare` is false.
Result<SourceSums> decode_sums(std::string_view message, size_t slots, size_t tensors, int rank, int layer,
                               bool has_spare);

// The round's first collective (round_opening.cpp): per layer, the digests
// of the rank's old and new placement; then one blob per changed layer (its
// checksums). Every rank opens every round, changed or not, so that ranks
// disagreeing about the placements meet here before anything moves.
struct RoundOpening {
  std::vector<std::pair<uint64_t, uint64_t>> digests;  // [layer] (old, new)
  std::vector<std::string_view> blobs;                 // views into the decoded message
};
std::string encode_opening(const Placement& current, const Placement& target, const std::vector<std::string>& blobs);
Result<RoundOpening> decode_opening(std::string_view message, int rank, int num_layers);
// The first (rank, layer) whose digests differ from rank 0's.
std::optional<std::pair<int, int>> first_disagreement(const std::vector<RoundOpening>& openings);
// Collective, run by every rank once first_disagreement found one: exchanges
// that layer's rows and returns the Mismatch naming rank, layer, slot and
// both experts.
Status explain_disagreement(ProcessGroup& group, int rank, int layer, const Placement& current,
                            const Placement& target, Deadline deadline);

// Everything one rank needs for one attempt of one layer, up to (not
// including) the vote.
struct AttemptContext {
  DataPlane& plane;
  ExpertStore& store;
  const LayerPlan* plan;  // null in an exchange (Migrator::exchange): `given` says what moves
  const PublishedSums& published;
  int me;
  int layer;
  Deadline transfer_deadline;
  // Swap commit on this rank for this layer: the new rows go to the spare
  // buffer (READs, local copies and the rows that stay) instead of staging.
  bool swap;
  LayerReport* report;
  // Out: the digest of every staged row, [local slot * tensors + tensor],
  // where known (verified reads, copies of rows with a known digest).
  std::vector<std::optional<uint64_t>>* staged_sums;
  // [issue 31] This rank's READs in schedule order, one entry per round
  // (scheduled_read_rounds); nullptr: the plan's requests all at once.
  const std::vector<std::vector<ReadRequest>>* read_rounds = nullptr;
  // [issue 31] Set with MigrateOptions::fence_schedule_rounds (read_rounds
  // then holds every round of the schedule, empty ones included): called
  // on every rank after each round with its outcome; returns Ok when every
  // rank's round landed, else the first failure (fence_round).
  std::function<Status(const Status& mine, size_t round)> round_fence;
  // An exchange's transfers (this rank's receives and sends), no local copies.
  const LayerTransfers* given = nullptr;
};
// [issue 31] Rank `me`'s READs of one layer in the transfer schedule's
// rounds (MigrateOptions::transfer_schedule), for AttemptContext::read_rounds.
// `every_round`: one entry per round of the schedule, empty ones included.
Result<std::vector<std::vector<ReadRequest>>> scheduled_read_rounds(const LayerPlan& plan, const Topology& topology,
                                                                    const ExpertStore& store, int me,
                                                                    const LinkBandwidths& bandwidths,
                                                                    bool every_round = false);
// [issue 31] Which fence of a fenced schedule: after round `round` (from 0)
// of attempt `attempt` (from 0) of `layer`.
struct FenceId {
  int layer = 0;
  int attempt = 0;
  uint32_t round = 0;
};
// The fence (collective, every rank): each rank's outcome of its round in
// one allgather of ballots that name the fence. Ok when all landed; this
// rank's own failure when it had one (a failure of the fence itself added
// as context); else Aborted naming the first rank that failed, its reason,
// the layer and the round; Mismatch naming a rank at another fence or with
// a malformed ballot. `deadline`: a collective's (the slowest rank's
// transfers may run to their own deadline first).
Status fence_round(ProcessGroup& group, const Status& mine, const FenceId& id, Deadline deadline);
// Ok when every row this rank needs is in staging and verified; otherwise
// the reason (also the rank's vote).
Status run_attempt(const AttemptContext& context);
// After a unanimous vote: every changed slot's live rows get their new
// expert (the plane's commit), and the store remembers their digests
// (copy); or the spare buffer becomes live (swap, the attempt's
// staged_sums cover every row).
Status commit_layer(bool swap, DataPlane& plane, ExpertStore& store, const RankLayerPlan& rank_plan, int layer,
                    const std::vector<std::optional<uint64_t>>& staged_sums);

// Where the progress thread of an AsyncMigration meets the serving thread
// (step_gate.cpp). The serving thread advances the step and runs commits;
// the progress thread casts votes stamped with the step and hands commits
// over, waiting until the serving thread ran them. A commit handed over
// was voted by every rank, so it always runs on this rank: at its step, or,
// when the serving thread is later than the deadline, at the first
// commit_ready from its step on or at close() (the commit is then "owed"
// and the round stops on this rank); a commit handed over while the handle
// closes runs at once (the serving thread waits in close()).
class StepGate {
 public:
  explicit StepGate(int lead_steps) : lead_(lead_steps) {}
  // Progress thread.
  // Records and returns the step the vote carries: the serving thread's
  // current step, so it waits (at most `vote_seconds`) for the serving
  // thread's first commit_ready on this handle (steps need not start at 0).
  // The serving thread waits for the result at most `serving_wait_seconds`
  // (derive_deadlines) past step + lead.
  Result<int64_t> vote_cast(double vote_seconds, double serving_wait_seconds);
  int lead() const { return lead_; }
  // Hands over the commit of `layer` at `step` (-1: at the next step, no
  // agreement needed) and waits until the serving thread ran it. Past the
  // deadline the commit stays owed (*owed = true) and Timeout is returned.
  // `commit` must own what it uses: it may run after the round ended.
  Status commit_at(int layer, int64_t step, std::function<Status()> commit, Deadline deadline, bool* owed);
  void finish(Status status);                     // the round ended
  bool abort_requested() const;
  // Serving thread.
  Result<std::vector<int>> commit_ready(int64_t step, int max_layers);
  Status failure() const;
  bool ready() const;
  bool done() const;
  void request_abort();
  // The handle goes away: a commit handed over (owed or not) runs now; the
  // progress thread's next vote stops the round.
  void close();

 private:
  Status wait_for_result(std::unique_lock<std::mutex>& lock, int64_t step);
  Result<std::vector<int>> run_pending(int64_t step);
  const int lead_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int64_t step_ = -1;
  std::optional<int64_t> cast_step_;  // a vote in flight, cast at this step
  double serving_wait_seconds_ = 0;
  struct Pending {
    int layer = 0;
    int64_t step = -1;
    std::function<Status()> commit;
    bool owed = false;  // the progress thread stopped waiting for it
  };
  // Runs the pending commit now (serving thread, or a closing handle).
  Status run_now();
  std::optional<Pending> pending_;
  std::optional<Status> commit_result_;
  Status failure_;
  bool done_ = false, abort_ = false, closed_ = false;
};

// The protocol's vote (vote.cpp): every rank's yes/no, whether it stops
// the round (an abort request, a failed per-layer callback), and its reason.
struct Ballots {
  bool unanimous = true;  // every rank voted yes and none stops
  int stop_rank = -1;     // the first rank that stops the round, or -1
  std::vector<std::string> reasons;
};
Result<Ballots> exchange_votes(ProcessGroup& group, bool yes, bool stop, const std::string& reason,
                               Deadline deadline);

// Why this rank stops the round at its next vote (thread-safe; the first
// request wins).
class StopRequest {
 public:
  void request(Status why);
  Status reason() const;  // Ok when none
  void clear();

 private:
  mutable std::mutex mutex_;
  Status reason_;
};

// The async vote: exchange_votes, then, only when unanimous, every rank's
// current step (taken when the first phase is over, so a serving thread
// never waits for a slower rank's transfers): *commit_step = max step + lead.
Result<Ballots> stepped_vote(ProcessGroup& group, StepGate& gate, bool yes, bool stop, const std::string& reason,
                             double vote_seconds, double serving_wait_seconds, int64_t* commit_step);

// The layer loop of a round, shared by Migrator::migrate (gate == nullptr)
// and the progress thread of an AsyncMigration.
RoundReport run_round(Migrator::State& state, const MigrateOptions& options, Placement& current,
                      const Placement& target, StepGate* gate);

}  // namespace eplb::migrate

namespace eplb {

struct Migrator::State {
  ProcessGroup* group = nullptr;
  DataPlane* plane = nullptr;
  std::unique_ptr<DataPlane> owned_plane;  // the ucx plane of Migrator::create over an agent
  ExpertStore* store = nullptr;
  Topology topology;
  std::vector<migrate::RankMap> ranks;  // indexed by rank
  const MigrateOptions* options = nullptr;  // the Migrator's
  migrate::StopRequest stop;                // Migrator::stop_at_next_vote

  int me() const { return group->rank(); }
  int tensors(int layer) const { return int(store->layout().layers[layer].size()); }
};

}  // namespace eplb
