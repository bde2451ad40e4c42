// layer_attempt.cpp - one rank's attempt at one layer, in the four phases
// the protocol names: post READs into staging, local copies, wait with the
// deadline, verify every received row; then, after a unanimous vote, the
// commit of staging into the live rows.
#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb::migrate {
namespace {

constexpr std::string_view kSumMagic = "EPLBSUMS";

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

struct PostedRead {
  int source_rank = 0;
  xfer::DescriptorListId local = 0;
  xfer::DescriptorListId remote = 0;
  xfer::RequestId request = 0;
  uint64_t bytes = 0;
  std::vector<int> experts;
  std::vector<const uint8_t*> landing;  // per descriptor: the row it lands in
};

// Checksums of received rows the transfer layer computed while copying them
// (UCX shared memory), by landing row; rows not in it are hashed by verify.
using LandedSums = std::unordered_map<const uint8_t*, uint64_t>;

// The READs of one attempt; released however the attempt ends.
struct PostedReads {
  xfer::Agent& agent;
  std::vector<PostedRead> reads;
  ~PostedReads() {
    for (auto& read : reads) {
      if (read.request) (void)agent.release(read.request);
      if (read.local) (void)agent.release_descriptor_list(read.local);
      if (read.remote) (void)agent.release_descriptor_list(read.remote);
    }
  }
};

struct Descriptors {
  std::vector<xfer::Descriptor> local, remote;
};

std::string where(const AttemptContext& context) {
  return fmt::format("layer {} on rank {}", context.layer, context.me);
}

// Where this attempt puts a new row: staging (copy) or the spare buffer (swap).
uint8_t* landing_row(const AttemptContext& context, int local_slot, int tensor) {
  return context.swap ? context.store.spare_row(context.layer, local_slot, tensor)
                      : context.store.staging_row(context.layer, local_slot, tensor);
}

// One descriptor per row, so that a checksum the transfer layer computes
// while copying a descriptor's bytes is one row's. The remote rows are those
// of the buffer the source published live (their stride may exceed a row).
void describe_run(const AttemptContext& context, int source_rank, const ReadRun& run, Descriptors& out,
                  PostedRead& posted) {
  const ExpertStore& store = context.store;
  const RankMap& source = context.ranks[source_rank];
  const int live = context.published.live[source_rank];
  const int first = store.first_slot();
  const int source_local = run.source_slot - int(source.first_slot);
  const int tensors = int(store.layout().layers[context.layer].size());
  for (int t = 0; t < tensors; ++t) {
    const uint64_t row_bytes = store.row_bytes(context.layer, t);
    auto [base, stride] = source_tensor(source, live, context.layer, t);
    for (int i = 0; i < run.count; ++i) {
      const uint8_t* landing = landing_row(context, run.dest_slot - first + i, t);
      posted.landing.push_back(landing);
      out.local.push_back({reinterpret_cast<uint64_t>(landing), row_bytes, 0});
      out.remote.push_back({base + uint64_t(source_local + i) * stride, row_bytes, 0});
    }
    posted.bytes += row_bytes * uint64_t(run.count);
  }
}

// Prepares and posts the READ of one request (one source rank).
Status post_read(const AttemptContext& context, const ReadRequest& request, const std::map<int, int>& slot_expert,
                 PostedReads& posted_reads) {
  const RankMap& source = context.ranks[request.source_rank];
  PostedRead& posted = posted_reads.reads.emplace_back();
  posted.source_rank = request.source_rank;
  Descriptors descriptors;
  for (const auto& run : request.runs) {
    for (int i = 0; i < run.count; ++i) {
      auto expert = slot_expert.find(run.dest_slot + i);
      posted.experts.push_back(expert == slot_expert.end() ? -1 : expert->second);
    }
    describe_run(context, request.source_rank, run, descriptors, posted);
  }
  const std::string what = fmt::format("READ of {} descriptors ({}) from rank {} (experts {})",
                                       descriptors.remote.size(), format_bytes(posted.bytes), request.source_rank,
                                       join_ints(posted.experts));
  auto fail = [&](const Status& status, const char* step) {
    return status.with_context(fmt::format("{}: {}{}", where(context), step, what));
  };
  auto local = context.agent.prepare_local(descriptors.local);
  if (!local) return fail(local.status(), "preparing ");
  posted.local = *local;
  auto remote = context.agent.prepare_remote(source.agent_name, descriptors.remote);
  if (!remote) return fail(remote.status(), "preparing ");
  posted.remote = *remote;
  auto request_id = context.agent.make_request(xfer::Operation::Read, posted.local, {}, posted.remote, {}, {},
                                              /*checksum_landed=*/true);
  if (!request_id) return fail(request_id.status(), "");
  posted.request = *request_id;
  if (Status started = context.agent.post(posted.request); !started) return fail(started, "posting ");
  return Status::ok();
}

// 1. READs into staging: one request per source rank (of one schedule round).
Status post_reads(const AttemptContext& context, std::span<const ReadRequest> requests, PostedReads& posted) {
  std::map<int, int> slot_expert;
  for (const auto& op : context.plan.ranks[context.me].slots) slot_expert[op.slot] = op.expert;
  for (const auto& request : requests) EPLB_TRY(post_read(context, request, slot_expert, posted));
  return Status::ok();
}

std::optional<uint64_t>& staged(const AttemptContext& context, int slot, int tensor) {
  const size_t tensors = context.store.layout().layers[context.layer].size();
  return (*context.staged_sums)[size_t(slot - context.store.first_slot()) * tensors + size_t(tensor)];
}

// 2. Local copies from rows that change in this commit, while the READs
// fly (the others wait for the commit: CopyPlan). With swap, every local
// copy and every row that stays goes from live to spare now (live rows do
// not change before the swap); copies after a read wait for the read.
void copy_locally(const AttemptContext& context) {
  ExpertStore& store = context.store;
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[context.layer].size());
  const RankLayerPlan& rank_plan = context.plan.ranks[context.me];
  const CopyPlan copies = CopyPlan::of(rank_plan, first, store.slots_per_rank());
  for (const auto& op : rank_plan.slots) {
    if (op.action == SlotAction::RemoteRead || op.copy_after_read) continue;
    if (!context.swap && (op.action == SlotAction::Keep || copies.deferred(op, first))) continue;
    const int from = (op.action == SlotAction::Keep ? op.slot : op.source_slot) - first;
    for (int t = 0; t < tensors; ++t) {
      std::memcpy(landing_row(context, op.slot - first, t), store.row(context.layer, from, t),
                  store.row_bytes(context.layer, t));
      staged(context, op.slot, t) = store.cached_checksum(context.layer, from, t);
    }
  }
}

