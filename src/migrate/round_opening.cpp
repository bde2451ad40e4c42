// round_opening.cpp - the round's first collective: every rank's digest of
// its old and new placement (per layer), and the checksums of every changed
// layer's published rows. Ranks that disagree about either placement stop
// the round before any byte moves, naming the first rank, layer and slot
// that differ (a second, failure-only exchange of that layer's rows).
#include <fmt/format.h>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb::migrate {
namespace {

constexpr std::string_view kOpeningMagic = "EPLBROUND";
constexpr uint32_t kOpeningVersion = 1;
constexpr std::string_view kRowsMagic = "EPLBPLACEROWS";
constexpr uint32_t kMaxBlobs = 1u << 16;

uint64_t row_digest(std::span<const int32_t> row) {
  return bytes::checksum(std::string_view(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(int32_t)));
}

// The first slot where two placements of one layer differ, or -1.
int first_difference(std::span<const int32_t> mine, std::span<const int32_t> theirs) {
  for (size_t s = 0; s < mine.size() && s < theirs.size(); ++s)
    if (mine[s] != theirs[s]) return int(s);
  return mine.size() == theirs.size() ? -1 : int(std::min(mine.size(), theirs.size()));
}

std::string encode_rows(int layer, const Placement& current, const Placement& target) {
  bytes::Writer writer;
  writer.raw(kRowsMagic);
  writer.u32(uint32_t(layer));
  for (const Placement* placement : {&current, &target}) {
    auto row = placement->layer_phy2log(layer);
    writer.u32(uint32_t(row.size()));
    for (int32_t expert : row) writer.i32(expert);
  }
  return writer.take();
}

// A rank's rows of the differing layer: [0] old, [1] new.
Result<std::array<std::vector<int32_t>, 2>> decode_rows(std::string_view message, int layer, size_t slots, int rank) {
  bytes::Reader reader(message);
  std::array<std::vector<int32_t>, 2> rows;
  bool ok = reader.expect(kRowsMagic) && reader.u32() == uint32_t(layer);
  for (auto& row : rows) {
    const uint32_t count = reader.u32();
    ok = ok && reader.ok() && count == slots;
    for (uint32_t s = 0; ok && s < count; ++s) row.push_back(reader.i32());
  }
  if (!ok || !reader.at_end())
    return error(Code::Mismatch, fmt::format("rank {} sent a malformed placement row of layer {} ({} bytes)", rank,
                                             layer, message.size()));
  return rows;
}

}  // namespace

std::string encode_opening(const Placement& current, const Placement& target, const std::vector<std::string>& blobs) {
  bytes::Writer writer;
  writer.raw(kOpeningMagic);
  writer.u32(kOpeningVersion);
  writer.u32(uint32_t(current.num_layers()));
  for (int l = 0; l < current.num_layers(); ++l) {
    writer.u64(row_digest(current.layer_phy2log(l)));
    writer.u64(row_digest(target.layer_phy2log(l)));
  }
  writer.u32(uint32_t(blobs.size()));
  for (const auto& blob : blobs) writer.blob(blob);
  return writer.take();
}

Result<RoundOpening> decode_opening(std::string_view message, int rank, int num_layers) {
  bytes::Reader reader(message);
  RoundOpening opening;
  bool ok = reader.expect(kOpeningMagic) && reader.u32() == kOpeningVersion && reader.u32() == uint32_t(num_layers);
  for (int l = 0; ok && l < num_layers; ++l) {
    const uint64_t old_digest = reader.u64(), new_digest = reader.u64();
    opening.digests.emplace_back(old_digest, new_digest);
  }
  const uint32_t blobs = reader.u32();
  ok = ok && reader.ok() && blobs <= kMaxBlobs;
  for (uint32_t k = 0; ok && k < blobs; ++k) {
    opening.blobs.push_back(reader.blob(message.size()));
    ok = reader.ok();
  }
  if (!ok || !reader.at_end())
    return error(Code::Mismatch, fmt::format("rank {} opened the round with a malformed message ({} bytes, bad at "
                                             "byte {})",
                                             rank, message.size(), reader.position()));
  return opening;
}

// The first (rank, layer) whose digests differ from rank 0's, or nullopt.
std::optional<std::pair<int, int>> first_disagreement(const std::vector<RoundOpening>& openings) {
  for (size_t r = 1; r < openings.size(); ++r)
    for (size_t l = 0; l < openings[0].digests.size(); ++l)
      if (openings[r].digests[l] != openings[0].digests[l]) return std::make_pair(int(r), int(l));
  return std::nullopt;
}

Status explain_disagreement(ProcessGroup& group, int rank, int layer, const Placement& current,
                            const Placement& target, Deadline deadline) {
  auto gathered = group.allgather(encode_rows(layer, current, target), deadline);
  if (!gathered) return gathered.status().with_context("exchanging the placement rows the ranks disagree on");
  const size_t slots = current.layer_phy2log(layer).size();
  EPLB_ASSIGN_OR_RETURN(auto reference, decode_rows((*gathered)[0], layer, slots, 0));
  EPLB_ASSIGN_OR_RETURN(auto theirs, decode_rows((*gathered)[size_t(rank)], layer, slots, rank));
  for (int which = 0; which < 2; ++which) {
    const int slot = first_difference(reference[which], theirs[which]);
    if (slot < 0) continue;
    return error(Code::Mismatch,
                 fmt::format("the ranks disagree about the {} placement: rank {} has expert {} in layer {} slot {}, "
                             "rank 0 has expert {}; every rank must pass the same old and new placement (a rank "
                             "with a stale view of the placement in force?). Nothing was moved; every layer keeps "
                             "its old placement on every rank",
                             which == 0 ? "old" : "new", rank, theirs[which][size_t(slot)], layer, slot,
                             reference[which][size_t(slot)]))
        .with_peer(rank);
  }
  return error(Code::Mismatch, fmt::format("the ranks disagree about layer {}'s placements (rank {}'s digest differs "
                                           "from rank 0's, their rows do not); nothing was moved",
                                           layer, rank));
}

}  // namespace eplb::migrate
