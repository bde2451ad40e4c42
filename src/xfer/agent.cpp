// Agent: creation, memory registration, metadata export/load, peers.
#include <fmt/format.h>
#include <algorithm>
#include <cstdlib>
#include <set>

#include "agent_impl.h"
#include "common/text.h"

namespace eplb::xfer {

const char* operation_name(Operation op) {
  switch (op) {
    case Operation::Read: return "READ";
    case Operation::Write: return "WRITE";
  }
  return "UNKNOWN-OPERATION";
}

Result<std::unique_ptr<Agent>> Agent::create(const AgentConfig& config) {
  if (config.name.empty() || config.name.size() > kMaxAgentNameLength)
    return error(Code::InvalidArgument,
                 fmt::format("agent name must have 1..{} bytes, got {}", kMaxAgentNameLength, config.name.size()));
  for (char c : config.name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return error(Code::InvalidArgument, "agent name contains a control character");
  std::string secret = config.secret;  // before any backend is made: a bad one stops here
  if (secret.empty()) {
    auto job_secret = text::job_secret_from_environment();
    if (!job_secret) return job_secret.status().with_context("agent " + config.name);
    secret = std::move(job_secret).value();
  }
  Result<std::unique_ptr<Backend>> backend = error(Code::InvalidArgument, "");
  if (config.backend == "ucx")
    backend = make_ucx_backend(config);
  else if (config.backend == "loopback")
    backend = make_loopback_backend(config);
  else
    return error(Code::InvalidArgument,
                 "agent " + config.name + ": unknown backend '" + config.backend + "' (known: ucx, loopback)");
  if (!backend) return backend.status().with_context("agent " + config.name + ": backend " + config.backend);
  std::unique_ptr<Backend> chosen = std::move(backend).value();
  if (config.cma_local_peers && config.backend == "ucx") {
    auto cma = make_cma_backend(std::move(chosen));
    if (!cma) return cma.status().with_context("agent " + config.name);
    chosen = std::move(cma).value();
  }
  if (!config.fault_spec.empty()) {
    auto faulty = make_faulty_backend(std::move(chosen), config.fault_spec);
    if (!faulty) return faulty.status().with_context("agent " + config.name);
    chosen = std::move(faulty).value();
  }
  auto impl = std::make_unique<Impl>(config.name, std::move(chosen), config.map_peer_memory_eagerly);
  impl->set_secret(secret);
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

// The handle forwards to Impl.
Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;
const std::string& Agent::name() const { return impl_->name(); }
std::string Agent::backend_name() const { return impl_->backend_name(); }
std::string Agent::transports() const { return impl_->transports(); }
Result<std::vector<std::string>> Agent::peer_transports(const std::string& peer) const {
  return impl_->peer_transports(peer);
}
Result<RegionId> Agent::register_memory(const MemoryRegion& region) { return impl_->register_memory(region); }
Status Agent::deregister_memory(RegionId region) { return impl_->deregister_memory(region); }
Result<AllocatedRegion> Agent::allocate_memory(size_t length) { return impl_->allocate_memory(length); }
Result<std::vector<uint8_t>> Agent::export_metadata() const { return impl_->export_metadata(); }
Result<std::vector<uint8_t>> Agent::export_metadata(std::span<const RegionId> regions) const {
  return impl_->export_metadata(regions);
}
Result<std::string> Agent::load_metadata(std::span<const uint8_t> metadata) { return impl_->load_metadata(metadata); }
Status Agent::invalidate_peer(const std::string& peer) { return impl_->invalidate_peer(peer); }
bool Agent::knows_peer(const std::string& peer) const { return impl_->knows_peer(peer); }
Result<DescriptorListId> Agent::prepare_local(std::span<const Descriptor> descriptors, bool merge) {
  return impl_->prepare_local(descriptors, merge);
}
Result<DescriptorListId> Agent::prepare_remote(const std::string& peer, std::span<const Descriptor> descriptors,
                                               bool merge) {
  return impl_->prepare_remote(peer, descriptors, merge);
}
Result<size_t> Agent::descriptor_count(DescriptorListId list) const { return impl_->descriptor_count(list); }
Status Agent::release_descriptor_list(DescriptorListId list) { return impl_->release_descriptor_list(list); }
Result<RequestId> Agent::make_request(Operation op, DescriptorListId local, std::span<const int> local_indices,
                                      DescriptorListId remote, std::span<const int> remote_indices,
                                      const std::string& notification, bool checksum_landed) {
  return impl_->make_request(op, local, local_indices, remote, remote_indices, notification, checksum_landed);
}
Status Agent::post(RequestId request) { return impl_->post(request); }
RequestStatus Agent::status(RequestId request) { return impl_->status(request); }
Status Agent::release(RequestId request) { return impl_->release(request); }
Result<std::vector<std::optional<uint64_t>>> Agent::landed_checksums(RequestId request) {
  return impl_->landed_checksums(request);
}
Status Agent::wait(std::span<const RequestId> requests, Deadline deadline) { return impl_->wait(requests, deadline); }
Status Agent::send_notification(const std::string& peer, const std::string& message) {
  return impl_->send_notification(peer, message);
}
std::vector<Notification> Agent::take_notifications() { return impl_->take_notifications(); }
Result<std::vector<Notification>> Agent::wait_notifications(Deadline deadline) {
  return impl_->wait_notifications(deadline);
}
bool Agent::progress() { return impl_->progress(); }

Agent::Impl::Impl(std::string name, std::unique_ptr<Backend> backend, bool map_peer_memory_eagerly)
    : name_(std::move(name)), map_peer_memory_eagerly_(map_peer_memory_eagerly), backend_(std::move(backend)) {}

Agent::Impl::~Impl() {
  // Backend requests first (they cancel), then what they point into.
  requests_.clear();
  last_request_ = nullptr;
  lists_.clear();
  peers_.clear();
  regions_.clear();
  backend_.reset();
}

Result<RegionId> Agent::Impl::register_memory(const MemoryRegion& region) {
  auto address = reinterpret_cast<uintptr_t>(region.address);
  if (region.address == nullptr || region.length == 0)
    return error(Code::InvalidArgument, "agent " + name_ + ": cannot register a null or empty region");
  if (address + region.length < address)
    return error(Code::InvalidArgument, "agent " + name_ + ": region wraps around the address space");
  if (region.kind != MemoryKind::Host && region.kind != MemoryKind::Device)
    return error(Code::InvalidArgument,
                 fmt::format("agent {}: unknown memory kind {}", name_, static_cast<int>(region.kind)));
  if (region.kind == MemoryKind::Device)
    return error(Code::Unsupported, "agent " + name_ + ": device memory is not supported yet (host only)");
  auto memory = backend_->register_memory(region);
  if (!memory)
    return memory.status().with_context("agent " + name_ + ": registering " + format_bytes(region.length));
  auto state = std::make_shared<LocalRegionState>();
  state->id = next_handle();
  state->region = region;
  state->memory = std::move(memory).value();
  regions_[state->id] = state;
  return state->id;
}

Result<AllocatedRegion> Agent::Impl::allocate_memory(size_t length) {
  if (length == 0) return error(Code::InvalidArgument, "agent " + name_ + ": cannot allocate an empty region");
  // The backend may place it in shared memory (UCX falls back to a POSIX
  // segment in /dev/shm, which is RAM that no ulimit bounds): admitted as such.
  EPLB_TRY(admit_allocation(length, true, "agent " + name_ + ": allocating transfer memory"));
  void* address = nullptr;
  auto memory = backend_->allocate_memory(length, &address);
  if (!memory) return memory.status().with_context("agent " + name_ + ": allocating " + format_bytes(length));
  auto state = std::make_shared<LocalRegionState>();
  state->id = next_handle();
  state->region = MemoryRegion{address, length, MemoryKind::Host, 0};
  state->memory = std::move(memory).value();
  regions_[state->id] = state;
  return AllocatedRegion{state->id, address, length};
}

Status Agent::Impl::deregister_memory(RegionId id) {
  auto found = regions_.find(id);
  if (found == regions_.end())
    return error(Code::NotFound, fmt::format("agent {}: no registered region {}", name_, id));
  if (found->second.use_count() > 1)
    return error(
        Code::NotAllowed,
        fmt::format("agent {}: region {} is used by descriptor lists or requests; release them first", name_, id));
  regions_.erase(found);
  return Status::ok();
}

Result<AgentMetadata> Agent::Impl::build_metadata(std::span<const RegionId> ids, bool all) const {
  AgentMetadata metadata;
  metadata.agent_name = name_;
  metadata.backend_name = backend_->name();
  metadata.connection_info = backend_->connection_info();
  std::vector<const LocalRegionState*> chosen;
  if (all) {
    for (const auto& [id, state] : regions_) chosen.push_back(state.get());
  } else {
    std::set<RegionId> seen;
    for (RegionId id : ids) {
      auto found = regions_.find(id);
      if (found == regions_.end())
        return error(Code::NotFound, fmt::format("agent {}: cannot export unknown region {}", name_, id));
      if (!seen.insert(id).second)
        return error(Code::InvalidArgument, fmt::format("agent {}: region {} listed twice", name_, id));
      chosen.push_back(found->second.get());
    }
  }
  for (const LocalRegionState* state : chosen) {
    RegionMetadata region;
    region.id = state->id;
    region.address = reinterpret_cast<uintptr_t>(state->region.address);
    region.length = state->region.length;
    region.kind = state->region.kind;
    region.device_id = state->region.device_id;
    region.packed_key = state->memory->packed_remote_key();
    metadata.regions.push_back(std::move(region));
  }
  return metadata;
}

Result<std::vector<uint8_t>> Agent::Impl::export_metadata() const {
  EPLB_ASSIGN_OR_RETURN(AgentMetadata metadata, build_metadata({}, true));
  metadata.complete = true;
  return encode_metadata(metadata, secret_);
}

Result<std::vector<uint8_t>> Agent::Impl::export_metadata(std::span<const RegionId> regions) const {
  EPLB_ASSIGN_OR_RETURN(AgentMetadata metadata, build_metadata(regions, false));
  return encode_metadata(metadata, secret_);
}

// Unpacks the keys of regions not yet known; all or nothing.
Status Agent::Impl::add_remote_regions(PeerState& peer, const AgentMetadata& metadata) {
  std::map<uint64_t, std::shared_ptr<RemoteRegionState>> added;
  for (const RegionMetadata& region : metadata.regions) {
    auto known = peer.regions.find(region.id);
    if (known != peer.regions.end()) {
      if (known->second->metadata == region) continue;
      return error(
          Code::NotAllowed,
          fmt::format(
              "agent {}: metadata of agent {} changed region {} since it was loaded; invalidate_peer(\"{}\") first",
              name_, peer.name, region.id, peer.name));
    }
    auto key = backend_->unpack_remote_key(*peer.connection, region.packed_key, {region.address, region.length});
    if (!key)
      return key.status().with_context(
          fmt::format("agent {}: remote key of region {} of agent {}", name_, region.id, peer.name));
    if (map_peer_memory_eagerly_) (*key)->map_eagerly(region.address, region.length);
    added[region.id] = std::make_shared<RemoteRegionState>(RemoteRegionState{region, std::move(key).value()});
  }
  for (auto& [id, state] : added) peer.regions[id] = std::move(state);
  return Status::ok();
}

// A full export lists every region the peer has: the ones it no longer
// lists were deregistered there. They leave the peer (new lists cannot
// reach them) and lists already pointing into them become stale; their
// keys live on with those lists, so a request still running finishes.
void Agent::Impl::drop_unlisted_regions(PeerState& peer, const AgentMetadata& metadata) {
  if (!metadata.complete) return;  // a partial export says nothing about the others
  std::set<uint64_t> listed;
  for (const RegionMetadata& region : metadata.regions) listed.insert(region.id);
  bool dropped = false;
  for (auto it = peer.regions.begin(); it != peer.regions.end();) {
    if (listed.count(it->first) != 0) {
      ++it;
      continue;
    }
    it->second->withdrawn = true;
    it = peer.regions.erase(it);
    dropped = true;
  }
  if (dropped) ++peer.withdrawals;
}

Result<std::string> Agent::Impl::load_metadata(std::span<const uint8_t> bytes) {
  auto decoded = decode_metadata(bytes, secret_);
  if (!decoded) return decoded.status().with_context("agent " + name_ + ": loading peer metadata");
  const AgentMetadata& metadata = *decoded;
  if (metadata.backend_name != backend_->name())
    return error(Code::Mismatch, "agent " + name_ + ": agent " + metadata.agent_name + " uses backend " +
                                     metadata.backend_name + ", this agent uses " + backend_->name());
  auto known = peers_.find(metadata.agent_name);
  if (known != peers_.end()) {
    PeerState& peer = *known->second;
    if (peer.connection_info != metadata.connection_info)
      return error(Code::NotAllowed, "agent " + name_ + ": connection info of agent " + peer.name +
                                         " changed since it was loaded (restarted?); invalidate_peer(\"" + peer.name +
                                         "\") first");
    EPLB_TRY(add_remote_regions(peer, metadata));
    drop_unlisted_regions(peer, metadata);
    return metadata.agent_name;
  }
  auto connection = backend_->connect(metadata.agent_name, metadata.connection_info);
  if (!connection)
    return connection.status().with_context("agent " + name_ + ": connecting to agent " + metadata.agent_name);
  auto peer = std::make_shared<PeerState>();
  peer->name = metadata.agent_name;
  peer->generation = peer_generations_[peer->name];
  peer->connection_info = metadata.connection_info;
  peer->connection = std::move(connection).value();
  EPLB_TRY(add_remote_regions(*peer, metadata));
  peers_[peer->name] = std::move(peer);
  return metadata.agent_name;
}

Result<std::vector<std::string>> Agent::Impl::peer_transports(const std::string& peer) const {
  auto found = peers_.find(peer);
  if (found == peers_.end()) return error(Code::NotFound, "agent " + name_ + ": unknown peer " + peer);
  return backend_->peer_transports(*found->second->connection);
}

Status Agent::Impl::invalidate_peer(const std::string& name) {
  auto found = peers_.find(name);
  if (found == peers_.end()) return error(Code::NotFound, "agent " + name_ + ": unknown peer " + name);
  // Running transfers against the peer are canceled: their keys go away.
  for (auto& [id, request] : requests_) {
    if (request->remote->peer != found->second) continue;
    request->backend.reset();  // finished ones too: no repost against a gone peer
    if (request->phase != RequestPhase::InProgress) continue;
    request->phase = RequestPhase::Failed;
    request->failure = error(Code::Canceled, describe(*request) + " canceled after " +
                                                 format_seconds(request->since_post.seconds()) + ": agent " + name +
                                                 " was invalidated");
  }
  ++peer_generations_[name];
  found->second->invalidated = true;
  peers_.erase(found);
  return Status::ok();
}

}  // namespace eplb::xfer
