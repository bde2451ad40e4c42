// layer_run.cpp - LayerRun (layer_run.h): one layer of the protocol on one
// rank, and the small rules Migrator rounds and exchanges share.
#include "layer_run.h"

#include <fmt/format.h>

#include <algorithm>

namespace eplb::migrate {

std::string layer_list(const std::vector<int>& layers) { return layers.empty() ? "none" : join_ints(layers, 64); }

// The code of the first "no" in a vote: each rank's reason is its failure's
// Status::to_string(), "<code name>: <message>". Aborted when none names one.
Code first_code(const std::vector<std::string>& reasons) {
  for (const auto& reason : reasons)
    for (int c = int(Code::InvalidArgument); c <= int(Code::Internal); ++c) {
      const std::string_view name = code_name(Code(c));
      if (reason.size() > name.size() && reason.compare(0, name.size(), name) == 0 && reason[name.size()] == ':')
        return Code(c);
    }
  return Code::Aborted;
}

// The layer's deadlines (derive_deadlines): the largest read of any rank
// (every rank computes the same plan, so it is known everywhere).
Deadlines layer_deadlines(const Migrator::State& state, const MigrateOptions& options, const LayerPlan& plan) {
  const uint64_t expert_bytes = state.store->layout().bytes_per_expert(plan.layer);
  uint64_t largest_read = 0;
  for (const auto& rank_plan : plan.ranks) {
    uint64_t bytes = 0;
    for (const auto& request : rank_plan.reads) bytes += uint64_t(request.slots()) * expert_bytes;
    largest_read = std::max(largest_read, bytes);
  }
  return derive_deadlines(options, largest_read);
}

// Whether a layer moves any row (otherwise only its replica order may change).
bool moves_rows(const LayerPlan& plan) {
  return plan.stats.slots_local_copy + plan.stats.slots_read_intra_node + plan.stats.slots_read_inter_node > 0;
}

void LayerRun::record_plan(const LayerPlan& plan) {
  const uint64_t expert_bytes = state_.store->layout().bytes_per_expert(layer_);
  report_.bytes_kept = uint64_t(plan.stats.slots_kept) * expert_bytes;
  report_.bytes_local = uint64_t(plan.stats.slots_local_copy) * expert_bytes;
  report_.bytes_intra_node = uint64_t(plan.stats.slots_read_intra_node) * expert_bytes;
  report_.bytes_inter_node = uint64_t(plan.stats.slots_read_inter_node) * expert_bytes;
  report_.requests = plan.stats.requests;
  report_.descriptors = plan.stats.descriptors;
  for (const auto& request : plan.ranks[state_.me()].reads)
    report_.bytes_read_here += uint64_t(request.slots()) * expert_bytes;
  report_.changed = moves_rows(plan);
}

Status LayerRun::lost(const Status& failure, const std::string& during) {
  report_.failure = failure.to_string();
  report_.failure_code = failure.code();
  operation_ = during;
  return Status(failure.code(),
                fmt::format("migration stopped on rank {} at layer {} ({}): {}; layer {} kept its old placement on "
                            "this rank (live weights and mapping untouched); layers committed to the new placement "
                            "this round: {}",
                            state_.me(), layer_, during, failure.message(), layer_, layer_list(committed_)))
      .with_peer(failure.peer());
}

// Why this rank stops the round at this vote: a stop request (a failed
// per-layer callback), or an abort of the async round; Ok otherwise.
Status LayerRun::stop_reason() const {
  Status requested = state_.stop.reason();
  if (!requested.is_ok()) return requested;
  if (gate_ && gate_->abort_requested())
    return error(Code::Aborted, fmt::format("rank {} asked to abort the round", state_.me()));
  return Status::ok();
}

// The sync vote, or (async) the vote that also fixes the commit step.
Result<Ballots> LayerRun::cast_vote(const Status& outcome, bool stop) {
  const std::string my_reason = outcome.is_ok() ? std::string() : outcome.to_string();
  return with_progress(*state_.plane, [&]() -> Result<Ballots> {
    if (gate_)
      return stepped_vote(*state_.group, *gate_, outcome.is_ok(), stop, my_reason, collective_seconds_,
                          serving_wait_seconds_, &commit_step_);
    return exchange_votes(*state_.group, outcome.is_ok(), stop, my_reason, Deadline::after_seconds(collective_seconds_));
  });
}

// Runs `switch_layer` now (sync) or hands it to the serving thread for
// serving step `step` (async) and waits for it. A commit the serving thread
// was too late for is owed (it will run, the vote agreed): the layer counts
// as committed and the round stops on this rank.
Status LayerRun::commit(std::function<Status()> switch_layer, int64_t step) {
  if (!gate_) return switch_layer();
  bool owed = false;
  Status result = gate_->commit_at(layer_, step, std::move(switch_layer),
                                   Deadline::after_seconds(collective_seconds_), &owed);
  if (!owed) return result;
  report_.committed = report_.changed;
  report_.failure = result.to_string();
  report_.failure_code = result.code();
  return Status(result.code(), fmt::format("migration stopped on rank {} at layer {} (committing): {}; layers "
                                           "committed (or owed) to the new placement this round: {}",
                                           state_.me(), layer_, result.message(),
                                           layer_list([&] {
                                             auto layers = committed_;
                                             layers.push_back(layer_);
                                             return layers;
                                           }())));
}

// The commit of a voted layer as a closure that owns what it uses (an owed
// commit may run after this LayerRun and the round are gone): rows from
// staging to live (or the spare made live), then the layer's mapping.
std::function<Status()> LayerRun::switch_layer(const LayerPlan& plan, Placement& current, const Placement& target) {
  auto owned_plan = std::make_shared<const LayerPlan>(plan);
  auto seconds = commit_seconds_;
  return [plane = state_.plane, store = state_.store, owned_plan, sums = staged_sums_, swap = swap_, layer = layer_,
          me = state_.me(), &current, &target, seconds]() -> Status {
    Stopwatch commit_clock;
    EPLB_TRY(commit_layer(swap, *plane, *store, owned_plan->ranks[me], layer, sums));
    *seconds += commit_clock.seconds();
    return current.set_layer(layer, target, layer);
  };
}

// The transfer phase of attempt `number` (run_attempt), or `outcome` when it
// is already a failure. [issue 31] With a transfer schedule its rounds in
// order, and with fence_schedule_rounds a fence after each round with a
// collective's deadline (a rank whose round stalls runs to the transfer
// deadline first); a rank that fails before its first fence still joins it,
// where the others wait, so that every rank's collectives stay in step.
Status LayerRun::transfer_phase(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                                int number, Status outcome) {
  Result<std::vector<std::vector<ReadRequest>>> rounds = std::vector<std::vector<ReadRequest>>{};
  const bool scheduled = options_.transfer_schedule && plan;
  if (scheduled)  // every rank computes the same rounds
    rounds = scheduled_read_rounds(*plan, state_.topology, *state_.store, state_.me(), *options_.transfer_schedule,
                                   options_.fence_schedule_rounds);
  const Deadline transfer_deadline = Deadline::after_seconds(transfer_seconds_);
  const Deadline fence_deadline = Deadline::after_seconds(collective_seconds_);
  size_t fences = 0;  // fences this rank joined in this attempt
  auto fence = [&](const Status& mine, size_t round) {
    ++fences;
    const FenceId id{layer_, number, uint32_t(round)};
    return with_progress(*state_.plane, [&] { return fence_round(*state_.group, mine, id, fence_deadline); });
  };
  const bool fenced = options_.fence_schedule_rounds && rounds && !rounds->empty();
  if (outcome && rounds) {
    AttemptContext context{*state_.plane, *state_.store, plan, published, state_.me(), layer_,
                           transfer_deadline, swap_, &report_, &staged_sums_};
    context.given = given;
    if (scheduled) context.read_rounds = &*rounds;
    if (fenced) context.round_fence = fence;
    outcome = run_attempt(context);
  } else if (outcome) {
    outcome = rounds.status();
  }
  if (fenced && fences == 0 && !outcome.is_ok()) return fence(outcome, 0);
  return outcome;
}

// One attempt and its vote; *committed when the vote was unanimous.
Status LayerRun::attempt(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                         Placement* current, const Placement* target, int number, bool* committed) {
  if (options_.before_attempt) options_.before_attempt(layer_, number);
  const Status stop = stop_reason();
  const Status outcome = transfer_phase(plan, given, published, number, stop.is_ok() ? published.status : stop);
  Stopwatch phase;
  auto vote = cast_vote(outcome, !stop.is_ok());
  report_.seconds_vote += phase.seconds();
  if (!vote) return lost(vote.status(), fmt::format("voting on attempt {}", number + 1));
  const std::vector<std::string>& reasons = vote->reasons;
  if (vote->stop_rank >= 0)
    return lost(error(Code::Aborted, fmt::format("rank {} stopped the round ({})", vote->stop_rank,
                                                 reasons[size_t(vote->stop_rank)]))
                    .with_peer(vote->stop_rank),
                fmt::format("voting on attempt {}", number + 1));
  if (vote->unanimous && !plan) {  // an exchange: every rank's rows landed and verified; the engine commits
    *committed = true;
    return Status::ok();
  }
  if (vote->unanimous) {
    // Unanimous: every rank's reads of this layer have landed, so no peer
    // reads these rows any more. Staging -> live (or spare <-> live), switch
    // the mapping.
    Status switched = commit(switch_layer(*plan, *current, *target), commit_step_);
    report_.seconds_commit += *commit_seconds_;
    if (report_.committed) return switched;  // owed: the layer will commit, the round stops here
    if (!switched) return lost(switched, "committing");
    *committed = true;
    return Status::ok();
  }
  last_failure_.clear();
  no_voter_ = -1;
  for (size_t r = 0; r < reasons.size(); ++r) {
    if (reasons[r].empty()) continue;
    if (no_voter_ < 0 || no_voter_ == state_.me()) no_voter_ = int(r);
    std::string reason = reasons[r].size() > 700 ? reasons[r].substr(0, 700) + "..." : reasons[r];
    last_failure_ += fmt::format("{}rank {} voted no: {}", last_failure_.empty() ? "" : "; ", r, reason);
  }
  if (last_failure_.empty()) last_failure_ = "a rank voted no without a reason";
  report_.failure = fmt::format("attempt {}: {}", number + 1, last_failure_);
  report_.failure_code = first_code(reasons);
  if (number < options_.retries) ++report_.retries;
  return Status::ok();
}

// The attempts of a changed layer, up to 1 + retries; Aborted after the last.
Status LayerRun::attempts(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                          Placement* current, const Placement* target) {
  report_.seconds_checksum += published.seconds;
  bool committed = false;
  for (int number = 0; number <= options_.retries && !committed; ++number)
    EPLB_TRY(attempt(plan, given, published, current, target, number, &committed));
  if (!committed) {
    operation_ = "transfers and verification";
    const std::string kept = plan ? "kept its old placement on every rank (staging dropped, live weights and mapping "
                                    "untouched); layers committed to the new placement this round: " +
                                        layer_list(committed_)
                                  : "left the engine's weights untouched on every rank (its buffer holds no "
                                    "verified rows)";
    return error(Code::Aborted, fmt::format("layer {} aborted after {} attempt(s): {}. layer {} {}", layer_,
                                            options_.retries + 1, last_failure_, layer_, kept))
        .with_peer(no_voter_);
  }
  report_.committed = true;
  return Status::ok();
}

Status LayerRun::run(const Result<LayerPlan>& planned, const PublishedSums& published, Placement& current,
                     const Placement& target) {
  if (!planned) return planned.status().with_context(fmt::format("planning layer {}", layer_));
  const LayerPlan& plan = planned.value();
  record_plan(plan);
  const Deadlines deadlines = layer_deadlines(state_, options_, plan);
  transfer_seconds_ = deadlines.transfer_seconds;
  collective_seconds_ = deadlines.collective_seconds;
  serving_wait_seconds_ = deadlines.serving_wait_seconds;
  const auto& my_ops = plan.ranks[state_.me()].slots;
  swap_ = options_.commit == CommitMode::Swap &&
          std::any_of(my_ops.begin(), my_ops.end(), [](const SlotOp& op) { return op.action != SlotAction::Keep; });
  // Same experts in the same slots: only the replica order may differ.
  if (!report_.changed)
    return commit([&current, &target, layer = layer_] { return current.set_layer(layer, target, layer); }, -1);
  return attempts(&plan, nullptr, published, &current, &target);
}

Status LayerRun::run_exchange(const LayerTransfers& given, const PublishedSums& published, uint64_t largest_read) {
  const StoreLayout& layout = state_.store->layout();
  report_.bytes_read_here = uint64_t(given.receives.size()) * layout.bytes_per_expert(layer_);
  report_.changed = true;
  const Deadlines deadlines = derive_deadlines(options_, largest_read);
  transfer_seconds_ = deadlines.transfer_seconds;
  collective_seconds_ = deadlines.collective_seconds;
  serving_wait_seconds_ = deadlines.serving_wait_seconds;
  return attempts(nullptr, &given, published, nullptr, nullptr);
}

}  // namespace eplb::migrate
