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

// The transfer deadline scales with what a rank reads; collectives wait for
// the slowest rank's transfers plus a margin. Every rank computes the same
// plan, so the largest read is known everywhere.
struct LayerDeadlines {
  double transfer_seconds = 0, collective_seconds = 0;
};
LayerDeadlines layer_deadlines(const Migrator::State& state, const MigrateOptions& options, const LayerPlan& plan) {
  const uint64_t expert_bytes = state.store->layout().bytes_per_expert(plan.layer);
  uint64_t largest_read = 0;
  for (const auto& rank_plan : plan.ranks) {
    uint64_t bytes = 0;
    for (const auto& request : rank_plan.reads) bytes += uint64_t(request.slots()) * expert_bytes;
    largest_read = std::max(largest_read, bytes);
  }
  LayerDeadlines deadlines;
  deadlines.transfer_seconds =
      options.timeout_seconds > 0 ? options.timeout_seconds : 5.0 + double(largest_read) / double(256ull << 20);
  deadlines.collective_seconds = options.collective_timeout_seconds > 0 ? options.collective_timeout_seconds
                                                                         : deadlines.transfer_seconds + 10.0;
  return deadlines;
}

// Whether a layer moves any row (otherwise only its replica order may change).
bool moves_rows(const LayerPlan& plan) {
  return plan.stats.slots_local_copy + plan.stats.slots_read_intra_node + plan.stats.slots_read_inter_node > 0;
}

// This rank's publication for one layer: the checksum of every row a peer
// reads from it (remembered by the store when known, computed otherwise)
// and which of its buffers is live.
std::string my_checksums(Migrator::State& state, const LayerPlan& plan) {
  const int layer = plan.layer, tensors = state.tensors(layer);
  ExpertStore& store = *state.store;
  std::vector<uint64_t> mine;
  mine.reserve(plan.slots_read_from[state.me()].size() * size_t(tensors));
  for (int slot : plan.slots_read_from[state.me()])
    for (int t = 0; t < tensors; ++t) mine.push_back(store.known_checksum(layer, slot - store.first_slot(), t));
  return encode_sums(mine, store.live_buffer(layer));
}

// Every rank's publication for one layer, decoded and indexed by slot.
void decode_layer_sums(const Migrator::State& state, const LayerPlan& plan, const std::vector<std::string_view>& parts,
                       PublishedSums& published) {
  const int ranks = state.topology.num_ranks, tensors = state.tensors(plan.layer);
  published.sums.resize(size_t(ranks));
  published.index.resize(size_t(ranks));
  published.live.assign(size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    const auto& slots = plan.slots_read_from[r];
    for (size_t i = 0; i < slots.size(); ++i) published.index[r][slots[i]] = i;
    auto decoded = decode_sums(parts[size_t(r)], slots.size() * size_t(tensors), r, plan.layer,
                               !state.ranks[r].spare_tensors.empty());
    if (decoded) std::tie(published.sums[r], published.live[r]) = std::move(decoded).value();
    else if (published.status.is_ok()) published.status = decoded.status();
  }
}

// Splits each rank's round message into its per-layer parts (one blob per
// changed layer, in layer order); a malformed message leaves that rank's
// parts empty, which decode_sums then refuses (Mismatch naming the rank).
std::vector<std::vector<std::string_view>> split_round_messages(const std::vector<std::string>& messages,
                                                                size_t layers) {
  std::vector<std::vector<std::string_view>> parts(layers, std::vector<std::string_view>(messages.size()));
  for (size_t r = 0; r < messages.size(); ++r) {
    bytes::Reader reader(messages[r]);
    std::vector<std::string_view> mine;
    for (size_t k = 0; k < layers && reader.ok(); ++k) mine.push_back(reader.blob(messages[r].size()));
    if (!reader.ok() || reader.remaining() != 0) continue;
    for (size_t k = 0; k < layers; ++k) parts[k][r] = mine[k];
  }
  return parts;
}

