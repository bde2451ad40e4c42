// layer_attempt.cpp - one rank's attempt at one layer, in the phases the
// protocol names: the layer's transfers posted on the data plane, local
// copies staged while they fly, wait with the deadline, verify every
// received row against its source's digest; then, after a unanimous vote,
// the commit. Every byte moves through the DataPlane (eplb/data_plane.h).
#include <fmt/format.h>

#include <algorithm>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb::migrate {
namespace {

constexpr std::string_view kSumMagic = "EPLBSUMS";
constexpr uint32_t kSumVersion = 2;

// A local copy whose source slot keeps its expert through the commit can be
// done at commit time, straight from live row to live row (one copy instead
// of live -> staging -> live). Copies from a slot that itself changes (a
// swap or cycle within the rank) go through staging.
struct CopyPlan {
  std::vector<bool> keeps;  // [local slot]: the slot's op is Keep
  bool deferred(const SlotOp& op, int first) const {
    return op.action == SlotAction::LocalCopy && !op.copy_after_read && keeps[size_t(op.source_slot - first)];
  }
  static CopyPlan of(const RankLayerPlan& plan, int first, int slots) {
    CopyPlan copies;
    copies.keeps.assign(size_t(slots), false);
    for (const auto& op : plan.slots)
      if (op.action == SlotAction::Keep) copies.keeps[size_t(op.slot - first)] = true;
    return copies;
  }
};

std::string where(const AttemptContext& context) {
  return fmt::format("layer {} on rank {}", context.layer, context.me);
}

RowBuffer live_buffer(const ExpertStore& store, int layer) { return RowBuffer(store.live_buffer(layer)); }

// Where this attempt puts a new row: staging (copy) or the spare buffer (swap).
RowRef landing(const AttemptContext& context, int local_slot) {
  const RowBuffer spare = RowBuffer(1 - context.store.live_buffer(context.layer));
  return {context.layer, local_slot, context.swap ? spare : RowBuffer::Staging};
}

RowRef live_row(const ExpertStore& store, int layer, int local_slot) {
  return {layer, local_slot, live_buffer(store, layer)};
}

std::optional<uint64_t>& staged(const AttemptContext& context, int slot, int tensor) {
  const size_t tensors = context.store.layout().layers[context.layer].size();
  return (*context.staged_sums)[size_t(slot - context.store.first_slot()) * tensors + size_t(tensor)];
}

// 1. The layer's transfers in canonical order: this rank's receives by
// (source rank, slot), and the rows other ranks read from it, by
// (destination rank, slot) (the sends of two-sided planes).
LayerTransfers layer_transfers(const AttemptContext& context) {
  if (context.given) return *context.given;
  LayerTransfers transfers;
  transfers.layer = context.layer;
  const int first = context.store.first_slot();
  for (const auto& op : context.plan->ranks[context.me].slots)
    if (op.action == SlotAction::RemoteRead)
      transfers.receives.push_back({op.source_rank, op.source_slot,
                                    context.published.live[op.source_rank] ? RowBuffer::Spare : RowBuffer::Primary,
                                    landing(context, op.slot - first), op.expert});
  std::stable_sort(transfers.receives.begin(), transfers.receives.end(),
                   [](const RowReceive& a, const RowReceive& b) { return a.source_rank < b.source_rank; });
  for (const auto& rank_plan : context.plan->ranks) {
    if (rank_plan.rank == context.me) continue;
    for (const auto& op : rank_plan.slots)
      if (op.action == SlotAction::RemoteRead && op.source_rank == context.me)
        transfers.sends.push_back({rank_plan.rank, live_row(context.store, context.layer, op.source_slot - first),
                                   op.slot, op.expert});
  }
  return transfers;
}

// 2. Local copies from rows that change in this commit, while the
// transfers fly (the others wait for the commit: CopyPlan). With swap,
// every local copy and every row that stays goes from live to spare now
// (live rows do not change before the swap); copies after a read wait for
// the read.
std::vector<RowCopy> staged_copies(const AttemptContext& context) {
  if (!context.plan) return {};
  const ExpertStore& store = context.store;
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[context.layer].size());
  const RankLayerPlan& rank_plan = context.plan->ranks[context.me];
  const CopyPlan copies = CopyPlan::of(rank_plan, first, store.slots_per_rank());
  std::vector<RowCopy> out;
  for (const auto& op : rank_plan.slots) {
    if (op.action == SlotAction::RemoteRead || op.copy_after_read) continue;
    if (!context.swap && (op.action == SlotAction::Keep || copies.deferred(op, first))) continue;
    const int from = (op.action == SlotAction::Keep ? op.slot : op.source_slot) - first;
    out.push_back({live_row(store, context.layer, from), landing(context, op.slot - first)});
    for (int t = 0; t < tensors; ++t) staged(context, op.slot, t) = store.cached_checksum(context.layer, from, t);
  }
  return out;
}