// With swap, after the reads were verified: the copies of a row this
// layer read (spare -> spare).
void copy_after_reads(const AttemptContext& context) {
  ExpertStore& store = context.store;
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[context.layer].size());
  for (const auto& op : context.plan.ranks[context.me].slots) {
    if (!op.copy_after_read) continue;
    for (int t = 0; t < tensors; ++t) {
      std::memcpy(store.spare_row(context.layer, op.slot - first, t),
                  store.spare_row(context.layer, op.source_slot - first, t), store.row_bytes(context.layer, t));
      staged(context, op.slot, t) = staged(context, op.source_slot, t);
    }
  }
}

// 3. Wait, with the deadline; a failure names every request that did not
// finish, with its peer and experts.
Status wait_reads(const AttemptContext& context, const PostedReads& posted) {
  if (posted.reads.empty()) return Status::ok();
  std::vector<xfer::RequestId> ids;
  for (const auto& read : posted.reads) ids.push_back(read.request);
  Status waited = context.agent.wait(ids, context.transfer_deadline);
  if (waited) return waited;
  std::string detail;
  for (const auto& read : posted.reads) {
    auto state = context.agent.status(read.request);
    if (state.state == xfer::RequestState::Done) continue;
    detail += fmt::format("{}READ from rank {} of experts {} ({}): {}", detail.empty() ? "" : "; ", read.source_rank,
                          join_ints(read.experts), format_bytes(read.bytes),
                          state.state == xfer::RequestState::Failed ? state.failure.to_string()
                                                                    : "still in progress at the deadline");
  }
  return Status(waited.code(), fmt::format("{}: {}", where(context), detail.empty() ? waited.to_string() : detail));
}

// The checksums the transfer layer computed while the READs landed.
LandedSums landed_sums(const AttemptContext& context, const PostedReads& posted) {
  LandedSums sums;
  for (const auto& read : posted.reads) {
    auto landed = context.agent.landed_checksums(read.request);
    if (!landed || landed->size() != read.landing.size()) continue;  // verify hashes these rows itself
    for (size_t i = 0; i < read.landing.size(); ++i)
      if ((*landed)[i]) sums.emplace(read.landing[i], *(*landed)[i]);
  }
  return sums;
}

