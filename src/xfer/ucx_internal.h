// ucx_internal.h - the UCX backend's shared state (internal to src/xfer/).
//
// Ownership: every UCX object is reached through a shared_ptr chain that
// mirrors UCX's own lifetime rules, so the Agent may destroy handles in any
// order:
//   UcxRequest  -> UcxPeerState (endpoint)  -> UcxWorkerState (worker, context)
//   UcxRemoteKey -> UcxPeerState
//   UcxMemory   -> UcxWorkerState
// The last owner of a state tears it down: requests are canceled and
// drained, rkeys destroyed, the endpoint closed (forced when the peer is
// dead, bounded by a deadline), memory unmapped, then the worker and the
// context. Single-threaded: everything runs on the Agent's caller thread.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend.h"

namespace eplb::xfer::ucx {

// Active-message id used for notifications.
inline constexpr unsigned kNotificationAmId = 0x6e;
// Largest notification payload accepted or sent (sender name + message).
inline constexpr size_t kMaxNotificationBytes = 1 << 20;
// How long teardown may wait for UCX to close an endpoint or drain requests.
inline constexpr double kTeardownSeconds = 0.5;

// "UCX: <ucs_status_string>".
std::string ucx_text(ucs_status_t status);
// Transport status -> eplb code: connection loss -> RemoteDisconnect,
// UCS_ERR_CANCELED -> Canceled, anything else -> Backend.
Code code_for(ucs_status_t status);
Status status_for(ucs_status_t status, const std::string& context);

// The parts of a packed UCX worker address that UCX's unpacker and its
// transports take on trust (ucx_address.cpp has the layout).
enum class AddressFormat { V1, V2 };  // UCX's packed address formats
struct WorkerAddressShape {
  AddressFormat format = AddressFormat::V1;
  struct Interface {
    uint16_t checksum = 0;  // of the transport's name
    size_t device_length = 0, interface_length = 0;
    size_t offset = 0;  // where its entry starts
    size_t device_offset = 0, interface_offset = 0;  // where its addresses start
    int md_index = 0;  // the md (in the address owner's numbering) its packed keys use
    // This process's own shared-memory interfaces (measure_segments): the
    // size of the FIFO segment the interface address names, and the device
    // and interface addresses (the host's id; the segment id, namespace or
    // path that follow it).
    std::optional<uint64_t> segment_size;
    std::vector<uint8_t> device_address, interface_address;
    // A peer's shared-memory interface that UCX would reach (this host, this
    // namespace: check_shared_memory, which also keeps its interface_address);
    // only those are probed, here and in keys.
    bool on_this_host = false;
  };
  std::vector<Interface> interfaces;
};
struct UcxWorkerState;

// Where an endpoint's error callback lands. Owned by the worker state and
// kept until the worker is destroyed, so a late callback never touches a
// freed peer; `peer` is cleared when the peer state goes away.
struct EndpointErrorSlot {
  struct UcxPeerState* peer = nullptr;
};

// A standalone notification UCX has not finished sending yet.
struct ParkedSend {
  void* request = nullptr;
  std::unique_ptr<std::vector<uint8_t>> payload;  // must outlive the request
};

struct UcxWorkerState {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<Notification> notifications;
  std::vector<std::unique_ptr<EndpointErrorSlot>> error_slots;
  std::vector<ParkedSend> parked_sends;
  uint64_t dropped_notifications = 0;
  bool copy_mapped_memory = true;  // AgentConfig::copy_mapped_memory

  UcxWorkerState() = default;
  UcxWorkerState(const UcxWorkerState&) = delete;
  UcxWorkerState& operator=(const UcxWorkerState&) = delete;
  ~UcxWorkerState();

  unsigned progress() { return ucp_worker_progress(worker); }
  // Progresses until `request` (a UCS status pointer) completes or `seconds`
  // pass; returns its final status (UCS_INPROGRESS if the time ran out).
  // Frees the request when it completed.
  ucs_status_t wait_request(void* request, double seconds);
  // Frees the parked sends UCX has finished with.
  void reap_parked_sends();
};

struct UcxPeerState {
  std::shared_ptr<UcxWorkerState> worker;
  std::string name;
  ucp_ep_h endpoint = nullptr;
  EndpointErrorSlot* error_slot = nullptr;
  // Set by the endpoint error callback: the peer is gone.
  bool failed = false;
  // False when the transports cannot detect peer failure (UCX 1.13 mm).
  bool peer_failure_handling = true;
  ucs_status_t failure = UCS_OK;
  WorkerAddressShape address;  // the peer's, as checked (check_worker_address)