// With swap, after the reads were verified: the copies of a row this
// layer read (spare -> spare).
std::vector<RowCopy> copies_after_reads(const AttemptContext& context) {
  if (!context.plan) return {};
  const int first = context.store.first_slot();
  const int tensors = int(context.store.layout().layers[context.layer].size());
  std::vector<RowCopy> out;
  for (const auto& op : context.plan->ranks[context.me].slots) {
    if (!op.copy_after_read) continue;
    out.push_back({landing(context, op.source_slot - first), landing(context, op.slot - first)});
    for (int t = 0; t < tensors; ++t) staged(context, op.slot, t) = staged(context, op.source_slot, t);
  }
  return out;
}

// 3. Post, stage (unless `stage` is false), wait: the plane's transfers
// released however it ends.
Status post_and_wait(const AttemptContext& context, const LayerTransfers& transfers,
                     std::vector<std::optional<uint64_t>>& landed, bool stage) {
  struct Release {
    DataPlane& plane;
    ~Release() { plane.abandon(); }
  } release{context.plane};
  EPLB_TRY(context.plane.post(transfers, context.transfer_deadline).with_context(where(context)));
  if (stage) EPLB_TRY(context.plane.copy(staged_copies(context)).with_context(where(context) + ": local copies"));
  EPLB_TRY(context.plane.wait(context.transfer_deadline));
  landed = context.plane.landed_digests();
  return Status::ok();
}
Status transfer(const AttemptContext& context, const LayerTransfers& transfers,
                std::vector<std::optional<uint64_t>>& landed) {
  return post_and_wait(context, transfers, landed, true);
}
Status transfer_only(const AttemptContext& context, const LayerTransfers& transfers,
                     std::vector<std::optional<uint64_t>>& landed) {
  return post_and_wait(context, transfers, landed, false);
}

// [issue 31] The same round by round (MigrateOptions::transfer_schedule,
// one-sided planes): each round's receives are posted once this rank's
// previous round landed, or, fenced, once every rank's previous round
// landed (context.round_fence, after every round, empty ones included);
// local copies are staged with the first round that reads.
Status transfer_in_rounds(const AttemptContext& context, const LayerTransfers& transfers,
                          std::vector<std::optional<uint64_t>>& landed) {
  const size_t tensors = context.store.layout().layers[context.layer].size();
  landed.assign(transfers.receives.size() * tensors, std::nullopt);
  const int first = context.store.first_slot();
  bool staged_copies_done = false;
  for (size_t number = 0; number < context.read_rounds->size(); ++number) {
    std::vector<bool> in_round(size_t(context.store.slots_per_rank()), false);
    for (const auto& request : (*context.read_rounds)[number])
      for (const auto& run : request.runs)
        for (int i = 0; i < run.count; ++i) in_round[size_t(run.dest_slot + i - first)] = true;
    LayerTransfers part;
    part.layer = transfers.layer;
    std::vector<size_t> positions;
    for (size_t i = 0; i < transfers.receives.size(); ++i)
      if (in_round[size_t(transfers.receives[i].to.local_slot)]) {
        part.receives.push_back(transfers.receives[i]);
        positions.push_back(i);
      }
    std::vector<std::optional<uint64_t>> part_landed;
    Status round = Status::ok();
    if (!part.receives.empty()) {
      round = staged_copies_done ? transfer_only(context, part, part_landed) : transfer(context, part, part_landed);
      staged_copies_done = true;
    }
    if (context.round_fence) round = context.round_fence(round, number);
    EPLB_TRY(round);
    for (size_t k = 0; k < positions.size(); ++k)
      for (size_t t = 0; t < tensors && k * tensors + t < part_landed.size(); ++t)
        landed[positions[k] * tensors + t] = part_landed[k * tensors + t];
  }
  if (!staged_copies_done) return context.plane.copy(staged_copies(context)).with_context(where(context));
  return Status::ok();
}

