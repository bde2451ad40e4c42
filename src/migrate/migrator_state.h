// migrator_state.h (internal) - what the Migrator keeps between calls and
// the pieces of the per-layer protocol, shared by migrator.cpp (set-up),
// layer_round.cpp (the per-layer loop) and layer_attempt.cpp (one attempt).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "eplb/migrate.h"
#include "eplb/plan.h"

namespace eplb::migrate {

// What one rank tells the others at set-up.
struct RankMap {
  std::string layout;    // StoreLayout::encode()
  std::string metadata;  // xfer agent metadata
  std::string agent_name;
  uint32_t first_slot = 0;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> tensors;  // [layer][tensor] -> (address, stride) of buffer 0
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spare_tensors;  // the same of buffer 1 (none without spares)
  std::string setup_error;  // non-empty: this rank failed locally before the exchange
};
std::string encode_map(const RankMap& map);
Result<RankMap> decode_map(std::string_view message, int rank);

// "3,7,12,... (40 in all)"
// InvalidArgument for the swap commit on a store without spare buffers.
Status check_commit_mode(CommitMode mode, const ExpertStore& store);
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
auto with_progress(xfer::Agent& agent, Collective&& collective) {
  constexpr auto kBusyPause = std::chrono::microseconds(20), kIdlePause = std::chrono::microseconds(500);
  auto pending = std::async(std::launch::async, std::forward<Collective>(collective));
  auto pause = kBusyPause;
  while (pending.wait_for(pause) != std::future_status::ready)
    pause = agent.progress() ? kBusyPause : std::min(pause * 2, kIdlePause);
  return pending.get();
}

// The checksums every source published for one layer, and which of its
// two buffers is live (always 0 without spare buffers).
struct PublishedSums {
  std::vector<std::vector<uint64_t>> sums;        // [source rank][row], row = position * tensors + tensor
  std::vector<int> live;                          // [source rank] 0 or 1
  std::vector<std::map<int, size_t>> index;       // [source rank] slot -> position in slots_read_from
  Status status;                                  // a malformed message, if any
  Status lost;     // the round's checksum allgather failed (a rank lost): the round stops
  double seconds = 0;  // the round's allgather, counted in its first changed layer's report
};
std::string encode_sums(const std::vector<uint64_t>& sums, int live_buffer);
// The checksums and the live buffer a rank published; Mismatch when
// malformed or when it names buffer 1 but `has_spare` is false.
Result<std::pair<std::vector<uint64_t>, int>> decode_sums(std::string_view message, size_t expected_count, int rank,
                                                          int layer, bool has_spare);
// The address and stride of `rank`'s tensor in the buffer it published live.
std::pair<uint64_t, uint64_t> source_tensor(const RankMap& map, int live, int layer, int tensor);

// Everything one rank needs for one attempt of one layer, up to (not
// including) the vote.
struct AttemptContext {
  xfer::Agent& agent;
  ExpertStore& store;
  const std::vector<RankMap>& ranks;
  const LayerPlan& plan;
  const PublishedSums& published;
  int me;
  int layer;
  Deadline transfer_deadline;
  // Swap commit on this rank for this layer: the new rows go to the spare
  // buffer (READs, local copies and the rows that stay) instead of staging.
  bool swap;
  LayerReport* report;
  // Out: XXH3 of every staged row, [local slot * tensors + tensor], where
  // known (verified reads, copies of rows with a known checksum).
  std::vector<std::optional<uint64_t>>* staged_sums;
  // [issue 31] This rank's READs in schedule order, one entry per round
  // (scheduled_read_rounds); nullptr: the plan's requests all at once.
  const std::vector<std::vector<ReadRequest>>* read_rounds = nullptr;
};
// [issue 31] Rank `me`'s READs of one layer in the transfer schedule's
// rounds (MigrateOptions::transfer_schedule), for AttemptContext::read_rounds.
Result<std::vector<std::vector<ReadRequest>>> scheduled_read_rounds(const LayerPlan& plan, const Topology& topology,
                                                                    const ExpertStore& store, int me,
                                                                    const LinkBandwidths& bandwidths);
// Ok when every row this rank needs is in staging and verified; otherwise
// the reason (also the rank's vote).
Status run_attempt(const AttemptContext& context);
// After a unanimous vote: every changed slot's live rows get their new
// expert, and the store remembers their checksums (copy); or the spare
// buffer becomes live (swap, the attempt's staged_sums cover every row).
void commit_layer(bool swap, ExpertStore& store, const RankLayerPlan& rank_plan, int layer,
                  const std::vector<std::optional<uint64_t>>& staged_sums);

// Where the progress thread of an AsyncMigration meets the serving thread
// (step_gate.cpp). The serving thread advances the step and runs commits;
// the progress thread casts votes stamped with the step and hands commits
// over, waiting until the serving thread ran them.
class StepGate {
 public:
  explicit StepGate(int lead_steps) : lead_(lead_steps) {}
  // Progress thread.
  // Records and returns the step the vote carries: the serving thread's
  // current step, so it waits (at most `vote_seconds`) for the serving
  // thread's first commit_ready on this handle (steps need not start at 0).
  // The serving thread waits for the result at most `vote_seconds` (+ a
  // margin) past step + lead.
  Result<int64_t> vote_cast(double vote_seconds);
  int lead() const { return lead_; }
  // Hands over the commit of `layer` at `step` (-1: at the next step, no
  // agreement needed) and waits until the serving thread ran it.
  Status commit_at(int layer, int64_t step, std::function<Status()> commit, Deadline deadline);
  void finish(Status status);                     // the round ended
  bool abort_requested() const;
  // Serving thread.
  Result<std::vector<int>> commit_ready(int64_t step, int max_layers);
  Status failure() const;
  bool ready() const;
  bool done() const;
  void request_abort();
  void close();  // the handle goes away: pending and future hand-overs fail