  UcxPeerState() = default;
  UcxPeerState(const UcxPeerState&) = delete;
  UcxPeerState& operator=(const UcxPeerState&) = delete;
  ~UcxPeerState();
};

class UcxMemory final : public BackendMemory {
 public:
  UcxMemory(std::shared_ptr<UcxWorkerState> worker, ucp_mem_h memh, std::vector<uint8_t> packed)
      : worker_(std::move(worker)), memh_(memh), packed_(std::move(packed)) {}
  ~UcxMemory() override;
  std::vector<uint8_t> packed_remote_key() const override { return packed_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  std::shared_ptr<UcxWorkerState> worker_;
  ucp_mem_h memh_;
  std::vector<uint8_t> packed_;
};

class UcxPeer final : public BackendPeer {
 public:
  explicit UcxPeer(std::shared_ptr<UcxPeerState> state) : state_(std::move(state)) {}
  const std::shared_ptr<UcxPeerState>& state() const { return state_; }

 private:
  std::shared_ptr<UcxPeerState> state_;
};

class UcxRemoteKey final : public BackendRemoteKey {
 public:
  UcxRemoteKey(std::shared_ptr<UcxPeerState> peer, ucp_rkey_h rkey) : peer_(std::move(peer)), rkey_(rkey) {}
  ~UcxRemoteKey() override;
  ucp_rkey_h rkey() const { return rkey_; }
  const UcxPeerState* peer() const { return peer_.get(); }
  // Where UCX maps the peer's memory into this process (shared memory),
  // populates the page tables of that mapping; otherwise nothing.
  void map_eagerly(uint64_t address, uint64_t length) override;
  // This process's address of the peer's byte at `address` when UCX maps
  // the peer's memory here (shared memory: ucp_rkey_ptr), else nullptr.
  uint8_t* mapped(uint64_t address) const;

 private:
  std::shared_ptr<UcxPeerState> peer_;
  ucp_rkey_h rkey_;
  mutable bool unmappable_ = false;  // ucp_rkey_ptr failed once: not shared memory
};

// Sends `payload` as a notification active message; the returned status
// pointer (may be NULL = done, or an error) must be tracked by the caller.
ucs_status_ptr_t send_notification_am(UcxPeerState& peer, const std::vector<uint8_t>& payload);
// Encodes a notification payload: u32 little-endian name length, name, message.
std::vector<uint8_t> encode_notification(const std::string& sender, const std::string& message);

// Posts the transfer: one ucp_get_nbx / ucp_put_nbx per segment, for a WRITE
// then an endpoint flush; once all completed, the optional notification.
Result<std::unique_ptr<BackendRequest>> post_ucx_request(Operation op, const std::shared_ptr<UcxPeerState>& peer,
                                                         std::span<const TransferSegment> segments,
                                                         std::vector<uint8_t> notification_payload);

// What UCX 1.13's ucp_ep_rkey_unpack dereferences of a packed key, checked
// before it is handed over (UCX trusts the bytes: a memory type out of range
// indexes its tables, sizes run past the key): md map u64 (not 0) | memory
// type u8 (< UCS_MEMORY_TYPE_LAST) | per md in the map: size u8 + that many
// bytes, all inside the key. Mismatch naming the peer and the offset otherwise.
// With `remote` (the peer's checked worker address), each md's part of the
// key is also checked by the shared-memory transport on this host the
// address puts at that md (check_key_part): the segment it names opens,
// holds the key's length, and the key covers `region`.
Status check_packed_key(std::span<const uint8_t> key, const std::string& peer,
                        const WorkerAddressShape* remote = nullptr, const KeyRegion& region = {});

// Walks a packed worker address, every field inside `address` and nothing
// after the last device; Mismatch naming `whose` and the offset otherwise.
Result<WorkerAddressShape> read_worker_address(std::span<const uint8_t> address, const std::string& whose);
// A key's part for `md`, against the shared-memory transports on this host
// `remote` puts at that md: not empty, its segment can be opened (posix) or
// attached (sysv) as UCX will, and the part's mapping covers `region`.
Status check_key_part(int md, std::span<const uint8_t> part, const WorkerAddressShape& remote,
                      const KeyRegion& region, const std::string& peer);
// Sets segment_size (and device_address, interface_address) of `shape`'s
// shared-memory interfaces (posix, sysv) whose segment can be found: the
// FIFO sizes this process's UCX maps (ucx_shared_memory.cpp).
void measure_segments(std::span<const uint8_t> address, WorkerAddressShape& shape);
// Marks the shared-memory interfaces of a peer's `remote` address that UCX
// would reach from `local` (measured) on_this_host, and checks the FIFO
// segment each names (Mismatch naming the peer otherwise).
Status check_shared_memory(std::span<const uint8_t> address, WorkerAddressShape& remote,
                           const WorkerAddressShape& local, const std::string& peer);
// A peer's address walks cleanly; each of its shared-memory interfaces that
// UCX would reach (same host id and namespace as one of `local`'s, measured)
// is marked on_this_host and names a segment at least as large as local's
// FIFO, in local's directory when it names one by path.
Result<WorkerAddressShape> check_worker_address(std::span<const uint8_t> address, const WorkerAddressShape& local,
                                                const std::string& peer);

// Narrows this process's System V segments from UCX's 0660 to 0600
// (ucx_shm_mode.cpp); returns how many it changed.
int restrict_own_sysv_segments();

}  // namespace eplb::xfer::ucx