// The digests of the received rows: as they landed, else computed now.
Result<std::vector<uint64_t>> received_digests(const AttemptContext& context, const LayerTransfers& transfers,
                                               const std::vector<std::optional<uint64_t>>& landed) {
  const size_t tensors = context.store.layout().layers[context.layer].size();
  std::vector<RowRef> missing;
  for (size_t i = 0; i < transfers.receives.size(); ++i)
    for (size_t t = 0; t < tensors; ++t)
      if (i * tensors + t >= landed.size() || !landed[i * tensors + t]) {
        missing.push_back(transfers.receives[i].to);
        break;
      }
  std::vector<uint64_t> computed;
  if (!missing.empty()) {
    EPLB_ASSIGN_OR_RETURN(computed, context.plane.digest(missing));
  }
  std::vector<uint64_t> out(transfers.receives.size() * tensors);
  for (size_t i = 0, next = 0; i < transfers.receives.size(); ++i) {
    const bool digested = next < missing.size() && missing[next] == transfers.receives[i].to;
    for (size_t t = 0; t < tensors; ++t)
      out[i * tensors + t] = digested ? computed[next * tensors + t] : *landed[i * tensors + t];
    if (digested) ++next;
  }
  return out;
}

// 4. Every received row against its source's published digest and expert.
Status verify(const AttemptContext& context, const LayerTransfers& transfers, const std::vector<uint64_t>& got) {
  const ExpertStore& store = context.store;
  const int tensors = int(store.layout().layers[context.layer].size());
  std::string mismatches;
  int count = 0;
  for (size_t i = 0; i < transfers.receives.size(); ++i) {
    const RowReceive& receive = transfers.receives[i];
    const auto& index = context.published.index[receive.source_rank];
    auto found = index.find(receive.source_slot);
    if (found == index.end())
      return error(Code::Internal, fmt::format("{}: no published digest for slot {} of rank {}", where(context),
                                               receive.source_slot, receive.source_rank));
    const int32_t published_expert = context.published.experts[receive.source_rank][found->second];
    if (published_expert != receive.expert)
      return error(Code::Mismatch, fmt::format("{}: rank {} published expert {} for its slot {}, but this rank reads "
                                               "expert {} from it",
                                               where(context), receive.source_rank, published_expert,
                                               receive.source_slot, receive.expert));
    const int slot = receive.to.local_slot + store.first_slot();
    for (int t = 0; t < tensors; ++t) {
      const uint64_t expected = context.published.sums[receive.source_rank][found->second * size_t(tensors) + size_t(t)];
      staged(context, slot, t) = expected;
      if (got[i * size_t(tensors) + size_t(t)] != expected && ++count <= 4)
        mismatches += fmt::format("{}expert {} read from rank {} slot {} tensor '{}' into slot {} (expected "
                                  "{:#018x}, got {:#018x})",
                                  mismatches.empty() ? "" : "; ", receive.expert, receive.source_rank,
                                  receive.source_slot, store.layout().layers[context.layer][t].name, slot, expected,
                                  got[i * size_t(tensors) + size_t(t)]);
    }
  }
  if (count == 0) return Status::ok();
  return error(Code::Mismatch, fmt::format("{}: checksum mismatch in {} received row(s) ({} digests): {}",
                                           where(context), count, context.plane.digest_kind(), mismatches));
}

}  // namespace

