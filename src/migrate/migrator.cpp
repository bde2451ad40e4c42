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
constexpr uint32_t kMapVersion = 2;

}  // namespace

std::string encode_map(const RankMap& map) {
  bytes::Writer writer;
  writer.raw(kMapMagic);
  writer.u32(kMapVersion);
  writer.blob(map.setup_error);
  writer.blob(map.layout);
  writer.blob(map.metadata);
  writer.blob(map.agent_name);
  writer.u32(map.first_slot);
  for (const auto* buffers : {&map.tensors, &map.spare_tensors}) {
    writer.u32(uint32_t(buffers->size()));
    for (const auto& layer : *buffers) {
      writer.u32(uint32_t(layer.size()));
      for (auto [address, stride] : layer) {
        writer.u64(address);
        writer.u64(stride);
      }
    }
  }
  return writer.take();
}

namespace {

// One buffer's [layer][tensor] -> (address, stride), checked.
bool decode_buffer(bytes::Reader& reader, std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& out) {
  uint32_t layers = reader.u32();
  if (!reader.ok() || layers > (1u << 16)) return false;
  out.resize(layers);
  for (auto& layer : out) {
    uint32_t count = reader.u32();
    if (!reader.ok() || count > 256) return false;
    for (uint32_t t = 0; t < count; ++t) {
      uint64_t address = reader.u64();
      uint64_t stride = reader.u64();
      layer.emplace_back(address, stride);
    }
    if (!reader.ok()) return false;
  }
  return true;
}

}  // namespace

std::pair<uint64_t, uint64_t> source_tensor(const RankMap& map, int live, int layer, int tensor) {
  return live == 1 ? map.spare_tensors[layer][tensor] : map.tensors[layer][tensor];
}

Result<RankMap> decode_map(std::string_view message, int rank) {
  bytes::Reader reader(message);
  auto bad = [&](std::string_view what) {
    return error(Code::Mismatch, fmt::format("memory map from rank {} ({} bytes) is malformed at byte {}: {}", rank,
                                             message.size(), reader.position(), what));
  };
  if (!reader.expect(kMapMagic)) return bad("bad magic");
  uint32_t version = reader.u32();
  if (!reader.ok()) return bad("truncated");
  if (version != kMapVersion) return bad(fmt::format("version {}", version));
  RankMap map;
  map.setup_error = std::string(reader.blob(1 << 16));
  map.layout = std::string(reader.blob(1 << 24));
  map.metadata = std::string(reader.blob(1 << 26));
  map.agent_name = std::string(reader.blob(256));
  map.first_slot = reader.u32();
  if (!decode_buffer(reader, map.tensors)) return bad("truncated, or too many layers or tensors");
  if (!decode_buffer(reader, map.spare_tensors)) return bad("spare buffers truncated, or too many layers or tensors");
  if (!reader.at_end()) return bad("trailing bytes");
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

// This rank's checks and registration, filling `mine`.
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
  for (const auto& region : store.regions()) {
    auto id = state.agent->register_memory(region);
    if (!id) return id.status().with_context("registering " + format_bytes(region.length) + " of expert memory");
    state.regions.push_back(*id);
  }
  auto metadata = state.agent->export_metadata();
  if (!metadata) return metadata.status().with_context("exporting transfer metadata");
  mine.metadata.assign(metadata->begin(), metadata->end());
  for (int l = 0; l < store.layout().num_layers(); ++l) {
    mine.tensors.emplace_back();
    if (store.has_spare()) mine.spare_tensors.emplace_back();
    for (int t = 0; t < state.tensors(l); ++t) {
      auto address = [&](int buffer) { return reinterpret_cast<uint64_t>(store.buffer_row(l, buffer, 0, t)); };
      mine.tensors.back().emplace_back(address(0), store.row_stride(l, t));
      if (store.has_spare()) mine.spare_tensors.back().emplace_back(address(1), store.row_stride(l, t));
    }
  }
  return check_commit_mode(state.options->commit, store);
}

