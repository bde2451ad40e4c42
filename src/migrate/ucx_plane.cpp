// ucx_plane.cpp - the `ucx` data plane (eplb/data_plane.h): one-sided READs
// of host rows through the xfer Agent, one request per source rank and one
// descriptor per row and tensor (so that a checksum the transport computes
// while copying a descriptor is one row's); XXH3-64 digests; memcpy copies.
// Its set-up blob is the rank's agent metadata and the addresses of its two
// buffers per layer and tensor (the memory map peers read from).
#include <fmt/format.h>

#include <cstring>

#include "common/bytes.h"
#include "eplb/data_plane.h"
#include "eplb/migrate.h"
#include "eplb/xfer.h"

namespace eplb {
namespace {

constexpr std::string_view kMapMagic = "EPLBUCXMAP";
constexpr uint32_t kMapVersion = 1;
using BufferMap = std::vector<std::vector<std::pair<uint64_t, uint64_t>>>;  // [layer][tensor] -> (address, stride)

struct PeerMap {
  std::string agent_name;
  std::string metadata;
  BufferMap buffers[2];  // Primary, Spare (empty without spares)
};

void encode_buffer(bytes::Writer& writer, const BufferMap& buffer) {
  writer.u32(uint32_t(buffer.size()));
  for (const auto& layer : buffer) {
    writer.u32(uint32_t(layer.size()));
    for (auto [address, stride] : layer) {
      writer.u64(address);
      writer.u64(stride);
    }
  }
}

bool decode_buffer(bytes::Reader& reader, BufferMap& out) {
  const uint32_t layers = reader.u32();
  if (!reader.ok() || layers > (1u << 16)) return false;
  out.resize(layers);
  for (auto& layer : out) {
    const uint32_t count = reader.u32();
    if (!reader.ok() || count > 256) return false;
    for (uint32_t t = 0; t < count && reader.ok(); ++t) {
      const uint64_t address = reader.u64(), stride = reader.u64();
      layer.emplace_back(address, stride);
    }
    if (!reader.ok()) return false;
  }
  return true;
}

Result<PeerMap> decode_peer(std::string_view blob, int rank) {
  bytes::Reader reader(blob);
  PeerMap map;
  bool ok = reader.expect(kMapMagic) && reader.u32() == kMapVersion;
  map.agent_name = std::string(reader.blob(256));
  map.metadata = std::string(reader.blob(1 << 26));
  ok = ok && reader.ok() && decode_buffer(reader, map.buffers[0]) && decode_buffer(reader, map.buffers[1]);
  if (!ok || !reader.at_end())
    return error(Code::Mismatch, fmt::format("the ucx memory map of rank {} ({} bytes) is malformed at byte {}", rank,
                                             blob.size(), reader.position()));
  return map;
}

// A peer's buffers against the local layout (same layers and tensors).
Status check_peer(const PeerMap& map, int rank, const StoreLayout& layout) {
  for (int b = 0; b < 2; ++b) {
    const BufferMap& buffer = map.buffers[b];
    if (b == 1 && buffer.empty()) continue;
    if (buffer.size() != layout.layers.size())
      return error(Code::Mismatch, fmt::format("rank {} sent a memory map of {} layers (buffer {}), expected {}", rank,
                                               buffer.size(), b, layout.layers.size()));
    for (size_t l = 0; l < buffer.size(); ++l)
      if (buffer[l].size() != layout.layers[l].size())
        return error(Code::Mismatch, fmt::format("rank {} sent a memory map of layer {} with {} tensors, expected {}",
                                                 rank, l, buffer[l].size(), layout.layers[l].size()));
  }
  return Status::ok();
}

// The READ of one source rank: its receives (consecutive in canonical order).
struct PostedRead {
  int source_rank = 0;
  size_t first_receive = 0, receives = 0;
  xfer::DescriptorListId local = 0, remote = 0;
  xfer::RequestId request = 0;
  uint64_t bytes = 0;
  std::vector<int> experts;
};

class UcxPlane final : public DataPlane {
 public:
  UcxPlane(xfer::Agent& agent, ExpertStore& store) : agent_(agent), store_(store) {}
  ~UcxPlane() override {
    abandon();
    for (auto region : regions_) (void)agent_.deregister_memory(region);
  }
  std::string name() const override { return "ucx"; }
  std::string digest_kind() const override { return "xxh3-64"; }

  Result<std::string> describe() override;
  Status connect(const std::vector<std::string>& blobs, int me) override;
  Result<std::vector<uint64_t>> digest(std::span<const RowRef> rows) override;
  Status copy(std::span<const RowCopy> copies) override { return copy_rows(copies); }
  Status commit(std::span<const RowCopy> copies) override { return copy_rows(copies); }
  Status post(const LayerTransfers& transfers, Deadline deadline) override;
  Status wait(Deadline deadline) override;
  std::vector<std::optional<uint64_t>> landed_digests() override;
  void abandon() override;
  bool progress() override { return agent_.progress(); }

