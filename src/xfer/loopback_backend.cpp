// loopback: an in-process backend. Agents of one process find each other in
// a process-wide registry; transfers are memcpy/memmove done on the first
// poll, under the registry lock, after checking that the peer and its region
// still exist. "Done" therefore means the bytes were copied; a destroyed
// peer gives RemoteDisconnect, a deregistered remote region a Backend error.
#include <unistd.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "backend.h"
#include "common/bytes.h"

namespace eplb::xfer {
namespace {

constexpr uint8_t kConnectionMagic[4] = {'L', 'B', 'C', '1'};
constexpr uint8_t kKeyMagic[4] = {'L', 'B', 'K', '1'};
constexpr size_t kConnectionInfoLength = 4 + 4 + 8;  // magic, pid, instance
constexpr size_t kKeyLength = 4 + 8 + 8 + 8 + 8;     // magic, instance, registration, address, length

class LoopbackBackend;

struct LoopbackRegistry {
  std::mutex mutex;
  uint64_t next_instance = 1;
  std::unordered_map<uint64_t, LoopbackBackend*> live;
};

LoopbackRegistry& registry() {
  static auto* instance = new LoopbackRegistry();  // never destroyed: agents may outlive static destruction order
  return *instance;
}

uint64_t get_u64(const uint8_t* in) { return bytes::load<uint64_t>(in); }

struct RegisteredRange {
  uint64_t address = 0;
  uint64_t length = 0;
};

// Mutable state of one backend instance; guarded by registry().mutex.
struct InstanceState {
  uint64_t next_registration = 1;
  std::unordered_map<uint64_t, RegisteredRange> registrations;
  std::deque<Notification> inbox;
};

class LoopbackMemory final : public BackendMemory {
 public:
  LoopbackMemory(InstanceState* state, uint64_t instance, uint64_t registration, RegisteredRange range)
      : state_(state), instance_(instance), registration_(registration), range_(range) {}
  ~LoopbackMemory() override {
    std::lock_guard lock(registry().mutex);
    state_->registrations.erase(registration_);
  }
  std::vector<uint8_t> packed_remote_key() const override {
    bytes::Writer key;
    key.raw(std::string_view(reinterpret_cast<const char*>(kKeyMagic), 4));
    key.u64(instance_);
    key.u64(registration_);
    key.u64(range_.address);
    key.u64(range_.length);
    return key.take_vector();
  }

 private:
  InstanceState* state_;
  uint64_t instance_;
  uint64_t registration_;
  RegisteredRange range_;
};

struct LoopbackPeer final : BackendPeer {
  std::string name;
  uint64_t instance = 0;
};

struct LoopbackKey final : BackendRemoteKey {
  uint64_t registration = 0;
  RegisteredRange range;
};

class LoopbackBackend final : public Backend {
 public:
  LoopbackBackend() {
    std::lock_guard lock(registry().mutex);
    instance_ = registry().next_instance++;
    registry().live[instance_] = this;
  }
  ~LoopbackBackend() override {
    std::lock_guard lock(registry().mutex);
    registry().live.erase(instance_);
  }

  // Guarded by registry().mutex.
  InstanceState& state() { return state_; }

  std::string name() const override { return "loopback"; }
  std::string transports() const override { return "loopback: in-process copies"; }

  std::vector<uint8_t> connection_info() const override {
    bytes::Writer info;
    info.raw(std::string_view(reinterpret_cast<const char*>(kConnectionMagic), 4));
    info.u32(static_cast<uint32_t>(getpid()));
    info.u64(instance_);
    return info.take_vector();
  }

  Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion& region) override {
    std::lock_guard lock(registry().mutex);
    uint64_t registration = state_.next_registration++;
    RegisteredRange range{reinterpret_cast<uintptr_t>(region.address), region.length};
    state_.registrations[registration] = range;
    return std::unique_ptr<BackendMemory>(new LoopbackMemory(&state_, instance_, registration, range));
  }

  Result<std::unique_ptr<BackendPeer>> connect(const std::string& peer_name,
                                               std::span<const uint8_t> info) override {
    if (info.size() != kConnectionInfoLength || std::memcmp(info.data(), kConnectionMagic, 4) != 0)
      return error(Code::Mismatch, fmt::format("loopback: connection info of agent {} is not a loopback address ({} "
                                               "bytes)",
                                               peer_name, info.size()));
    const uint32_t pid = bytes::load<uint32_t>(info.data() + 4);
    if (pid != static_cast<uint32_t>(getpid()))
      return error(Code::Unsupported, fmt::format("loopback: agent {} lives in process {}, this is process {}; the "
                                                  "loopback backend only connects agents of one process (use ucx)",
                                                  peer_name, pid, getpid()));
    uint64_t instance = get_u64(info.data() + 8);
    {
      std::lock_guard lock(registry().mutex);
      if (registry().live.count(instance) == 0)
        return error(Code::RemoteDisconnect,
                     fmt::format("loopback: agent {} (instance {}) no longer exists", peer_name, instance));
    }
    auto peer = std::make_unique<LoopbackPeer>();
    peer->name = peer_name;
    peer->instance = instance;
    return std::unique_ptr<BackendPeer>(std::move(peer));
  }

  Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer& peer, std::span<const uint8_t> packed,
                                                              const KeyRegion&) override {
    auto& loopback_peer = static_cast<LoopbackPeer&>(peer);
    if (packed.size() != kKeyLength || std::memcmp(packed.data(), kKeyMagic, 4) != 0)
      return error(Code::Mismatch, fmt::format("loopback: malformed remote key ({} bytes)", packed.size()));
    if (get_u64(packed.data() + 4) != loopback_peer.instance)
      return error(Code::Mismatch, "loopback: remote key belongs to another agent than " + loopback_peer.name);
    auto key = std::make_unique<LoopbackKey>();
    key->registration = get_u64(packed.data() + 12);
    key->range = {get_u64(packed.data() + 20), get_u64(packed.data() + 28)};
    return std::unique_ptr<BackendRemoteKey>(std::move(key));
  }

