// agent_impl.h - Agent::Impl, the state behind the Agent handle (pimpl).
// Internal to src/xfer/.
//
// Ownership: the backend outlives everything; requests hold their
// descriptor lists, lists hold the regions / peer they point into, so a
// backend object is never destroyed while something can still use it.
// Destruction order inside AgentImpl: requests, lists, peers, regions,
// backend (member order below, reversed).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "eplb/xfer.h"
#include "metadata.h"

namespace eplb::xfer {

struct LocalRegionState {
  RegionId id = 0;
  MemoryRegion region;
  std::unique_ptr<BackendMemory> memory;
};

// A peer's region. Lists that point into it share it, so its key outlives
// the peer's entry: a region the peer's full metadata no longer lists is
// `withdrawn` and dropped from the peer, and lists using it are stale.
struct RemoteRegionState {
  RegionMetadata metadata;
  std::unique_ptr<BackendRemoteKey> key;
  bool withdrawn = false;
};

// A loaded peer. Member order: keys are destroyed before the connection.
struct PeerState {
  std::string name;
  uint64_t generation = 0;
  bool invalidated = false;  // invalidate_peer(): every list against it is stale
  uint64_t withdrawals = 0;  // how many times a full export dropped regions
  std::vector<uint8_t> connection_info;
  std::unique_ptr<BackendPeer> connection;
  std::map<uint64_t, std::shared_ptr<RemoteRegionState>> regions;  // by the peer's region id
};

struct ListEntry {
  uint64_t address = 0;
  uint64_t length = 0;
  const BackendMemory* local_memory = nullptr;  // local lists
  const BackendRemoteKey* remote_key = nullptr;  // remote lists
};

struct DescriptorListState {
  bool remote = false;
  std::shared_ptr<PeerState> peer;  // remote lists
  uint64_t peer_generation = 0;  // the peer's generation when prepared (for messages)
  std::vector<std::shared_ptr<LocalRegionState>> regions;  // local lists: the regions entries point into
  std::vector<std::shared_ptr<RemoteRegionState>> remote_regions;  // remote lists: the same
  mutable uint64_t withdrawals_checked = 0;  // the peer's withdrawals when last found not stale
  std::vector<ListEntry> entries;
};

enum class RequestPhase : uint8_t { Idle, InProgress, Done, Failed };

struct RequestStateRecord {
  Operation op = Operation::Read;
  std::shared_ptr<DescriptorListState> local;
  std::shared_ptr<DescriptorListState> remote;
  std::vector<TransferSegment> segments;
  // Per segment when made with checksum_landed (segments point here), else empty.
  std::vector<std::optional<uint64_t>> landed;
  std::string notification;
  uint64_t total_bytes = 0;
  RequestPhase phase = RequestPhase::Idle;
  Status failure;
  Stopwatch since_post;
  std::unique_ptr<BackendRequest> backend;
};

class Agent::Impl {
 public:
  Impl(std::string name, std::unique_ptr<Backend> backend, bool map_peer_memory_eagerly = false);
  ~Impl();

  const std::string& name() const { return name_; }
  // Seals exported metadata and requires loaded metadata sealed (AgentConfig::secret).
  void set_secret(std::string secret) { secret_ = std::move(secret); }
  std::string backend_name() const { return backend_->name(); }
  std::string transports() const { return backend_->transports(); }
  Result<std::vector<std::string>> peer_transports(const std::string& peer) const;

  Result<RegionId> register_memory(const MemoryRegion& region);
  Status deregister_memory(RegionId region);
  Result<AllocatedRegion> allocate_memory(size_t length);

  Result<std::vector<uint8_t>> export_metadata() const;
  Result<std::vector<uint8_t>> export_metadata(std::span<const RegionId> regions) const;
  Result<std::string> load_metadata(std::span<const uint8_t> metadata);
  Status invalidate_peer(const std::string& peer);
  bool knows_peer(const std::string& peer) const { return peers_.count(peer) != 0; }

  Result<DescriptorListId> prepare_local(std::span<const Descriptor> descriptors, bool merge);
  Result<DescriptorListId> prepare_remote(const std::string& peer, std::span<const Descriptor> descriptors,
                                          bool merge);
  Result<size_t> descriptor_count(DescriptorListId list) const;
  Status release_descriptor_list(DescriptorListId list);

  Result<RequestId> make_request(Operation op, DescriptorListId local, std::span<const int> local_indices,
                                 DescriptorListId remote, std::span<const int> remote_indices,
                                 const std::string& notification, bool checksum_landed);
  Status post(RequestId request);
  Result<std::vector<std::optional<uint64_t>>> landed_checksums(RequestId request);
  RequestStatus status(RequestId request);
  Status release(RequestId request);
  Status wait(std::span<const RequestId> requests, Deadline deadline);

  Status send_notification(const std::string& peer, const std::string& message);
  std::vector<Notification> take_notifications();
  Result<std::vector<Notification>> wait_notifications(Deadline deadline);

  bool progress() { return backend_->progress(); }

 private:
  uint64_t next_handle() { return next_handle_++; }
  // The request `id`, or null. Remembers the last one found: a reposted
  // request is posted and polled by the same id over and over.
  RequestStateRecord* find_request(RequestId id) {
    if (id == last_request_id_ && last_request_ != nullptr) return last_request_;
    auto found = requests_.find(id);
    if (found == requests_.end()) return nullptr;
    last_request_id_ = id;
    last_request_ = found->second.get();
    return last_request_;
  }
  Result<AgentMetadata> build_metadata(std::span<const RegionId> regions, bool all) const;
  Status add_remote_regions(PeerState& peer, const AgentMetadata& metadata);
  void drop_unlisted_regions(PeerState& peer, const AgentMetadata& metadata);
  // Polls one request's backend (if running) and updates its phase.
  void poll(RequestStateRecord& request);
  void start_clock_unless_done(RequestStateRecord& request);
  std::string describe(const RequestStateRecord& request) const;  // "READ of 9 descriptors (396 MiB) from agent x"
  // A remote list is stale once its peer was invalidated (even if reloaded
  // since) or a region it points into was withdrawn. Cheap while neither
  // happened: two loads, no lookup (it runs on every post).
  bool is_stale(const DescriptorListState& list) const {
    return list.remote && (list.peer->invalidated ||
                           (list.peer->withdrawals != list.withdrawals_checked && uses_withdrawn_region(list)));
  }
  bool uses_withdrawn_region(const DescriptorListState& list) const;
  Status stale_list_error(const DescriptorListState& list, const std::string& what) const;
  Status fail_request(RequestStateRecord& request, const Status& backend_failure);

  std::string name_;
  bool map_peer_memory_eagerly_ = false;
  std::string secret_;  // AgentConfig::secret (or EPLB_RUN_SECRET): seals metadata
  uint64_t next_handle_ = 1;
  std::unique_ptr<Backend> backend_;
  std::map<RegionId, std::shared_ptr<LocalRegionState>> regions_;
  std::map<std::string, uint64_t> peer_generations_;  // survives invalidation
  std::map<std::string, std::shared_ptr<PeerState>> peers_;
  std::map<DescriptorListId, std::shared_ptr<DescriptorListState>> lists_;
  std::map<RequestId, std::unique_ptr<RequestStateRecord>> requests_;
  RequestId last_request_id_ = 0;  // find_request's memory; cleared by release
  RequestStateRecord* last_request_ = nullptr;
};

}  // namespace eplb::xfer
