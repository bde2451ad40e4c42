// layer_round.cpp - Migrator::migrate: the round. First every layer is
// planned and the checksums of every changed layer are published in one
// allgather; then, layer by layer: attempts (layer_attempt.cpp) each closed
// by a unanimous vote, commit or retry, abort after the last retry. Also
// the round report's sums and the after-round agreement.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "common/bytes.h"
#include "layer_run.h"

namespace eplb {
namespace migrate {
namespace {

constexpr std::string_view kOutcomeMagic = "EPLBOUTCOME";
constexpr uint32_t kOutcomeVersion = 1;

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