 private:
  Status wait_for_result(std::unique_lock<std::mutex>& lock, int64_t step);
  Result<std::vector<int>> run_pending(int64_t step);
  const int lead_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int64_t step_ = -1;
  std::optional<int64_t> cast_step_;  // a vote in flight, cast at this step
  double vote_seconds_ = 0;
  struct Pending {
    int layer = 0;
    int64_t step = -1;
    std::function<Status()> commit;
  };
  std::optional<Pending> pending_;
  std::optional<Status> commit_result_;
  Status failure_;
  bool done_ = false, abort_ = false, closed_ = false;
};

// A vote in two phases: yes/no, reason and abort request of every rank;
// then, only when unanimous, every rank's current step (taken when the
// first phase is over, so a serving thread never waits for a slower rank's
// transfers): *commit_step = max step + lead. Yes when unanimous;
// *abort_rank = the first rank that asked to abort (or -1).
Result<bool> stepped_vote(ProcessGroup& group, StepGate& gate, bool yes, const std::string& reason,
                          double vote_seconds, std::vector<std::string>* reasons, int64_t* commit_step,
                          int* abort_rank);

// The layer loop of a round, shared by Migrator::migrate (gate == nullptr)
// and the progress thread of an AsyncMigration.
RoundReport run_round(Migrator::State& state, const MigrateOptions& options, Placement& current,
                      const Placement& target, StepGate* gate);

}  // namespace eplb::migrate

namespace eplb {

struct Migrator::State {
  ProcessGroup* group = nullptr;
  xfer::Agent* agent = nullptr;
  ExpertStore* store = nullptr;
  Topology topology;
  std::vector<xfer::RegionId> regions;
  std::vector<migrate::RankMap> ranks;  // indexed by rank
  const MigrateOptions* options = nullptr;  // the Migrator's

  int me() const { return group->rank(); }
  int tensors(int layer) const { return int(store->layout().layers[layer].size()); }
};

}  // namespace eplb
