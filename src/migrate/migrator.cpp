// migrator.cpp - Migrator: set-up (register, exchange memory maps, check
// layouts) and the per-layer protocol: checksums, READs into staging, wait,
// verify, vote, commit or abort, retry.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "eplb/migrate.h"
#include "eplb/plan.h"
#include "wire.h"

namespace eplb {
namespace {

constexpr std::string_view kMapMagic = "EPLBMEMMAP";
constexpr uint32_t kMapVersion = 1;
constexpr std::string_view kSumMagic = "EPLBSUMS";

// What one rank tells the others at set-up.
struct RankMap {
  std::string layout;    // StoreLayout::encode()
  std::string metadata;  // xfer agent metadata
  std::string agent_name;
  uint32_t first_slot = 0;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> tensors;  // [layer][tensor] -> (address, stride)
  std::string setup_error;  // non-empty: this rank failed locally before the exchange
};

std::string encode_map(const RankMap& map) {
  migrate_wire::Writer writer;
  writer.raw(kMapMagic);
  writer.u32(kMapVersion);
  writer.bytes(map.setup_error);
  writer.bytes(map.layout);
  writer.bytes(map.metadata);
  writer.bytes(map.agent_name);
  writer.u32(map.first_slot);
  writer.u32(uint32_t(map.tensors.size()));
  for (const auto& layer : map.tensors) {
    writer.u32(uint32_t(layer.size()));
    for (auto [address, stride] : layer) {
      writer.u64(address);
      writer.u64(stride);
    }
  }
  return writer.take();
}

Result<RankMap> decode_map(std::string_view bytes, int rank) {
  migrate_wire::Reader reader(bytes);
  auto bad = [&](const std::string& what) {
    return error(Code::Mismatch, "memory map from rank " + std::to_string(rank) + " (" +
                                     std::to_string(bytes.size()) + " bytes) is malformed at byte " +
                                     std::to_string(reader.position()) + ": " + what);
  };
  if (!reader.raw(kMapMagic)) return bad("bad magic");
  uint32_t version = reader.u32();
  if (!reader.ok()) return bad("truncated");
  if (version != kMapVersion) return bad("version " + std::to_string(version));
  RankMap map;
  map.setup_error = std::string(reader.bytes(1 << 16));
  map.layout = std::string(reader.bytes(1 << 24));
  map.metadata = std::string(reader.bytes(1 << 26));
  map.agent_name = std::string(reader.bytes(256));
  map.first_slot = reader.u32();
  uint32_t layers = reader.u32();
  if (!reader.ok() || layers > (1u << 16)) return bad("truncated or too many layers");
  map.tensors.resize(layers);
  for (auto& layer : map.tensors) {
    uint32_t count = reader.u32();
    if (!reader.ok() || count > 256) return bad("truncated or too many tensors");
    for (uint32_t t = 0; t < count; ++t) {
      uint64_t address = reader.u64();
      uint64_t stride = reader.u64();
      layer.emplace_back(address, stride);
    }
    if (!reader.ok()) return bad("truncated");
  }
  if (!reader.at_end()) return bad("trailing bytes");
  return map;
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string join_ints(const std::vector<int>& values, size_t limit = 12) {
  std::string text;
  for (size_t i = 0; i < values.size() && i < limit; ++i) text += (i ? "," : "") + std::to_string(values[i]);
  if (values.size() > limit) text += ",... (" + std::to_string(values.size()) + " in all)";
  return text;
}

std::string layer_list(const std::vector<int>& layers) {
  if (layers.empty()) return "none";
  return join_ints(layers, 64);
}

// Runs a collective on a helper thread while this thread keeps driving the
// transfer agent: with transports that emulate one-sided READs in software
// (UCX over shared memory without CMA, for example) a source only serves
// its peers' READs while it progresses, and it must keep serving them while
// it waits for the slowest rank in a vote. The collective has its own
// deadline, so the loop ends.
template <typename Collective>
auto with_progress(xfer::Agent& agent, Collective&& collective) {
  auto pending = std::async(std::launch::async, std::forward<Collective>(collective));
  while (pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    agent.progress();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return pending.get();
}

}  // namespace

struct Migrator::State {
  ProcessGroup* group = nullptr;
  xfer::Agent* agent = nullptr;
  ExpertStore* store = nullptr;
  Topology topology;
  std::vector<xfer::RegionId> regions;
  std::vector<RankMap> ranks;  // indexed by rank

  int me() const { return group->rank(); }
  int tensors(int layer) const { return int(store->layout().layers[layer].size()); }
};

Migrator::~Migrator() {
  if (state_ && state_->agent)
    for (auto region : state_->regions) (void)state_->agent->deregister_memory(region);
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
  const int me = group.rank();

  // Local checks and registration; a local failure is still sent to the
  // others so that every rank stops with the same explanation.
  RankMap mine;
  mine.layout = store.layout().encode();
  mine.agent_name = agent.name();
  mine.first_slot = uint32_t(store.first_slot());
  auto local_setup = [&]() -> Status {
    EPLB_TRY(topology.validate());
    if (group.size() != topology.num_ranks)
      return error(Code::InvalidArgument, "the process group has " + std::to_string(group.size()) +
                                              " ranks, the topology " + std::to_string(topology.num_ranks));
    if (store.slots_per_rank() != topology.slots_per_rank() || store.layout().num_layers() != topology.num_layers)
      return error(Code::InvalidArgument, "the expert store (" + store.layout().to_string() +
                                              ") does not match the topology (" + topology.to_string() + ")");
    if (store.first_slot() != me * topology.slots_per_rank())
      return error(Code::InvalidArgument, "the expert store starts at slot " + std::to_string(store.first_slot()) +
                                              ", rank " + std::to_string(me) + " owns slots from " +
                                              std::to_string(me * topology.slots_per_rank()));
    for (const auto& region : store.regions()) {
      auto id = agent.register_memory(region);
      if (!id) return id.status().with_context("registering " + format_bytes(region.length) + " of expert memory");
      state.regions.push_back(*id);
    }
    auto metadata = agent.export_metadata();
    if (!metadata) return metadata.status().with_context("exporting transfer metadata");
    mine.metadata.assign(metadata->begin(), metadata->end());
    for (int l = 0; l < store.layout().num_layers(); ++l) {
      mine.tensors.emplace_back();
      for (int t = 0; t < int(store.layout().layers[l].size()); ++t)
        mine.tensors.back().emplace_back(reinterpret_cast<uint64_t>(store.row(l, 0, t)), store.row_stride(l, t));
    }
    return Status::ok();
  };
  Status local = local_setup();
  if (!local) mine.setup_error = local.to_string();

  auto gathered = group.allgather(encode_map(mine), deadline);
  if (!gathered) return gathered.status().with_context("exchanging expert memory maps");
  if (!local) return local.with_context("rank " + std::to_string(me) + " set-up");
  std::vector<std::string> layouts;
  for (int r = 0; r < group.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(RankMap map, decode_map(gathered.value()[r], r));
    if (!map.setup_error.empty())
      return error(Code::Aborted, "rank " + std::to_string(r) + " failed to set up: " + map.setup_error);
    layouts.push_back(map.layout);
    state.ranks.push_back(std::move(map));
  }
  EPLB_TRY(check_layouts_agree(layouts));
  for (int r = 0; r < group.size(); ++r) {
    RankMap& map = state.ranks[r];
    std::string who = "rank " + std::to_string(r);
    if (map.first_slot != uint32_t(r * topology.slots_per_rank()))
      return error(Code::Mismatch, who + " says its slots start at " + std::to_string(map.first_slot) +
                                       ", expected " + std::to_string(r * topology.slots_per_rank()));
    if (map.tensors.size() != store.layout().layers.size())
      return error(Code::Mismatch, who + " sent a memory map of " + std::to_string(map.tensors.size()) +
                                       " layers, expected " + std::to_string(store.layout().layers.size()));
    for (size_t l = 0; l < map.tensors.size(); ++l)
      if (map.tensors[l].size() != store.layout().layers[l].size())
        return error(Code::Mismatch, who + " sent a memory map of layer " + std::to_string(l) + " with " +
                                         std::to_string(map.tensors[l].size()) + " tensors, expected " +
                                         std::to_string(store.layout().layers[l].size()));
    if (r == me) continue;
    if (!agent.knows_peer(map.agent_name)) {
      std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(map.metadata.data()), map.metadata.size());
      auto name = agent.load_metadata(bytes);
      if (!name) return name.status().with_context("loading the transfer metadata of " + who);
      if (*name != map.agent_name)
        return error(Code::Mismatch, who + " announced agent '" + map.agent_name + "' but its metadata names '" +
                                         *name + "'");
    }
  }
  // Everybody has loaded everybody's metadata before the first READ.
  EPLB_TRY(group.barrier(deadline).with_context("after exchanging expert memory maps"));
  return migrator;
}

uint64_t RoundReport::bytes_local() const {
  uint64_t sum = 0;
  for (const auto& layer : layers) sum += layer.committed ? layer.bytes_local : 0;
  return sum;
}
uint64_t RoundReport::bytes_intra_node() const {
  uint64_t sum = 0;
  for (const auto& layer : layers) sum += layer.committed ? layer.bytes_intra_node : 0;
  return sum;
}
uint64_t RoundReport::bytes_inter_node() const {
  uint64_t sum = 0;
  for (const auto& layer : layers) sum += layer.committed ? layer.bytes_inter_node : 0;
  return sum;
}
uint64_t RoundReport::bytes_moved() const { return bytes_local() + bytes_intra_node() + bytes_inter_node(); }
int RoundReport::retries() const {
  int sum = 0;
  for (const auto& layer : layers) sum += layer.retries;
  return sum;
}
int RoundReport::failures() const {
  int sum = 0;
  for (const auto& layer : layers) sum += layer.failure.empty() ? 0 : 1;
  return sum;
}
int RoundReport::layers_committed() const {
  int sum = 0;
  for (const auto& layer : layers) sum += layer.committed ? 1 : 0;
  return sum;
}

namespace {

// Everything one rank does for one attempt of one layer, up to (not
// including) the vote. Returns ok when every row it needs is in staging and
// verified; otherwise the reason (also in *reason, for the vote).
struct AttemptContext {
  xfer::Agent& agent;
  ExpertStore& store;
  const std::vector<RankMap>& ranks;
  const LayerPlan& plan;
  const std::vector<std::vector<uint64_t>>& sums;        // [source rank][row]
  const std::vector<std::map<int, size_t>>& sum_index;   // [source rank] slot -> position in slots_read_from
  int me;
  int layer;
  Deadline transfer_deadline;
  LayerReport* report;
  // Out: XXH3 of every staged row, [local slot * tensors + tensor], where
  // known (verified reads, copies of rows with a known checksum).
  std::vector<std::optional<uint64_t>>* staged_sums;
};

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
};

void release_all(xfer::Agent& agent, std::vector<PostedRead>& reads) {
  for (auto& read : reads) {
    if (read.request) (void)agent.release(read.request);
    if (read.local) (void)agent.release_descriptor_list(read.local);
    if (read.remote) (void)agent.release_descriptor_list(read.remote);
    read.request = read.local = read.remote = 0;
  }
}

Status run_attempt(const AttemptContext& context) {
  const int me = context.me;
  const int layer = context.layer;
  ExpertStore& store = context.store;
  const RankLayerPlan& rank_plan = context.plan.ranks[me];
  const int first = store.first_slot();
  const int tensors = int(store.layout().layers[layer].size());
  std::vector<PostedRead> reads;
  std::string where = "layer " + std::to_string(layer) + " on rank " + std::to_string(me);
  Stopwatch phase;

  // 1. READs into staging: one request per source rank.
  std::map<int, int> slot_expert;
  for (const auto& op : rank_plan.slots) slot_expert[op.slot] = op.expert;
  for (const auto& request : rank_plan.reads) {
    const RankMap& source = context.ranks[request.source_rank];
    PostedRead posted;
    posted.source_rank = request.source_rank;
    std::vector<xfer::Descriptor> local, remote;
    for (const auto& run : request.runs) {
      for (int i = 0; i < run.count; ++i) posted.experts.push_back(slot_expert[run.dest_slot + i]);
      for (int t = 0; t < tensors; ++t) {
        uint64_t row_bytes = store.row_bytes(layer, t);
        auto [base, stride] = source.tensors[layer][t];
        int source_local = run.source_slot - int(source.first_slot);
        // Staging rows are packed; remote rows are packed unless the peer's
        // engine memory has a wider stride, then one descriptor per row.
        if (stride == row_bytes) {
          local.push_back({reinterpret_cast<uint64_t>(store.staging_row(layer, run.dest_slot - first, t)),
                           row_bytes * uint64_t(run.count), 0});
          remote.push_back({base + uint64_t(source_local) * stride, row_bytes * uint64_t(run.count), 0});
        } else {
          for (int i = 0; i < run.count; ++i) {
            local.push_back(
                {reinterpret_cast<uint64_t>(store.staging_row(layer, run.dest_slot - first + i, t)), row_bytes, 0});
            remote.push_back({base + uint64_t(source_local + i) * stride, row_bytes, 0});
          }
        }
        posted.bytes += row_bytes * uint64_t(run.count);
      }
    }
    std::string what = "READ of " + std::to_string(remote.size()) + " descriptors (" + format_bytes(posted.bytes) +
                       ") from rank " + std::to_string(request.source_rank) + " (experts " +
                       join_ints(posted.experts) + ")";
    auto local_list = context.agent.prepare_local(local);
    if (!local_list) {
      release_all(context.agent, reads);
      return local_list.status().with_context(where + ": preparing " + what);
    }
    posted.local = *local_list;
    auto remote_list = context.agent.prepare_remote(source.agent_name, remote);
    if (!remote_list) {
      reads.push_back(posted);
      release_all(context.agent, reads);
      return remote_list.status().with_context(where + ": preparing " + what);
    }
    posted.remote = *remote_list;
    auto request_id = context.agent.make_request(xfer::Operation::Read, posted.local, {}, posted.remote, {});
    if (!request_id) {
      reads.push_back(posted);
      release_all(context.agent, reads);
      return request_id.status().with_context(where + ": " + what);
    }
    posted.request = *request_id;
    reads.push_back(posted);
    if (Status posted_status = context.agent.post(posted.request); !posted_status) {
      release_all(context.agent, reads);
      return posted_status.with_context(where + ": posting " + what);
    }
  }

  // 2. Local copies from rows that change in this commit, while the READs
  // fly (the others wait for the commit: CopyPlan).
  auto& staged_sums = *context.staged_sums;
  staged_sums.assign(size_t(store.slots_per_rank()) * size_t(tensors), std::nullopt);
  auto staged = [&](int slot, int t) -> std::optional<uint64_t>& {
    return staged_sums[size_t(slot - first) * size_t(tensors) + size_t(t)];
  };
  const CopyPlan copies = CopyPlan::of(rank_plan, first, store.slots_per_rank());
  for (const auto& op : rank_plan.slots) {
    if (op.action != SlotAction::LocalCopy || op.copy_after_read || copies.deferred(op, first)) continue;
    for (int t = 0; t < tensors; ++t) {
      std::memcpy(store.staging_row(layer, op.slot - first, t), store.row(layer, op.source_slot - first, t),
                  store.row_bytes(layer, t));
      staged(op.slot, t) = store.cached_checksum(layer, op.source_slot - first, t);
    }
  }

  // 3. Wait, with the deadline.
  if (!reads.empty()) {
    std::vector<xfer::RequestId> ids;
    for (const auto& read : reads) ids.push_back(read.request);
    Status waited = context.agent.wait(ids, context.transfer_deadline);
    if (!waited) {
      // Name every request that did not finish, with its peer and experts.
      std::string detail;
      for (const auto& read : reads) {
        auto state = context.agent.status(read.request);
        if (state.state == xfer::RequestState::Done) continue;
        detail += detail.empty() ? "" : "; ";
        detail += "READ from rank " + std::to_string(read.source_rank) + " of experts " +
                  join_ints(read.experts) + " (" + format_bytes(read.bytes) + "): " +
                  (state.state == xfer::RequestState::Failed ? state.failure.to_string()
                                                             : std::string("still in progress at the deadline"));
      }
      release_all(context.agent, reads);
      if (detail.empty()) detail = waited.to_string();
      return Status(waited.code(), where + ": " + detail);
    }
  }
  release_all(context.agent, reads);

  context.report->seconds_transfer += phase.seconds();
  phase.reset();
  // 4. Verify every received row against its source's checksum.
  std::string mismatches;
  int mismatch_count = 0;
  for (const auto& op : rank_plan.slots) {
    if (op.action != SlotAction::RemoteRead) continue;
    const auto& index = context.sum_index[op.source_rank];
    auto found = index.find(op.source_slot);
    if (found == index.end())
      return error(Code::Internal, where + ": no published checksum for slot " + std::to_string(op.source_slot) +
                                       " of rank " + std::to_string(op.source_rank));
    for (int t = 0; t < tensors; ++t) {
      size_t position = found->second * size_t(tensors) + size_t(t);
      uint64_t expected = context.sums[op.source_rank][position];
      uint64_t got = XXH3_64bits(store.staging_row(layer, op.slot - first, t), store.row_bytes(layer, t));
      staged(op.slot, t) = expected;
      if (got != expected) {
        if (++mismatch_count <= 4)
          mismatches += std::string(mismatches.empty() ? "" : "; ") + "expert " + std::to_string(op.expert) +
                        " read from rank " + std::to_string(op.source_rank) + " slot " +
                        std::to_string(op.source_slot) + " tensor '" + store.layout().layers[layer][t].name +
                        "' into slot " + std::to_string(op.slot) + " (expected " + hex(expected) + ", got " +
                        hex(got) + ")";
      }
    }
  }
  context.report->seconds_verify += phase.seconds();
  if (mismatch_count)
    return error(Code::Mismatch, where + ": checksum mismatch in " + std::to_string(mismatch_count) +
                                     " received row(s): " + mismatches);
  return Status::ok();
}

// After a unanimous vote: every changed slot's live rows get their new
// expert (from staging, from the staged copy of a row read in this layer,
// or straight from a kept live row), and the store remembers their
// checksums. Nobody reads this layer's changing rows any more.
void commit_layer(ExpertStore& store, const RankLayerPlan& rank_plan, int layer,
                  const std::vector<std::optional<uint64_t>>& staged_sums) {
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

std::string encode_sums(const std::vector<uint64_t>& sums) {
  migrate_wire::Writer writer;
  writer.raw(kSumMagic);
  writer.u64(sums.size());
  writer.raw(std::string_view(reinterpret_cast<const char*>(sums.data()), sums.size() * sizeof(uint64_t)));
  return writer.take();
}

Result<std::vector<uint64_t>> decode_sums(std::string_view bytes, size_t expected_count, int rank, int layer) {
  migrate_wire::Reader reader(bytes);
  bool ok = reader.raw(kSumMagic);
  uint64_t count = reader.u64();
  ok = ok && reader.ok() && count == expected_count &&
       bytes.size() - reader.position() == expected_count * sizeof(uint64_t);
  if (!ok)
    return error(Code::Mismatch, "layer " + std::to_string(layer) + ": checksum message from rank " +
                                     std::to_string(rank) + " (" + std::to_string(bytes.size()) +
                                     " bytes) does not hold the expected " + std::to_string(expected_count) +
                                     " checksums");
  std::vector<uint64_t> sums(expected_count);
  if (expected_count) std::memcpy(sums.data(), bytes.data() + reader.position(), expected_count * sizeof(uint64_t));
  return sums;
}

}  // namespace

RoundReport Migrator::migrate(Placement& current, const Placement& target) {
  State& state = *state_;
  RoundReport report;
  Stopwatch round;
  const Topology& topology = state.topology;
  const int me = state.me();
  ExpertStore& store = *state.store;
  std::vector<int> committed_layers;

  auto stop = [&](Status status) {
    report.status = std::move(status);
    report.seconds = round.seconds();
    return report;
  };
  if (Status valid = current.validate_against(topology); !valid)
    return stop(valid.with_context("migrate: the current placement"));
  if (Status valid = target.validate_against(topology); !valid)
    return stop(valid.with_context("migrate: the target placement"));

  for (int layer = 0; layer < topology.num_layers; ++layer) {
    Stopwatch layer_clock;
    LayerReport layer_report;
    layer_report.layer = layer;
    auto finish_layer = [&] {
      layer_report.seconds = layer_clock.seconds();
      if (options_.on_layer_done) options_.on_layer_done(layer_report);
      report.layers.push_back(layer_report);
    };
    auto planned = plan_layer(current.layer_phy2log(layer), target.layer_phy2log(layer), topology, layer);
    if (!planned) {
      finish_layer();
      return stop(planned.status().with_context("planning layer " + std::to_string(layer)));
    }
    const LayerPlan& plan = planned.value();
    const uint64_t expert_bytes = store.layout().bytes_per_expert(layer);
    layer_report.bytes_kept = uint64_t(plan.stats.slots_kept) * expert_bytes;
    layer_report.bytes_local = uint64_t(plan.stats.slots_local_copy) * expert_bytes;
    layer_report.bytes_intra_node = uint64_t(plan.stats.slots_read_intra_node) * expert_bytes;
    layer_report.bytes_inter_node = uint64_t(plan.stats.slots_read_inter_node) * expert_bytes;
    layer_report.requests = plan.stats.requests;
    layer_report.descriptors = plan.stats.descriptors;
    for (const auto& request : plan.ranks[me].reads)
      layer_report.bytes_read_here += uint64_t(request.slots()) * expert_bytes;
    layer_report.changed =
        plan.stats.slots_local_copy + plan.stats.slots_read_intra_node + plan.stats.slots_read_inter_node > 0;
    if (!layer_report.changed) {
      // Same experts in the same slots: only the replica order may differ.
      (void)current.set_layer(layer, target, layer);
      finish_layer();
      continue;
    }

    // The transfer deadline scales with what this rank reads; collectives
    // wait for the slowest rank's transfers plus a margin. Every rank
    // computes the same plan, so the largest read is known everywhere.
    uint64_t largest_read = 0;
    for (const auto& rank_plan : plan.ranks) {
      uint64_t bytes = 0;
      for (const auto& request : rank_plan.reads) bytes += uint64_t(request.slots()) * expert_bytes;
      largest_read = std::max(largest_read, bytes);
    }
    double transfer_seconds = options_.timeout_seconds > 0 ? options_.timeout_seconds
                                                            : 5.0 + double(largest_read) / double(256ull << 20);
    double collective_seconds =
        options_.collective_timeout_seconds > 0 ? options_.collective_timeout_seconds : transfer_seconds + 10.0;
    const std::string layer_name = "layer " + std::to_string(layer);
    auto lost = [&](const Status& failure, const std::string& during) {
      layer_report.failure = failure.to_string();
      finish_layer();
      return stop(Status(failure.code(),
                         "migration stopped on rank " + std::to_string(me) + " at " + layer_name + " (" + during +
                             "): " + failure.message() + "; " + layer_name +
                             " kept its old placement on this rank (live weights and mapping untouched); layers "
                             "committed to the new placement this round: " +
                             layer_list(committed_layers)));
    };

    // Sources publish the checksum of every row a peer reads in this layer
    // (remembered by the store when known, computed otherwise).
    const int tensors = state.tensors(layer);
    Stopwatch phase;
    std::vector<uint64_t> my_sums;
    my_sums.reserve(plan.slots_read_from[me].size() * size_t(tensors));
    for (int slot : plan.slots_read_from[me])
      for (int t = 0; t < tensors; ++t) my_sums.push_back(store.known_checksum(layer, slot - store.first_slot(), t));
    std::string my_message = encode_sums(my_sums);
    auto gathered = with_progress(*state.agent, [&] {
      return state.group->allgather(my_message, Deadline::after_seconds(collective_seconds));
    });
    layer_report.seconds_checksum += phase.seconds();
    if (!gathered) return lost(gathered.status(), "publishing checksums");
    std::vector<std::vector<uint64_t>> sums(topology.num_ranks);
    std::vector<std::map<int, size_t>> sum_index(topology.num_ranks);
    Status sums_ok;
    for (int r = 0; r < topology.num_ranks; ++r) {
      const auto& slots = plan.slots_read_from[r];
      for (size_t i = 0; i < slots.size(); ++i) sum_index[r][slots[i]] = i;
      auto decoded = decode_sums(gathered.value()[r], slots.size() * size_t(tensors), r, layer);
      if (!decoded) {
        if (sums_ok) sums_ok = decoded.status();
        continue;
      }
      sums[r] = std::move(decoded).value();
    }

    bool committed = false;
    std::string last_failure;
    std::vector<std::optional<uint64_t>> staged_sums;
    for (int attempt = 0; attempt <= options_.retries; ++attempt) {
      if (options_.before_attempt) options_.before_attempt(layer, attempt);
      Status outcome = sums_ok;
      if (outcome) {
        AttemptContext context{*state.agent, store, state.ranks, plan, sums, sum_index, me, layer,
                               Deadline::after_seconds(transfer_seconds), &layer_report, &staged_sums};
        outcome = run_attempt(context);
      }
      std::vector<std::string> reasons;
      std::string my_reason = outcome.is_ok() ? std::string() : outcome.to_string();
      phase.reset();
      auto vote = with_progress(*state.agent, [&] {
        return state.group->vote(outcome.is_ok(), my_reason, Deadline::after_seconds(collective_seconds), &reasons);
      });
      layer_report.seconds_vote += phase.seconds();
      if (!vote) return lost(vote.status(), "voting on attempt " + std::to_string(attempt + 1));
      if (*vote) {
        // Unanimous: every rank's reads of this layer have landed, so no
        // peer reads these rows any more. Staging -> live, switch mapping.
        phase.reset();
        commit_layer(store, plan.ranks[me], layer, staged_sums);
        layer_report.seconds_commit += phase.seconds();
        if (Status switched = current.set_layer(layer, target, layer); !switched)
          return lost(switched, "switching the mapping");
        committed = true;
        break;
      }
      last_failure.clear();
      for (size_t r = 0; r < reasons.size(); ++r) {
        if (reasons[r].empty()) continue;
        std::string reason = reasons[r].size() > 700 ? reasons[r].substr(0, 700) + "..." : reasons[r];
        last_failure += (last_failure.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                        " voted no: " + reason;
      }
      if (last_failure.empty()) last_failure = "a rank voted no without a reason";
      layer_report.failure = "attempt " + std::to_string(attempt + 1) + ": " + last_failure;
      if (attempt < options_.retries) ++layer_report.retries;
    }
    if (!committed) {
      finish_layer();
      return stop(error(Code::Aborted,
                        layer_name + " aborted after " + std::to_string(options_.retries + 1) +
                            " attempt(s): " + last_failure + ". " + layer_name +
                            " kept its old placement on every rank (staging dropped, live weights and mapping "
                            "untouched); layers committed to the new placement this round: " +
                            layer_list(committed_layers)));
    }
    layer_report.committed = true;
    committed_layers.push_back(layer);
    finish_layer();
  }
  report.seconds = round.seconds();
  return report;
}

}  // namespace eplb