  Result<std::unique_ptr<BackendRequest>> post(Operation op, BackendPeer& peer, std::span<const TransferSegment> segments,
                                               const std::string& self_name,
                                               const std::string& notification) override;

  Status send_notification(BackendPeer& peer, const std::string& self_name, const std::string& message) override {
    auto& loopback_peer = static_cast<LoopbackPeer&>(peer);
    std::lock_guard lock(registry().mutex);
    return deliver_locked(loopback_peer, self_name, message);
  }

  std::vector<Notification> take_notifications() override {
    std::lock_guard lock(registry().mutex);
    std::vector<Notification> taken(std::make_move_iterator(state_.inbox.begin()),
                                    std::make_move_iterator(state_.inbox.end()));
    state_.inbox.clear();
    return taken;
  }

  bool progress() override { return false; }

  // Caller holds registry().mutex.
  static Status deliver_locked(const LoopbackPeer& peer, const std::string& from, const std::string& message) {
    auto found = registry().live.find(peer.instance);
    if (found == registry().live.end())
      return error(Code::RemoteDisconnect, "loopback: agent " + peer.name + " was destroyed");
    found->second->state().inbox.push_back(Notification{from, message});
    return Status::ok();
  }

 private:
  uint64_t instance_ = 0;
  InstanceState state_;
};

class LoopbackRequest final : public BackendRequest {
 public:
  LoopbackRequest(Operation op, const LoopbackPeer& peer, std::span<const TransferSegment> segments,
                  std::string self_name, std::string notification)
      : op_(op), peer_(peer), segments_(segments.begin(), segments.end()), self_name_(std::move(self_name)),
        notification_(std::move(notification)) {}

  RequestState poll(Status* failure) override {
    if (state_ == RequestState::InProgress) run();
    if (state_ == RequestState::Failed && failure) *failure = failure_;
    return state_;
  }

 private:
  void finish(Code code, std::string text) {
    state_ = RequestState::Failed;
    failure_ = error(code, std::move(text));
  }

  void run() {
    std::lock_guard lock(registry().mutex);
    auto found = registry().live.find(peer_.instance);
    if (found == registry().live.end())
      return finish(Code::RemoteDisconnect, "loopback: agent " + peer_.name + " was destroyed");
    const InstanceState& remote = found->second->state();
    for (const TransferSegment& segment : segments_) {
      const auto& key = static_cast<const LoopbackKey&>(*segment.remote_key);
      auto registration = remote.registrations.find(key.registration);
      if (registration == remote.registrations.end())
        return finish(Code::Backend, "loopback: agent " + peer_.name + " deregistered the remote region");
      const RegisteredRange& range = registration->second;
      if (segment.remote_address < range.address || segment.remote_address - range.address > range.length ||
          segment.length > range.length - (segment.remote_address - range.address))
        return finish(Code::Backend, "loopback: remote range outside the registered region");
    }
    for (const TransferSegment& segment : segments_) {
      auto* remote_address = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(segment.remote_address));
      if (op_ == Operation::Read) {
        std::memmove(segment.local_address, remote_address, segment.length);
        if (segment.landed_checksum != nullptr)
          *segment.landed_checksum = bytes::checksum(std::span<const uint8_t>(segment.local_address, segment.length));
      } else {
        std::memmove(remote_address, segment.local_address, segment.length);
      }
    }
    if (!notification_.empty()) {
      Status delivered = LoopbackBackend::deliver_locked(peer_, self_name_, notification_);
      if (!delivered) return finish(delivered.code(), delivered.message());
    }
    state_ = RequestState::Done;
  }

  Operation op_;
  LoopbackPeer peer_;
  std::vector<TransferSegment> segments_;
  std::string self_name_;
  std::string notification_;
  RequestState state_ = RequestState::InProgress;
  Status failure_;
};

Result<std::unique_ptr<BackendRequest>> LoopbackBackend::post(Operation op, BackendPeer& peer,
                                                              std::span<const TransferSegment> segments,
                                                              const std::string& self_name,
                                                              const std::string& notification) {
  const auto& loopback_peer = static_cast<const LoopbackPeer&>(peer);
  return std::unique_ptr<BackendRequest>(new LoopbackRequest(op, loopback_peer, segments, self_name, notification));
}

}  // namespace

Result<std::unique_ptr<Backend>> make_loopback_backend(const AgentConfig&) {
  return std::unique_ptr<Backend>(new LoopbackBackend());
}

}  // namespace eplb::xfer