// Sources publish the checksums of every changed layer of the round in ONE
// allgather at its start (a round runs changed layers + 2 collectives: this
// one, a vote per attempt, the after-round agreement). Valid because a
// layer's rows and live buffer change only in its own commit, after every
// rank's reads of it landed. Returns PublishedSums per layer ([layer]).
std::vector<PublishedSums> round_checksums(Migrator::State& state, const MigrateOptions& options,
                                           const std::vector<Result<LayerPlan>>& plans) {
  std::vector<PublishedSums> published(plans.size());
  std::vector<const LayerPlan*> changed;
  double seconds = 0;
  for (const auto& planned : plans) {
    if (!planned) break;  // that layer stops the round: later layers never run
    if (!moves_rows(*planned)) continue;
    changed.push_back(&planned.value());
    seconds = std::max(seconds, layer_deadlines(state, options, *planned).collective_seconds);
  }
  if (changed.empty()) return published;
  Stopwatch phase;
  bytes::Writer writer;
  for (const LayerPlan* plan : changed) writer.blob(my_checksums(state, *plan));
  const std::string message = writer.take();
  auto gathered = with_progress(*state.agent, [&] {
    return state.group->allgather(message, Deadline::after_seconds(seconds));
  });
  PublishedSums& first = published[size_t(changed.front()->layer)];
  first.seconds = phase.seconds();
  if (!gathered) {
    first.lost = gathered.status();
    return published;
  }
  const auto parts = split_round_messages(gathered.value(), changed.size());
  for (size_t k = 0; k < changed.size(); ++k)
    decode_layer_sums(state, *changed[k], parts[k], published[size_t(changed[k]->layer)]);
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

 private:
  void record_plan(const LayerPlan& plan);
  Status attempt(const LayerPlan& plan, const PublishedSums& published, Placement& current, const Placement& target,
                 int number, bool* committed);
  Status lost(const Status& failure, const std::string& during);
  Result<bool> cast_vote(const Status& outcome, std::vector<std::string>* reasons);
  Status commit(std::function<Status()> switch_layer, int64_t step);

  Migrator::State& state_;
  const MigrateOptions& options_;
  const int layer_;
  const std::vector<int>& committed_;
  StepGate* const gate_;  // async rounds only
  int64_t commit_step_ = -1;
  int abort_rank_ = -1;
  bool swap_ = false;  // this rank commits this layer by swapping buffers
  LayerReport report_;
  double transfer_seconds_ = 0;
  double collective_seconds_ = 0;
  std::string last_failure_;
  std::vector<std::optional<uint64_t>> staged_sums_;
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
  return Status(failure.code(),
                fmt::format("migration stopped on rank {} at layer {} ({}): {}; layer {} kept its old placement on "
                            "this rank (live weights and mapping untouched); layers committed to the new placement "
                            "this round: {}",
                            state_.me(), layer_, during, failure.message(), layer_, layer_list(committed_)));
}

// The sync vote, or (async) the vote that also fixes the commit step.
Result<bool> LayerRun::cast_vote(const Status& outcome, std::vector<std::string>* reasons) {
  const std::string my_reason = outcome.is_ok() ? std::string() : outcome.to_string();
  return with_progress(*state_.agent, [&]() -> Result<bool> {
    if (gate_)
      return stepped_vote(*state_.group, *gate_, outcome.is_ok(), my_reason, collective_seconds_, reasons,
                          &commit_step_, &abort_rank_);
    return state_.group->vote(outcome.is_ok(), my_reason, Deadline::after_seconds(collective_seconds_), reasons);
  });
}

// Runs `switch_layer` now (sync) or hands it to the serving thread for
// serving step `step` (async) and waits for it.
Status LayerRun::commit(std::function<Status()> switch_layer, int64_t step) {
  if (!gate_) return switch_layer();
  return gate_->commit_at(layer_, step, std::move(switch_layer), Deadline::after_seconds(collective_seconds_));
}