// 4. Verify every received row against its source's checksum (computed while
// it landed, or hashed here).
Status verify_reads(const AttemptContext& context, const LandedSums& landed) {
  const ExpertStore& store = context.store;
  const int layer = context.layer, first = store.first_slot();
  const int tensors = int(store.layout().layers[layer].size());
  std::string mismatches;
  int mismatch_count = 0;
  for (const auto& op : context.plan.ranks[context.me].slots) {
    if (op.action != SlotAction::RemoteRead) continue;
    const auto& index = context.published.index[op.source_rank];
    auto found = index.find(op.source_slot);
    if (found == index.end())
      return error(Code::Internal, fmt::format("{}: no published checksum for slot {} of rank {}", where(context),
                                               op.source_slot, op.source_rank));
    for (int t = 0; t < tensors; ++t) {
      const uint64_t expected = context.published.sums[op.source_rank][found->second * size_t(tensors) + size_t(t)];
      const uint8_t* row = landing_row(context, op.slot - first, t);
      auto known = landed.find(row);
      const uint64_t got = known != landed.end() ? known->second
                                                 : bytes::checksum(std::span<const uint8_t>(row, store.row_bytes(layer, t)));
      staged(context, op.slot, t) = expected;
      if (got != expected && ++mismatch_count <= 4)
        mismatches += fmt::format("{}expert {} read from rank {} slot {} tensor '{}' into slot {} (expected "
                                  "{:#018x}, got {:#018x})",
                                  mismatches.empty() ? "" : "; ", op.expert, op.source_rank, op.source_slot,
                                  store.layout().layers[layer][t].name, op.slot, expected, got);
    }
  }
  if (mismatch_count == 0) return Status::ok();
  return error(Code::Mismatch, fmt::format("{}: checksum mismatch in {} received row(s): {}", where(context),
                                           mismatch_count, mismatches));
}

}  // namespace

Status run_attempt(const AttemptContext& context) {
  context.staged_sums->assign(size_t(context.store.slots_per_rank()) *
                                  context.store.layout().layers[context.layer].size(),
                              std::nullopt);
  Stopwatch phase;
  LandedSums landed;
  {
    PostedReads posted{context.agent, {}};
    if (!context.read_rounds) {
      EPLB_TRY(post_reads(context, context.plan.ranks[context.me].reads, posted));
      copy_locally(context);
      EPLB_TRY(wait_reads(context, posted));
    } else {  // [issue 31] round by round, each after this rank's previous one landed
      for (size_t round = 0; round < context.read_rounds->size(); ++round) {
        EPLB_TRY(post_reads(context, (*context.read_rounds)[round], posted));
        if (round == 0) copy_locally(context);
        EPLB_TRY(wait_reads(context, posted));
      }
      if (context.read_rounds->empty()) copy_locally(context);
    }
    landed = landed_sums(context, posted);
  }
  context.report->seconds_transfer += phase.seconds();
  phase.reset();
  Status verified = verify_reads(context, landed);
  if (verified && context.swap) copy_after_reads(context);
  context.report->seconds_verify += phase.seconds();
  return verified;
}

void commit_layer(bool swap, ExpertStore& store, const RankLayerPlan& rank_plan, int layer,
                  const std::vector<std::optional<uint64_t>>& staged_sums) {
  if (swap) return store.swap_layer(layer, staged_sums);
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[layer].size());
  const CopyPlan copies = CopyPlan::of(rank_plan, first, store.slots_per_rank());
  auto staged = [&](int slot, int t) { return staged_sums[size_t(slot - first) * size_t(tensors) + size_t(t)]; };
  for (const auto& op : rank_plan.slots) {
    if (op.action == SlotAction::Keep) continue;
    const bool from_live = copies.deferred(op, first);
    const int from = op.copy_after_read || from_live ? op.source_slot : op.slot;
    for (int t = 0; t < tensors; ++t) {
      const uint8_t* source = from_live ? store.row(layer, from - first, t) : store.staging_row(layer, from - first, t);
      std::memcpy(store.row(layer, op.slot - first, t), source, store.row_bytes(layer, t));
      store.remember_checksum(layer, op.slot - first, t,
                              from_live ? store.cached_checksum(layer, from - first, t) : staged(from, t));
    }
  }
}

std::string encode_sums(const std::vector<uint64_t>& sums, int live_buffer) {
  bytes::Writer writer;
  writer.raw(kSumMagic);
  writer.u32(uint32_t(live_buffer));
  writer.u64(sums.size());
  for (uint64_t sum : sums) writer.u64(sum);
  return writer.take();
}

Result<std::pair<std::vector<uint64_t>, int>> decode_sums(std::string_view message, size_t expected_count, int rank,
                                                          int layer, bool has_spare) {
  bytes::Reader reader(message);
  const bool magic = reader.expect(kSumMagic);
  const uint32_t live = reader.u32();
  const bool ok = magic && reader.u64() == expected_count && reader.ok() &&
                  reader.remaining() == expected_count * sizeof(uint64_t);
  if (!ok)
    return error(Code::Mismatch, fmt::format("layer {}: checksum message from rank {} ({} bytes) does not hold the "
                                             "expected {} checksums",
                                             layer, rank, message.size(), expected_count));
  if (live > 1 || (live == 1 && !has_spare))
    return error(Code::Mismatch, fmt::format("layer {}: rank {} says its buffer {} is live, but its memory map has {}",
                                             layer, rank, live, has_spare ? "two buffers" : "no spare buffer"));
  std::vector<uint64_t> sums(expected_count);
  for (auto& sum : sums) sum = reader.u64();
  return std::make_pair(std::move(sums), int(live));
}

}  // namespace eplb::migrate