 private:
  int tensors(int layer) const { return int(store_.layout().layers[size_t(layer)].size()); }
  uint8_t* row(const RowRef& ref, int tensor) const {
    if (ref.buffer == RowBuffer::Staging) return store_.staging_row(ref.layer, ref.local_slot, tensor);
    return store_.buffer_row(ref.layer, int(ref.buffer), ref.local_slot, tensor);
  }
  Status copy_rows(std::span<const RowCopy> copies);
  Status post_source(const LayerTransfers& transfers, size_t first, size_t count);
  std::string where() const { return fmt::format("layer {} on rank {}", layer_, me_); }

  xfer::Agent& agent_;
  ExpertStore& store_;
  std::vector<xfer::RegionId> regions_;
  std::vector<PeerMap> peers_;
  int me_ = 0;
  int layer_ = 0;
  std::vector<PostedRead> posted_;
};

Result<std::string> UcxPlane::describe() {
  for (const auto& region : store_.regions()) {
    auto id = agent_.register_memory(region);
    if (!id) return id.status().with_context("registering " + format_bytes(region.length) + " of expert memory");
    regions_.push_back(*id);
  }
  auto metadata = agent_.export_metadata();
  if (!metadata) return metadata.status().with_context("exporting transfer metadata");
  BufferMap buffers[2];
  for (int l = 0; l < store_.layout().num_layers(); ++l) {
    for (int b = 0; b < (store_.has_spare() ? 2 : 1); ++b) {
      buffers[b].emplace_back();
      for (int t = 0; t < tensors(l); ++t)
        buffers[b].back().emplace_back(reinterpret_cast<uint64_t>(store_.buffer_row(l, b, 0, t)),
                                       store_.row_stride(l, t));
    }
  }
  bytes::Writer writer;
  writer.raw(kMapMagic);
  writer.u32(kMapVersion);
  writer.blob(agent_.name());
  writer.blob(std::string_view(reinterpret_cast<const char*>(metadata->data()), metadata->size()));
  encode_buffer(writer, buffers[0]);
  encode_buffer(writer, buffers[1]);
  return writer.take();
}

// Loads every peer's metadata; for a peer the agent knows already (an
// earlier Migrator on the same agents) this adds the regions it registered.
Status UcxPlane::connect(const std::vector<std::string>& blobs, int me) {
  me_ = me;
  for (size_t r = 0; r < blobs.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(PeerMap map, decode_peer(blobs[r], int(r)));
    EPLB_TRY(check_peer(map, int(r), store_.layout()));
    if (int(r) != me) {
      std::span<const uint8_t> metadata(reinterpret_cast<const uint8_t*>(map.metadata.data()), map.metadata.size());
      auto name = agent_.load_metadata(metadata);
      if (!name) return name.status().with_context(fmt::format("loading the transfer metadata of rank {}", r));
      if (*name != map.agent_name)
        return error(Code::Mismatch, fmt::format("rank {} announced agent '{}' but its metadata names '{}'", r,
                                                 map.agent_name, *name));
    }
    map.metadata.clear();
    peers_.push_back(std::move(map));
  }
  return Status::ok();
}

Result<std::vector<uint64_t>> UcxPlane::digest(std::span<const RowRef> rows) {
  std::vector<uint64_t> out;
  for (const RowRef& ref : rows)
    for (int t = 0; t < tensors(ref.layer); ++t)
      out.push_back(bytes::checksum(std::span<const uint8_t>(row(ref, t), store_.row_bytes(ref.layer, t))));
  return out;
}

Status UcxPlane::copy_rows(std::span<const RowCopy> copies) {
  for (const RowCopy& copy : copies)
    for (int t = 0; t < tensors(copy.to.layer); ++t)
      std::memcpy(row(copy.to, t), row(copy.from, t), store_.row_bytes(copy.to.layer, t));
  return Status::ok();
}

Status UcxPlane::post(const LayerTransfers& transfers, Deadline) {
  abandon();
  layer_ = transfers.layer;
  for (size_t first = 0; first < transfers.receives.size();) {
    size_t count = 1;
    while (first + count < transfers.receives.size() &&
           transfers.receives[first + count].source_rank == transfers.receives[first].source_rank)
      ++count;
    EPLB_TRY(post_source(transfers, first, count));
    first += count;
  }
  return Status::ok();
}

// One request for the receives [first, first + count) from one source rank.
Status UcxPlane::post_source(const LayerTransfers& transfers, size_t first, size_t count) {
  const int source = transfers.receives[first].source_rank;
  PostedRead& posted = posted_.emplace_back();
  posted.source_rank = source;
  posted.first_receive = first;
  posted.receives = count;
  std::vector<xfer::Descriptor> local, remote;
  const PeerMap& peer = peers_[size_t(source)];
  for (size_t i = first; i < first + count; ++i) {
    const RowReceive& receive = transfers.receives[i];
    posted.experts.push_back(receive.expert);
    const BufferMap& buffer = peer.buffers[receive.source_buffer == RowBuffer::Spare ? 1 : 0];
    const int source_local = receive.source_slot - source * store_.slots_per_rank();
    for (int t = 0; t < tensors(transfers.layer); ++t) {
      const uint64_t bytes = store_.row_bytes(transfers.layer, t);
      auto [base, stride] = buffer[size_t(transfers.layer)][size_t(t)];
      local.push_back({reinterpret_cast<uint64_t>(row(receive.to, t)), bytes, 0});
      remote.push_back({base + uint64_t(source_local) * stride, bytes, 0});
      posted.bytes += bytes;
    }
  }
  const std::string what = fmt::format("READ of {} descriptors ({}) from rank {} (experts {})", remote.size(),
                                       format_bytes(posted.bytes), source,
                                       fmt::join(posted.experts.begin(),
                                                 posted.experts.begin() + std::min<size_t>(posted.experts.size(), 12),
                                                 ","));
  auto fail = [&](const Status& status, const char* step) {
    return status.with_context(fmt::format("{}: {}{}", where(), step, what));
  };
  auto local_list = agent_.prepare_local(local);
  if (!local_list) return fail(local_list.status(), "preparing ");
  posted.local = *local_list;
  auto remote_list = agent_.prepare_remote(peer.agent_name, remote);
  if (!remote_list) return fail(remote_list.status(), "preparing ");
  posted.remote = *remote_list;
  auto request = agent_.make_request(xfer::Operation::Read, posted.local, {}, posted.remote, {}, {}, true);
  if (!request) return fail(request.status(), "");
  posted.request = *request;
  if (Status started = agent_.post(posted.request); !started) return fail(started, "posting ");
  return Status::ok();
}

// Waits with the deadline; a failure names every request that did not
// finish, with its peer and experts.
Status UcxPlane::wait(Deadline deadline) {
  if (posted_.empty()) return Status::ok();
  std::vector<xfer::RequestId> ids;
  for (const auto& read : posted_) ids.push_back(read.request);
  Status waited = agent_.wait(ids, deadline);
  if (waited) return waited;
  std::string detail;
  for (const auto& read : posted_) {
    auto state = agent_.status(read.request);
    if (state.state == xfer::RequestState::Done) continue;
    detail += fmt::format("{}READ from rank {} of experts {} ({}): {}", detail.empty() ? "" : "; ", read.source_rank,
                          fmt::join(read.experts, ","), format_bytes(read.bytes),
                          state.state == xfer::RequestState::Failed ? state.failure.to_string()
                                                                    : "still in progress at the deadline");
  }
  return Status(waited.code(), fmt::format("{}: {}", where(), detail.empty() ? waited.to_string() : detail));
}

std::vector<std::optional<uint64_t>> UcxPlane::landed_digests() {
  size_t total = 0;
  for (const auto& read : posted_) total = std::max(total, read.first_receive + read.receives);
  const size_t per_row = size_t(tensors(layer_));
  std::vector<std::optional<uint64_t>> out(total * per_row);
  for (const auto& read : posted_) {
    auto landed = agent_.landed_checksums(read.request);
    if (!landed || landed->size() != read.receives * per_row) continue;  // the protocol digests these rows
    for (size_t k = 0; k < landed->size(); ++k) out[read.first_receive * per_row + k] = (*landed)[k];
  }
  return out;
}

void UcxPlane::abandon() {
  for (auto& read : posted_) {
    if (read.request) (void)agent_.release(read.request);
    if (read.local) (void)agent_.release_descriptor_list(read.local);
    if (read.remote) (void)agent_.release_descriptor_list(read.remote);
  }
  posted_.clear();
}

}  // namespace

std::string_view row_buffer_name(RowBuffer buffer) {
  switch (buffer) {
    case RowBuffer::Primary: return "primary";
    case RowBuffer::Spare: return "spare";
    case RowBuffer::Staging: return "staging";
  }
  return "?";
}

std::unique_ptr<DataPlane> make_ucx_plane(xfer::Agent& agent, ExpertStore& store) {
  return std::make_unique<UcxPlane>(agent, store);
}

}  // namespace eplb