// One attempt and its vote; *committed when the vote was unanimous.
Status LayerRun::attempt(const LayerPlan& plan, const PublishedSums& published, Placement& current,
                         const Placement& target, int number, bool* committed) {
  if (options_.before_attempt) options_.before_attempt(layer_, number);
  Status outcome = published.status;
  if (gate_ && gate_->abort_requested())
    outcome = error(Code::Aborted, fmt::format("rank {} asked to abort the async round", state_.me()));
  else if (outcome) {
    AttemptContext context{*state_.agent, *state_.store, state_.ranks, plan, published, state_.me(), layer_,
                           Deadline::after_seconds(transfer_seconds_), swap_, &report_, &staged_sums_};
    // [issue 31] the transfer schedule, when asked for
    Result<std::vector<std::vector<ReadRequest>>> rounds = std::vector<std::vector<ReadRequest>>{};
    if (options_.transfer_schedule) {
      rounds = scheduled_read_rounds(plan, state_.topology, *state_.store, state_.me(), *options_.transfer_schedule);
      context.read_rounds = rounds ? &*rounds : nullptr;
    }
    outcome = rounds ? run_attempt(context) : rounds.status();
  }
  std::vector<std::string> reasons;
  Stopwatch phase;
  auto vote = cast_vote(outcome, &reasons);
  report_.seconds_vote += phase.seconds();
  if (!vote) return lost(vote.status(), fmt::format("voting on attempt {}", number + 1));
  if (abort_rank_ >= 0)
    return lost(error(Code::Aborted, fmt::format("rank {} asked to abort the round", abort_rank_)),
                fmt::format("voting on attempt {}", number + 1));
  if (*vote) {
    // Unanimous: every rank's reads of this layer have landed, so no peer
    // reads these rows any more. Staging -> live (or spare <-> live), switch
    // the mapping.
    Status switched = commit([&] {
      Stopwatch commit_clock;
      commit_layer(swap_, *state_.store, plan.ranks[state_.me()], layer_, staged_sums_);
      report_.seconds_commit += commit_clock.seconds();
      return current.set_layer(layer_, target, layer_);
    }, commit_step_);
    if (!switched) return lost(switched, "committing");
    *committed = true;
    return Status::ok();
  }
  last_failure_.clear();
  for (size_t r = 0; r < reasons.size(); ++r) {
    if (reasons[r].empty()) continue;
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
  const LayerDeadlines deadlines = layer_deadlines(state_, options_, plan);
  transfer_seconds_ = deadlines.transfer_seconds;
  collective_seconds_ = deadlines.collective_seconds;
  const auto& my_ops = plan.ranks[state_.me()].slots;
  swap_ = options_.commit == CommitMode::Swap &&
          std::any_of(my_ops.begin(), my_ops.end(), [](const SlotOp& op) { return op.action != SlotAction::Keep; });
  // Same experts in the same slots: only the replica order may differ.
  if (!report_.changed) return commit([&] { return current.set_layer(layer_, target, layer_); }, -1);
  report_.seconds_checksum += published.seconds;
  if (!published.lost.is_ok()) return lost(published.lost, "publishing checksums");
  bool committed = false;
  for (int number = 0; number <= options_.retries && !committed; ++number)
    EPLB_TRY(attempt(plan, published, current, target, number, &committed));
  if (!committed)
    return error(Code::Aborted,
                 fmt::format("layer {} aborted after {} attempt(s): {}. layer {} kept its old placement on every rank "
                             "(staging dropped, live weights and mapping untouched); layers committed to the new "
                             "placement this round: {}",
                             layer_, options_.retries + 1, last_failure_, layer_, layer_list(committed_)));
  report_.committed = true;
  return Status::ok();
}

}  // namespace

RoundReport run_round(Migrator::State& state, const MigrateOptions& options, Placement& current,
                      const Placement& target, StepGate* gate) {
  RoundReport report;
  Stopwatch round;
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
    published = round_checksums(state, options, plans);
  }
  std::vector<int> committed;
  for (int layer = 0; report.status.is_ok() && layer < state.topology.num_layers; ++layer) {
    Stopwatch layer_clock;
    LayerRun run(state, options, layer, committed, gate);
    report.status = run.run(plans[size_t(layer)], published[size_t(layer)], current, target);
    LayerReport& layer_report = run.report();
    layer_report.seconds = layer_clock.seconds();
    if (options.on_layer_done) options.on_layer_done(layer_report);
    if (layer_report.committed) committed.push_back(layer);
    report.layers.push_back(std::move(layer_report));
  }
  report.seconds = round.seconds();
  return report;
}

}  // namespace migrate

RoundReport Migrator::migrate(Placement& current, const Placement& target) {
  return migrate::run_round(*state_, options_, current, target, nullptr);
}

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