// A peer's memory map against the local layout.
Status check_map(const RankMap& map, int rank, const Topology& topology, const StoreLayout& layout) {
  const std::string who = fmt::format("rank {}", rank);
  if (map.first_slot != uint32_t(rank * topology.slots_per_rank()))
    return error(Code::Mismatch, fmt::format("{} says its slots start at {}, expected {}", who, map.first_slot,
                                             rank * topology.slots_per_rank()));
  if (map.tensors.size() != layout.layers.size())
    return error(Code::Mismatch, fmt::format("{} sent a memory map of {} layers, expected {}", who,
                                             map.tensors.size(), layout.layers.size()));
  if (!map.spare_tensors.empty() && map.spare_tensors.size() != layout.layers.size())
    return error(Code::Mismatch, fmt::format("{} sent spare buffers for {} layers, expected {}", who,
                                             map.spare_tensors.size(), layout.layers.size()));
  for (size_t l = 0; l < map.tensors.size(); ++l)
    if (map.tensors[l].size() != layout.layers[l].size() ||
        (!map.spare_tensors.empty() && map.spare_tensors[l].size() != layout.layers[l].size()))
      return error(Code::Mismatch, fmt::format("{} sent a memory map of layer {} with {} tensors, expected {}", who,
                                               l, map.tensors[l].size(), layout.layers[l].size()));
  return Status::ok();
}

// Loads a peer's metadata; for a peer the agent knows already (an earlier
// Migrator on the same agents) this adds the regions it registered since.
Status load_peer(xfer::Agent& agent, const RankMap& map, int rank) {
  std::span<const uint8_t> metadata(reinterpret_cast<const uint8_t*>(map.metadata.data()), map.metadata.size());
  auto name = agent.load_metadata(metadata);
  if (!name) return name.status().with_context(fmt::format("loading the transfer metadata of rank {}", rank));
  if (*name != map.agent_name)
    return error(Code::Mismatch, fmt::format("rank {} announced agent '{}' but its metadata names '{}'", rank,
                                             map.agent_name, *name));
  return Status::ok();
}

// Decodes every rank's map, checks layouts and maps, loads the peers.
Status adopt_maps(Migrator::State& state, const std::vector<std::string>& gathered) {
  std::vector<std::string> layouts;
  for (int r = 0; r < state.group->size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(RankMap map, decode_map(gathered[r], r));
    if (!map.setup_error.empty())
      return error(Code::Aborted, fmt::format("rank {} failed to set up: {}", r, map.setup_error));
    layouts.push_back(map.layout);
    state.ranks.push_back(std::move(map));
  }
  EPLB_TRY(check_layouts_agree(layouts));
  for (int r = 0; r < state.group->size(); ++r) {
    EPLB_TRY(check_map(state.ranks[r], r, state.topology, state.store->layout()));
    if (r != state.me()) EPLB_TRY(load_peer(*state.agent, state.ranks[r], r));
  }
  return Status::ok();
}

}  // namespace
}  // namespace migrate

std::string_view commit_mode_name(CommitMode mode) { return mode == CommitMode::Swap ? "swap" : "copy"; }

Migrator::~Migrator() {
  if (state_ && state_->agent)
    for (auto region : state_->regions) (void)state_->agent->deregister_memory(region);
}

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
  std::unique_ptr<Migrator> migrator(new Migrator());
  migrator->options_ = std::move(options);
  migrator->state_ = std::make_unique<State>();
  State& state = *migrator->state_;
  state.group = &group;
  state.agent = &agent;
  state.store = &store;
  state.topology = topology;
  state.options = &migrator->options_;
  // A local failure is still sent to the others so that every rank stops
  // with the same explanation.
  migrate::RankMap mine;
  mine.layout = store.layout().encode();
  mine.agent_name = agent.name();
  mine.first_slot = uint32_t(store.first_slot());
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
