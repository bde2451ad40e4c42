// backend.h - the interface between the xfer Agent and a transport backend
// (ucx, loopback) or a decorator (faulty). Internal to src/xfer/.
//
// The Agent owns all validation (descriptors inside registered regions,
// handle lifetimes, metadata parsing, message formatting). A backend only
// moves bytes between already-validated addresses and reports what its
// transport said. Backend calls come from the Agent's single caller thread
// (and the backend's own progress thread if it runs one).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eplb/status.h"
#include "eplb/xfer.h"

namespace eplb::xfer {

// A local registration: whatever the backend needs to use the memory locally
// plus the packed remote key a peer needs to access it.
class BackendMemory {
 public:
  virtual ~BackendMemory() = default;
  virtual std::vector<uint8_t> packed_remote_key() const = 0;
};

// A connection to a peer, made from its exported connection info.
class BackendPeer {
 public:
  virtual ~BackendPeer() = default;
};

// A peer's region key, unpacked against a connection.
class BackendRemoteKey {
 public:
  virtual ~BackendRemoteKey() = default;
  // Best effort, no error: make [address, address + length) of the peer's
  // region cheap to access from now on (with UCX shared memory: populate
  // this process's page tables for the mapped segment, so the first READ of
  // each page does not pay a page fault). Default: nothing to do.
  virtual void map_eagerly(uint64_t address, uint64_t length) { (void)address, (void)length; }
};

// One contiguous transfer: `length` bytes between local and remote addresses.
// landed_checksum (READ, optional): a backend that copies the bytes itself
// stores there the checksum (bytes::checksum) of the bytes that landed,
// computed while copying; one that does not leaves it as it is (the Agent
// empties it before every post). A backend that changes landed bytes after
// the copy (fault injection) empties it again.
struct TransferSegment {
  uint8_t* local_address = nullptr;
  const BackendMemory* local_memory = nullptr;
  uint64_t remote_address = 0;
  const BackendRemoteKey* remote_key = nullptr;
  uint64_t length = 0;
  std::optional<uint64_t>* landed_checksum = nullptr;
};

// A posted transfer. poll() drives it forward (non-blocking).
class BackendRequest {
 public:
  virtual ~BackendRequest() = default;  // cancels if still running
  // InProgress, Done, or Failed with *failure = {code, backend's own text},
  // e.g. {RemoteDisconnect, "UCX: Connection reset by remote peer"}.
  virtual RequestState poll(Status* failure) = 0;
  // Starts the same transfer again on this object, once it is Done, without
  // allocating (NIXL's reposted request). False: not supported or not Done;
  // the Agent then posts a new request. Default: false.
  virtual bool repost() { return false; }
};

// The remote region a packed key is for (RegionMetadata's address, length).
struct KeyRegion {
  uint64_t address = 0;
  uint64_t length = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What moves the bytes, for reports (see Agent::transports()).
  virtual std::string transports() const { return name(); }
  // The transports the connection to `peer` uses (UCX: its lanes).
  virtual std::vector<std::string> peer_transports(BackendPeer& peer) const { return {name()}; }
  // Bytes a peer needs to connect to us (e.g. the UCX worker address).
  virtual std::vector<uint8_t> connection_info() const = 0;

  virtual Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion& region) = 0;
  // Allocates and registers `length` bytes owned by the returned memory
  // object (freed with it); *address receives the start. Default: Unsupported.
  virtual Result<std::unique_ptr<BackendMemory>> allocate_memory(size_t length, void** address) {
    return Status(Code::Unsupported, name() + " backend cannot allocate memory");
  }
  virtual Result<std::unique_ptr<BackendPeer>> connect(const std::string& peer_name,
                                                       std::span<const uint8_t> connection_info) = 0;
  // `region` is the region the key is for, as the peer's metadata gives
  // it (address and length in the peer's address space): a backend whose
  // keys carry their own geometry checks that the key covers it.
  virtual Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer& peer,
                                                                      std::span<const uint8_t> packed_key,
                                                                      const KeyRegion& region) = 0;

  // Starts the transfer of all segments; when they have landed, delivers
  // `notification` (if not empty) to the peer as coming from `self_name`.
  virtual Result<std::unique_ptr<BackendRequest>> post(Operation op, BackendPeer& peer,
                                                       std::span<const TransferSegment> segments,
                                                       const std::string& self_name,
                                                       const std::string& notification) = 0;

  virtual Status send_notification(BackendPeer& peer, const std::string& self_name, const std::string& message) = 0;
  virtual std::vector<Notification> take_notifications() = 0;
  // One round of progress; true when it handled any event (a caller polling
  // on behalf of peers may back off while nothing happens).
  virtual bool progress() = 0;
};

// Factories (defined in their backend's .cpp).
Result<std::unique_ptr<Backend>> make_ucx_backend(const AgentConfig& config);
Result<std::unique_ptr<Backend>> make_loopback_backend(const AgentConfig& config);
// Wraps `inner`: READ / WRITE of peers on this host by cross-memory attach (cma_backend.cpp).
Result<std::unique_ptr<Backend>> make_cma_backend(std::unique_ptr<Backend> inner);
// Wraps `inner` with deterministic fault injection parsed from `spec`.
Result<std::unique_ptr<Backend>> make_faulty_backend(std::unique_ptr<Backend> inner, const std::string& spec);

}  // namespace eplb::xfer
