// migrator.cpp - Migrator::create: register the store, exchange memory maps
// and transfer metadata with every rank, check that layouts agree. The
// per-layer protocol is in layer_round.cpp and layer_attempt.cpp.
#include <fmt/format.h>

#include "common/bytes.h"
#include "migrator_state.h"

namespace eplb {
namespace migrate {
namespace {

constexpr std::string_view kMapMagic = "EPLBMEMMAP";
constexpr uint32_t kMapVersion = 4;

}  // namespace

std::string encode_map(const RankMap& map) {
  bytes::Writer writer;
  writer.raw(kMapMagic);
  writer.u32(kMapVersion);
  writer.blob(map.setup_error);
  writer.blob(map.layout);
  writer.u32(map.first_slot);
  writer.u32(map.has_spare ? 1 : 0);
  writer.blob(map.plane);
  writer.blob(map.digest_kind);
  writer.blob(map.transfer_schedule);
  writer.blob(map.plane_blob);
  return writer.take();
}

Result<RankMap> decode_map(std::string_view message, int rank) {
  bytes::Reader reader(message);
  auto bad = [&](std::string_view what) {
    return error(Code::Mismatch, fmt::format("set-up message from rank {} ({} bytes) is malformed at byte {}: {}",
                                             rank, message.size(), reader.position(), what));
  };
  if (!reader.expect(kMapMagic)) return bad("bad magic");
  uint32_t version = reader.u32();
  if (!reader.ok()) return bad("truncated");
  if (version != kMapVersion) return bad(fmt::format("version {}", version));
  RankMap map;
  map.setup_error = std::string(reader.blob(1 << 16));
  map.layout = std::string(reader.blob(1 << 24));
  map.first_slot = reader.u32();
  const uint32_t spare = reader.u32();
  map.plane = std::string(reader.blob(64));
  map.digest_kind = std::string(reader.blob(64));
  map.transfer_schedule = std::string(reader.blob(64));
  map.plane_blob = std::string(reader.blob(1 << 27));
  if (!reader.at_end() || spare > 1) return bad("truncated, oversized or trailing bytes");
  map.has_spare = spare == 1;
  return map;
}

Status check_commit_mode(CommitMode mode, const ExpertStore& store) {
  if (mode != CommitMode::Swap || store.has_spare()) return Status::ok();
  return error(Code::InvalidArgument,
               "migrate: the swap commit needs a spare buffer per layer (ExpertStore::create_arena with "
               "spare_buffers, or adopt with the engine's spare buffers); this store has none: use the copy commit");
}

std::string join_ints(const std::vector<int>& values, size_t limit) {
  std::string text = fmt::format("{}", fmt::join(values.begin(), values.begin() + std::min(limit, values.size()), ","));
  if (values.size() > limit) text += fmt::format(",... ({} in all)", values.size());
  return text;
}

namespace {

// This rank's checks and its plane's set-up, filling `mine`.
Status set_up_locally(Migrator::State& state, RankMap& mine) {
  const Topology& topology = state.topology;
  const ExpertStore& store = *state.store;
  const int me = state.me();
  EPLB_TRY(topology.validate());
  if (state.group->size() != topology.num_ranks)
    return error(Code::InvalidArgument, fmt::format("the process group has {} ranks, the topology {}",
                                                    state.group->size(), topology.num_ranks));
  if (store.slots_per_rank() != topology.slots_per_rank() || store.layout().num_layers() != topology.num_layers)
    return error(Code::InvalidArgument, fmt::format("the expert store ({}) does not match the topology ({})",
                                                    store.layout().to_string(), topology.to_string()));
  if (store.first_slot() != me * topology.slots_per_rank())
    return error(Code::InvalidArgument, fmt::format("the expert store starts at slot {}, rank {} owns slots from {}",
                                                    store.first_slot(), me, me * topology.slots_per_rank()));
  EPLB_TRY(check_commit_mode(state.options->commit, store));
  if (state.options->transfer_schedule && !state.plane->one_sided())
    return error(Code::InvalidArgument, fmt::format("the transfer schedule posts a layer's reads round by round, "
                                                    "which needs a one-sided data plane; '{}' pairs sends and "
                                                    "receives",
                                                    state.plane->name()));
  EPLB_ASSIGN_OR_RETURN(mine.plane_blob, state.plane->describe());
  return Status::ok();
}

// Every rank's set-up: the same layout, the same data plane and digest kind
// (a rank digesting rows another way would fail every verification), a
// slot range that is its own; then the plane connects to its peers.
Status adopt_maps(Migrator::State& state, const std::vector<std::string>& gathered) {
  std::vector<std::string> layouts, blobs;
  for (int r = 0; r < state.group->size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(RankMap map, decode_map(gathered[r], r));
    if (!map.setup_error.empty())
      return error(Code::Aborted, fmt::format("rank {} failed to set up: {}", r, map.setup_error)).with_peer(r);
    layouts.push_back(map.layout);
    blobs.push_back(std::move(map.plane_blob));
    state.ranks.push_back(std::move(map));
  }
  EPLB_TRY(check_layouts_agree(layouts));
  const RankMap& first = state.ranks[0];
  for (int r = 0; r < state.group->size(); ++r) {
    const RankMap& map = state.ranks[r];
    if (map.plane != first.plane || map.digest_kind != first.digest_kind)
      return error(Code::Mismatch, fmt::format("rank {} moves rows with data plane '{}' ({} digests), rank 0 with "
                                               "'{}' ({} digests): every rank must use the same plane",
                                               r, map.plane, map.digest_kind, first.plane, first.digest_kind));
    if (map.transfer_schedule != first.transfer_schedule)  // [issue 31] fenced rounds are collective
      return error(Code::Mismatch, fmt::format("rank {} orders its READs with transfer schedule '{}', rank 0 with "
                                               "'{}': every rank must use the same",
                                               r, map.transfer_schedule, first.transfer_schedule))
          .with_peer(r);
    if (map.first_slot != uint32_t(r * state.topology.slots_per_rank()))
      return error(Code::Mismatch, fmt::format("rank {} says its slots start at {}, expected {}", r, map.first_slot,
                                               r * state.topology.slots_per_rank()));
  }
  return state.plane->connect(blobs, state.me()).with_context("connecting the data plane");
}

}  // namespace
}  // namespace migrate

std::string_view commit_mode_name(CommitMode mode) { return mode == CommitMode::Swap ? "swap" : "copy"; }

Migrator::~Migrator() = default;

Status Migrator::set_num_experts(int num_experts) {
  Topology changed = state_->topology;
  changed.num_experts = num_experts;
  EPLB_TRY(changed.validate().with_context("migrate: setting the number of logical experts"));
  state_->topology = changed;
  return Status::ok();
}

Result<std::unique_ptr<Migrator>> Migrator::create(ProcessGroup& group, xfer::Agent& agent, ExpertStore& store,
                                                   const Topology& topology, MigrateOptions options,
                                                   Deadline deadline) {
  std::unique_ptr<DataPlane> plane = make_ucx_plane(agent, store);
  DataPlane& borrowed = *plane;
  auto created = create(group, borrowed, store, topology, std::move(options), deadline);
  if (created) (*created)->state_->owned_plane = std::move(plane);
  return created;
}

Status Migrator::refuse_setup(ProcessGroup& group, const std::string& why, Deadline deadline) {
  migrate::RankMap mine;
  mine.setup_error = why;
  auto gathered = group.allgather(migrate::encode_map(mine), deadline);
  if (!gathered) return gathered.status().with_context("exchanging expert memory maps");
  for (int r = 0; r < group.size(); ++r) {
    auto map = migrate::decode_map((*gathered)[size_t(r)], r);
    if (!map) return map.status();
    if (!map->setup_error.empty())
      return error(Code::Aborted, fmt::format("rank {} failed to set up: {}", r, map->setup_error)).with_peer(r);
  }
  return error(Code::Internal, "refuse_setup: this rank's refusal is missing from the exchange");
}

Result<std::unique_ptr<Migrator>> Migrator::create(ProcessGroup& group, DataPlane& plane, ExpertStore& store,
                                                   const Topology& topology, MigrateOptions options,
                                                   Deadline deadline) {
  EPLB_TRY(validate_timeouts(options));
  std::unique_ptr<Migrator> migrator(new Migrator());
  migrator->options_ = std::move(options);
  migrator->state_ = std::make_unique<State>();
  State& state = *migrator->state_;
  state.group = &group;
  state.plane = &plane;
  state.store = &store;
  state.topology = topology;
  state.options = &migrator->options_;
  // A local failure is still sent to the others so that every rank stops
  // with the same explanation.
  migrate::RankMap mine;
  mine.layout = store.layout().encode();
  mine.first_slot = uint32_t(store.first_slot());
  mine.has_spare = store.has_spare();
  mine.plane = plane.name();
  mine.digest_kind = plane.digest_kind();
  mine.transfer_schedule = transfer_schedule_name(migrator->options_);
  Status local = migrate::set_up_locally(state, mine);
  if (!local) mine.setup_error = local.to_string();
  auto gathered = group.allgather(migrate::encode_map(mine), deadline);
  if (!gathered) return gathered.status().with_context("exchanging expert memory maps");
  if (!local) return local.with_context(fmt::format("rank {} set-up", group.rank()));
  EPLB_TRY(migrate::adopt_maps(state, *gathered));
  // Everybody has loaded everybody's metadata before the first READ.
  EPLB_TRY(group.barrier(deadline).with_context("after exchanging expert memory maps"));
  return migrator;
}

}  // namespace eplb