Status run_attempt(const AttemptContext& context) {
  context.staged_sums->assign(size_t(context.store.slots_per_rank()) *
                                  context.store.layout().layers[context.layer].size(),
                              std::nullopt);
  Stopwatch phase;
  const LayerTransfers transfers = layer_transfers(context);
  std::vector<std::optional<uint64_t>> landed;
  EPLB_TRY(context.read_rounds ? transfer_in_rounds(context, transfers, landed)
                               : transfer(context, transfers, landed));
  context.report->seconds_transfer += phase.seconds();
  phase.reset();
  auto got = received_digests(context, transfers, landed);
  Status verified = got ? verify(context, transfers, *got) : got.status();
  if (verified && context.swap) verified = context.plane.copy(copies_after_reads(context));
  context.report->seconds_verify += phase.seconds();
  return verified;
}

Status commit_layer(bool swap, DataPlane& plane, ExpertStore& store, const RankLayerPlan& rank_plan, int layer,
                    const std::vector<std::optional<uint64_t>>& staged_sums) {
  if (swap) {
    store.swap_layer(layer, staged_sums);
    return Status::ok();
  }
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[layer].size());
  const CopyPlan copies = CopyPlan::of(rank_plan, first, store.slots_per_rank());
  auto staged = [&](int slot, int t) { return staged_sums[size_t(slot - first) * size_t(tensors) + size_t(t)]; };
  struct Write {
    int slot, from;
    bool from_live;  // a deferred copy from a kept live row (else from staging)
  };
  std::vector<RowCopy> copies_to_live;
  std::vector<Write> writes;
  for (const auto& op : rank_plan.slots) {
    if (op.action == SlotAction::Keep) continue;
    const bool from_live = copies.deferred(op, first);
    const int from = op.copy_after_read || from_live ? op.source_slot : op.slot;
    copies_to_live.push_back({{layer, from - first, from_live ? live_buffer(store, layer) : RowBuffer::Staging},
                              live_row(store, layer, op.slot - first)});
    writes.push_back({op.slot, from, from_live});
  }
  EPLB_TRY(plane.commit(copies_to_live).with_context(fmt::format("committing layer {}", layer)));
  for (const Write& write : writes)
    for (int t = 0; t < tensors; ++t)
      store.remember_checksum(layer, write.slot - first, t,
                              write.from_live ? store.cached_checksum(layer, write.from - first, t)
                                              : staged(write.from, t));
  return Status::ok();
}

std::string encode_sums(const SourceSums& sums) {
  bytes::Writer writer;
  writer.raw(kSumMagic);
  writer.u32(kSumVersion);
  writer.u32(uint32_t(sums.live));
  writer.u64(sums.experts.size());
  for (int32_t expert : sums.experts) writer.i32(expert);
  writer.u64(sums.sums.size());
  for (uint64_t sum : sums.sums) writer.u64(sum);
  return writer.take();
}

Result<SourceSums> decode_sums(std::string_view message, size_t slots, size_t tensors, int rank, int layer,
                               bool has_spare) {
  bytes::Reader reader(message);
  SourceSums decoded;
  const bool header = reader.expect(kSumMagic) && reader.u32() == kSumVersion;
  const uint32_t live = reader.u32();
  bool ok = header && reader.u64() == slots && reader.ok() && reader.remaining() >= slots * sizeof(int32_t);
  for (size_t i = 0; ok && i < slots; ++i) decoded.experts.push_back(reader.i32());
  ok = ok && reader.u64() == slots * tensors && reader.remaining() == slots * tensors * sizeof(uint64_t);
  if (!ok)
    return error(Code::Mismatch, fmt::format("layer {}: checksum message from rank {} ({} bytes) does not hold the "
                                             "expected {} experts and {} checksums",
                                             layer, rank, message.size(), slots, slots * tensors));
  if (live > 1 || (live == 1 && !has_spare))
    return error(Code::Mismatch, fmt::format("layer {}: rank {} says its buffer {} is live, but its memory map has {}",
                                             layer, rank, live, has_spare ? "two buffers" : "no spare buffer"));
  decoded.live = int(live);
  decoded.sums.resize(slots * tensors);
  for (auto& sum : decoded.sums) sum = reader.u64();
  return decoded;
}

}  // namespace eplb::migrate
