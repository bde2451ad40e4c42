// layer_round.cpp - Migrator::migrate: the round. First every layer is
// planned and the checksums of every changed layer are published in one
// allgather; then, layer by layer: attempts (layer_attempt.cpp) each closed
// by a unanimous vote, commit or retry, abort after the last retry. Also
// the round report's sums and the after-round agreement.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb {
namespace migrate {
namespace {

constexpr std::string_view kOutcomeMagic = "EPLBOUTCOME";
constexpr uint32_t kOutcomeVersion = 1;

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

// The digests of this rank's live rows `slots` (global) of one layer: those
// the store remembers, the others computed by the plane (and remembered).
Result<std::vector<uint64_t>> live_digests(Migrator::State& state, int layer, SlotList slots) {
  ExpertStore& store = *state.store;
  const int tensors = state.tensors(layer), first = store.first_slot();
  std::vector<RowRef> missing;
  for (int slot : slots)
    for (int t = 0; t < tensors; ++t)
      if (!store.cached_checksum(layer, slot - first, t)) {
        missing.push_back({layer, slot - first, RowBuffer(store.live_buffer(layer))});
        break;
      }
  if (!missing.empty()) {
    EPLB_ASSIGN_OR_RETURN(auto computed, state.plane->digest(missing));
    for (size_t i = 0; i < missing.size(); ++i)
      for (int t = 0; t < tensors; ++t)
        store.remember_checksum(layer, missing[i].local_slot, t, computed[i * size_t(tensors) + size_t(t)]);
  }
  std::vector<uint64_t> out;
  for (int slot : slots)
    for (int t = 0; t < tensors; ++t) out.push_back(*store.cached_checksum(layer, slot - first, t));
  return out;
}

// This rank's publication for one layer: for every slot a peer reads from
// it, the expert the slot holds in `current` and the digest of its rows;
// and which of its buffers is live.
Result<std::string> my_checksums(Migrator::State& state, const LayerPlan& plan, const Placement& current) {
  SourceSums mine;
  EPLB_ASSIGN_OR_RETURN(mine.sums, live_digests(state, plan.layer, plan.slots_read_from[state.me()]));
  const auto holds = current.layer_phy2log(plan.layer);
  for (int slot : plan.slots_read_from[state.me()]) mine.experts.push_back(holds[size_t(slot)]);
  mine.live = state.store->live_buffer(plan.layer);
  return encode_sums(mine);
}

// Every rank's publication for one layer, decoded and indexed by slot.
void decode_layer_sums(const Migrator::State& state, const LayerPlan& plan, const std::vector<std::string_view>& parts,
                       PublishedSums& published) {
  const int ranks = state.topology.num_ranks, tensors = state.tensors(plan.layer);
  published.sums.resize(size_t(ranks));
  published.experts.resize(size_t(ranks));
  published.index.resize(size_t(ranks));
  published.live.assign(size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    const auto& slots = plan.slots_read_from[r];
    for (size_t i = 0; i < slots.size(); ++i) published.index[r][slots[i]] = i;
    auto decoded = decode_sums(parts[size_t(r)], slots.size(), size_t(tensors), r, plan.layer,
                               state.ranks[r].has_spare);
    if (!decoded) {
      if (published.status.is_ok()) published.status = decoded.status();
      continue;
    }
    published.sums[r] = std::move(decoded->sums);
    published.experts[r] = std::move(decoded->experts);
    published.live[r] = decoded->live;
  }
}

// The round's opening, decoded for every rank, and the check that every rank
// holds the same old and new placement (a failure-only second collective
// names the first rank, layer and slot that differ).
Result<std::vector<RoundOpening>> open_round(Migrator::State& state, const std::vector<std::string>& messages,
                                             const Placement& current, const Placement& target, Deadline deadline) {
  std::vector<RoundOpening> openings;
  for (size_t r = 0; r < messages.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(RoundOpening opening, decode_opening(messages[r], int(r), state.topology.num_layers));
    openings.push_back(std::move(opening));
  }
  if (auto differ = first_disagreement(openings))
    return with_progress(*state.plane, [&] {
      return explain_disagreement(*state.group, differ->first, differ->second, current, target, deadline);
    });
  return openings;
}

// The round's first collective, run by every rank: the placement digests,
// and the checksums of every changed layer in ONE allgather (a round runs
// changed layers + 2 collectives: this one, a vote per attempt, the
// after-round agreement). Valid because a layer's rows and live buffer
// change only in its own commit, after every rank's reads of it landed.
// Returns PublishedSums per layer ([layer]), or why the round cannot start
// (a lost rank, ranks disagreeing about the placements).
Result<std::vector<PublishedSums>> round_checksums(Migrator::State& state, const MigrateOptions& options,
                                                   const std::vector<Result<LayerPlan>>& plans,
                                                   const Placement& current, const Placement& target) {
  std::vector<PublishedSums> published(plans.size());
  std::vector<const LayerPlan*> changed;
  double seconds = 0;
  for (const auto& planned : plans) {
    if (!planned) break;  // that layer stops the round: later layers never run
    seconds = std::max(seconds, layer_deadlines(state, options, *planned).collective_seconds);
    if (moves_rows(*planned)) changed.push_back(&planned.value());
  }
  Stopwatch phase;
  std::vector<std::string> blobs;
  for (const LayerPlan* plan : changed) {
    auto blob = my_checksums(state, *plan, current);
    if (!blob) return blob.status().with_context(fmt::format("digesting the rows peers read in layer {}",
                                                            plan->layer));
    blobs.push_back(std::move(blob).value());
  }
  const std::string message = encode_opening(current, target, blobs);
  const Deadline deadline =
      Deadline::after_seconds(seconds > 0 ? seconds : derive_deadlines(options, 0).collective_seconds);
  auto gathered = with_progress(*state.plane, [&] { return state.group->allgather(message, deadline); });
  if (!gathered) return gathered.status();
  EPLB_ASSIGN_OR_RETURN(auto openings, open_round(state, *gathered, current, target, deadline));
  if (!changed.empty()) published[size_t(changed.front()->layer)].seconds = phase.seconds();
  for (size_t k = 0; k < changed.size(); ++k) {
    std::vector<std::string_view> parts;
    for (const auto& opening : openings) parts.push_back(k < opening.blobs.size() ? opening.blobs[k] : "");
    decode_layer_sums(state, *changed[k], parts, published[size_t(changed[k]->layer)]);
  }
  return published;
}

// One layer of one round on this rank.
class LayerRun {
 public:
  LayerRun(Migrator::State& state, const MigrateOptions& options, int layer, const std::vector<int>& committed,
           StepGate* gate)
      : state_(state), options_(options), layer_(layer), committed_(committed), gate_(gate) {
    report_.layer = layer;
  }
  // Ok when the layer committed or had nothing to move; otherwise the
  // Status that stops the round. `published`: this layer's share of the
  // round's checksum allgather (round_checksums), unused when the layer
  // does not change.
  Status run(const Result<LayerPlan>& planned, const PublishedSums& published, Placement& current,
             const Placement& target);
  LayerReport& report() { return report_; }
  const std::string& operation() const { return operation_; }

 private:
  void record_plan(const LayerPlan& plan);
  Status attempt(const LayerPlan& plan, const PublishedSums& published, Placement& current, const Placement& target,
                 int number, bool* committed);
  Status lost(const Status& failure, const std::string& during);
  Status stop_reason() const;
  Result<Ballots> cast_vote(const Status& outcome, bool stop);
  Status commit(std::function<Status()> switch_layer, int64_t step);
  std::function<Status()> switch_layer(const LayerPlan& plan, Placement& current, const Placement& target);

  Migrator::State& state_;
  const MigrateOptions& options_;
  const int layer_;
  const std::vector<int>& committed_;
  StepGate* const gate_;  // async rounds only
  int64_t commit_step_ = -1;
  bool swap_ = false;  // this rank commits this layer by swapping buffers
  LayerReport report_;
  double transfer_seconds_ = 0;
  double collective_seconds_ = 0;
  double serving_wait_seconds_ = 0;
  std::string last_failure_;
  int no_voter_ = -1;      // the first rank (another than this one, if any) that voted no
  std::string operation_;  // what this rank was doing when the layer stopped the round
  std::vector<std::optional<uint64_t>> staged_sums_;
  std::shared_ptr<double> commit_seconds_ = std::make_shared<double>(0.0);
};

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

// One attempt and its vote; *committed when the vote was unanimous.
Status LayerRun::attempt(const LayerPlan& plan, const PublishedSums& published, Placement& current,
                         const Placement& target, int number, bool* committed) {
  if (options_.before_attempt) options_.before_attempt(layer_, number);
  Status outcome = published.status;
  const Status stop = stop_reason();
  if (!stop.is_ok()) outcome = stop;
  else if (outcome) {
    AttemptContext context{*state_.plane, *state_.store, plan, published, state_.me(), layer_,
                           Deadline::after_seconds(transfer_seconds_), swap_, &report_, &staged_sums_};
    // [issue 31] the transfer schedule, when asked for
    Result<std::vector<std::vector<ReadRequest>>> rounds = std::vector<std::vector<ReadRequest>>{};
    if (options_.transfer_schedule) {
      rounds = scheduled_read_rounds(plan, state_.topology, *state_.store, state_.me(), *options_.transfer_schedule);
      context.read_rounds = rounds ? &*rounds : nullptr;
    }
    outcome = rounds ? run_attempt(context) : rounds.status();
  }
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
  if (vote->unanimous) {
    // Unanimous: every rank's reads of this layer have landed, so no peer
    // reads these rows any more. Staging -> live (or spare <-> live), switch
    // the mapping.
    Status switched = commit(switch_layer(plan, current, target), commit_step_);
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
  report_.seconds_checksum += published.seconds;
  bool committed = false;
  for (int number = 0; number <= options_.retries && !committed; ++number)
    EPLB_TRY(attempt(plan, published, current, target, number, &committed));
  if (!committed) {
    operation_ = "transfers and verification";
    return error(Code::Aborted,
                 fmt::format("layer {} aborted after {} attempt(s): {}. layer {} kept its old placement on every rank "
                             "(staging dropped, live weights and mapping untouched); layers committed to the new "
                             "placement this round: {}",
                             layer_, options_.retries + 1, last_failure_, layer_, layer_list(committed_)))
        .with_peer(no_voter_);
  }
  report_.committed = true;
  return Status::ok();
}

}  // namespace

RoundReport run_round(Migrator::State& state, const MigrateOptions& options, Placement& current,
                      const Placement& target, StepGate* gate) {
  RoundReport report;
  Stopwatch round;
  state.stop.clear();
  if (Status valid = current.validate_against(state.topology); !valid)
    report.status = valid.with_context("migrate: the current placement");
  else if (Status valid_target = target.validate_against(state.topology); !valid_target)
    report.status = valid_target.with_context("migrate: the target placement");
  else if (Status mode = check_commit_mode(options.commit, *state.store); !mode)
    report.status = mode;
  // Every layer is planned up front (plan_layer is pure, and a layer's
  // mapping changes only in its own commit), so that one allgather carries
  // the round's checksums.
  std::vector<Result<LayerPlan>> plans;
  std::vector<PublishedSums> published;
  if (report.status.is_ok()) {
    for (int layer = 0; layer < state.topology.num_layers; ++layer)
      plans.push_back(plan_layer(current.layer_phy2log(layer), target.layer_phy2log(layer), state.topology, layer));
    auto opened = round_checksums(state, options, plans, current, target);
    if (opened) published = std::move(opened).value();
    else {
      report.operation = "opening the round";
      report.status = Status(opened.status().code(),
                             fmt::format("migration stopped on rank {} before its first layer (opening the round: "
                                         "placement digests and checksums): {}; every layer kept its old placement "
                                         "on this rank",
                                         state.me(), opened.status().message()))
                          .with_peer(opened.status().peer());
    }
  }
  std::vector<int> committed;
  for (int layer = 0; report.status.is_ok() && layer < state.topology.num_layers; ++layer) {
    Stopwatch layer_clock;
    LayerRun run(state, options, layer, committed, gate);
    report.status = run.run(plans[size_t(layer)], published[size_t(layer)], current, target);
    if (!report.status.is_ok()) {
      report.failed_layer = layer;
      report.operation = run.operation();
    }
    LayerReport& layer_report = run.report();
    layer_report.plane = state.plane->name();
    layer_report.seconds = layer_clock.seconds();
    if (options.on_layer_done) options.on_layer_done(layer_report);
    if (layer_report.committed) committed.push_back(layer);
    report.layers.push_back(std::move(layer_report));
  }
  // A stop requested after the last vote (a callback on the last layer)
  // still fails the round on this rank; the layers stay as they committed.
  if (Status stop = state.stop.reason(); report.status.is_ok() && !stop.is_ok()) {
    report.stopped_alone = true;
    report.status = Status(stop.code(), fmt::format("rank {} stopped after the round's last vote: {}; layers "
                                                    "committed to the new placement this round: {}",
                                                    state.me(), stop.message(), layer_list(committed)));
  }
  report.seconds = round.seconds();
  return report;
}

}  // namespace migrate

RoundReport Migrator::migrate(Placement& current, const Placement& target) {
  return migrate::run_round(*state_, options_, current, target, nullptr);
}

void Migrator::stop_at_next_vote(Status why) { state_->stop.request(std::move(why)); }

namespace {
template <typename Field>
uint64_t sum_committed(const std::vector<LayerReport>& layers, Field field) {
  uint64_t sum = 0;
  for (const auto& layer : layers) sum += layer.committed ? layer.*field : 0;
  return sum;
}
}  // namespace

uint64_t RoundReport::bytes_local() const { return sum_committed(layers, &LayerReport::bytes_local); }
uint64_t RoundReport::bytes_intra_node() const { return sum_committed(layers, &LayerReport::bytes_intra_node); }
uint64_t RoundReport::bytes_inter_node() const { return sum_committed(layers, &LayerReport::bytes_inter_node); }
uint64_t RoundReport::bytes_moved() const { return bytes_local() + bytes_intra_node() + bytes_inter_node(); }
int RoundReport::retries() const {
  int sum = 0;
  for (const auto& layer : layers) sum += layer.retries;
  return sum;
}
int RoundReport::failures() const {
  return int(std::count_if(layers.begin(), layers.end(), [](const auto& layer) { return !layer.failure.empty(); }));
}
int RoundReport::layers_committed() const {
  return int(std::count_if(layers.begin(), layers.end(), [](const auto& layer) { return layer.committed; }));
}

uint64_t mapping_hash(const Placement& placement) {
  const auto& phy2log = placement.phy2log_data();
  return bytes::checksum(std::string_view(reinterpret_cast<const char*>(phy2log.data()),
                                          phy2log.size() * sizeof(int32_t)));
}

namespace {

std::string encode_outcome(const RankOutcome& outcome) {
  bytes::Writer writer;
  writer.raw(migrate::kOutcomeMagic);
  writer.u32(migrate::kOutcomeVersion);
  writer.f64(outcome.seconds);
  writer.u64(outcome.mapping_hash);
  writer.blob(outcome.check_failure);
  return writer.take();
}

Result<RankOutcome> decode_outcome(std::string_view message, int rank) {
  bytes::Reader reader(message);
  RankOutcome outcome;
  const bool header = reader.expect(migrate::kOutcomeMagic) && reader.u32() == migrate::kOutcomeVersion;
  outcome.seconds = reader.f64();
  outcome.mapping_hash = reader.u64();
  outcome.check_failure = std::string(reader.blob(1 << 20));
  if (!header || !reader.at_end() || !(outcome.seconds >= 0))
    return error(Code::Mismatch, fmt::format("rank {} sent a malformed round outcome ({} bytes, bad at byte {})",
                                             rank, message.size(), reader.position()));
  return outcome;
}

}  // namespace

Result<RoundAgreement> agree_on_round(ProcessGroup& group, const RankOutcome& mine, Deadline deadline) {
  EPLB_ASSIGN_OR_RETURN(auto gathered, group.allgather(encode_outcome(mine), deadline));
  RoundAgreement agreement;
  agreement.agreed = true;
  for (size_t r = 0; r < gathered.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(RankOutcome theirs, decode_outcome(gathered[r], int(r)));
    agreement.slowest_seconds = std::max(agreement.slowest_seconds, theirs.seconds);
    if (!agreement.agreed) continue;
    if (!theirs.check_failure.empty())
      agreement.failure = fmt::format("rank {}: {}", r, theirs.check_failure);
    else if (theirs.mapping_hash != mine.mapping_hash)
      agreement.failure = fmt::format("rank {} committed a different mapping ({:016x}) than rank {} ({:016x})", r,
                                      theirs.mapping_hash, group.rank(), mine.mapping_hash);
    agreement.agreed = agreement.failure.empty();
  }
  return agreement;
}

}  // namespace eplb
