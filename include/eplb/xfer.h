// eplb/xfer.h - a general one-sided transfer library (NIXL-style).
// Knows nothing about experts; usable on its own.
//
// Model: an Agent (unique name, one backend) registers memory regions once,
// exports its metadata (name, backend connection info, regions and their
// packed remote keys) as bytes, and loads its peers' metadata. Descriptor
// lists are prepared once against the local agent or a named peer; requests
// pick descriptors by index: READ pulls remote bytes into local memory,
// WRITE pushes local bytes to remote memory. post() starts a request,
// status() drives progress and reports InProgress / Done / Failed, wait()
// blocks until all are done, the first failure, or the deadline. release()
// cancels a running request and frees it.
//
// Guarantees:
// - Every remote descriptor lies inside one region the peer registered, with
//   the same device id; otherwise NotFound naming the descriptor and peer,
//   checked when the list is prepared, before any byte moves.
// - Metadata is untrusted input: a versioned binary format (magic, version,
//   explicit lengths); truncated, oversized or garbled bytes -> Mismatch.
// - Reloading a known peer's metadata with different content -> NotAllowed
//   unless invalidate_peer() came first; lists prepared before an
//   invalidation fail with NotAllowed afterwards.
// - "Done" means the bytes have landed: a READ's in local memory, a WRITE's at
//   the peer (the backend flushed).
// - A failure's message names the operation, the peer, the number of
//   descriptors and bytes, the backend's own error text and the elapsed time:
//   "READ of 9 descriptors (396 MiB) from agent rank-3 failed after 1.8 s:
//    remote disconnect (UCX: Connection reset by remote peer)".
// - No blocking call without a Deadline.
//
// Thread safety: an Agent is used by one thread at a time (calls must not
// overlap); different agents may be used from different threads. Progress
// is driven by status(), wait(), progress() and the notification calls
// (there is no progress thread).
//
// Transports: AgentConfig::transports / net_devices choose UCX's transports
// and devices through UCX's configuration API (ucp_config_modify), per
// agent; a UCX_TLS or UCX_NET_DEVICES in the environment wins over them.
// transports() says what the agent was given and from where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eplb/common.h"
#include "eplb/status.h"

namespace eplb::xfer {

enum class MemoryKind : uint8_t { Host = 0, Device = 1 };

struct MemoryRegion {
  void* address = nullptr;
  size_t length = 0;
  MemoryKind kind = MemoryKind::Host;
  uint32_t device_id = 0;
};

// One contiguous range of bytes, local or remote.
struct Descriptor {
  uint64_t address = 0;
  uint64_t length = 0;
  uint32_t device_id = 0;
};

enum class Operation : uint8_t { Read, Write };
const char* operation_name(Operation op);  // "READ" / "WRITE"

enum class RequestState : uint8_t { InProgress, Done, Failed };

struct RequestStatus {
  RequestState state = RequestState::InProgress;
  Status failure;  // set when state == Failed: code and full message
};

// Opaque handles; 0 is never valid. Using a released or unknown handle is an
// error (NotFound), never undefined behaviour.
using RegionId = uint64_t;
using DescriptorListId = uint64_t;
using RequestId = uint64_t;

// Memory allocated and registered by the agent's backend (allocate_memory).
struct AllocatedRegion {
  RegionId id = 0;
  void* address = nullptr;
  size_t length = 0;
};

struct AgentConfig {
  std::string name;
  std::string backend = "ucx";  // "ucx" or "loopback"
  // UCX transports in UCX_TLS syntax, e.g. "posix,sysv,cma,self" (shared
  // memory) or "tcp,self"; empty: UCX's own choice. The environment's
  // UCX_TLS, when set, wins. Other backends ignore it.
  std::string transports;
  // UCX network devices in UCX_NET_DEVICES syntax, e.g. "lo"; empty: UCX's
  // own choice. The environment's UCX_NET_DEVICES, when set, wins.
  std::string net_devices;
  // Optional fault injection (the `faulty` decorator over the backend), e.g.
  // "err=0.01,stall=0.002,corrupt=0.001,delay_ms=5,disconnect_after=100,seed=7".
  std::string fault_spec;
  // Map every region of a peer into this process eagerly when its metadata
  // is loaded (UCX shared memory: page tables populated and every page read
  // once up front, instead of a fault on the first access of every 4 KiB
  // page during transfers). Costs about 0.1 s per GiB of peer memory on bare
  // metal and 1.3 s per GiB on a paravirtualized VM, where each first touch
  // traps to the hypervisor (and would otherwise slow the first transfers
  // 5-40x). For agents that will read most of their peers' memory, like
  // expert migration; other backends ignore it.
  bool map_peer_memory_eagerly = false;
  // A READ or WRITE of peer memory that UCX maps into this process (shared
  // memory between processes of one host, ucp_rkey_ptr) is one memcpy
  // inside post(), done at once, instead of ucp_get_nbx/ucp_put_nbx (whose
  // protocol costs more than a 4 KiB copy). false: always through UCX, as
  // ucx_perftest's ucp_get measures it. Other backends ignore it.
  bool copy_mapped_memory = true;
  // ucx only: a READ or WRITE of a peer on this host (same boot, process
  // namespace and user) is one process_vm_readv / process_vm_writev inside
  // post(), whatever memory the peer registered (heap memory too, which UCX
  // 1.13 reaches only through the owner's progress); other peers, and all
  // peers if the kernel refuses (EPERM), go through UCX. The backend is then
  // "ucx+cma": both sides of a connection must set it alike. Off by default;
  // eplb.nixl turns it on.
  bool cma_local_peers = false;
  // The job's secret. Non-empty: every metadata this agent exports is sealed
  // with an HMAC-SHA256 under it, and metadata it loads must carry a valid
  // seal (else Mismatch, before the backend sees any of its bytes: a peer
  // without the secret cannot make this agent connect or unpack a key).
  // Empty: EPLB_RUN_SECRET from the environment when set (`eplb run`'s
  // launcher gives its ranks one; 64 lowercase hex digits, else
  // Agent::create is InvalidArgument), else none (metadata is only checksummed).
  std::string secret;
};

struct Notification {
  std::string peer;     // sending agent
  std::string message;  // opaque bytes
};

// A concrete handle (pimpl); the state lives in Agent::Impl.
class Agent {
 public:
  static Result<std::unique_ptr<Agent>> create(const AgentConfig& config);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const std::string& name() const;
  std::string backend_name() const;
  // The transports this agent uses, for reports, e.g. "ucx: UCX_TLS=tcp,self
  // (AgentConfig), UCX_NET_DEVICES=lo (AgentConfig)", or "loopback: in-process copies".
  std::string transports() const;
  // The transports the connection to a loaded peer uses (UCX: the transports
  // of the endpoint's lanes, e.g. {"cma", "posix", "self", "sysv"}).
  Result<std::vector<std::string>> peer_transports(const std::string& peer) const;

  // Memory.
  Result<RegionId> register_memory(const MemoryRegion& region);
  Status deregister_memory(RegionId region);
  // Allocates `length` bytes of host memory through the backend and
  // registers it as one region; deregister_memory() frees it. With UCX the
  // memory comes from shared-memory segments (UCX_ALLOC_PRIO), which
  // same-host peers read and write directly, without this process's CPU;
  // memory registered with register_memory() can only be reached through
  // UCX 1.13's software RMA emulation on shared memory, which needs the
  // owner to progress. Backends that cannot allocate return Unsupported.
  Result<AllocatedRegion> allocate_memory(size_t length);

  // Metadata. The partial form exports only the listed regions.
  Result<std::vector<uint8_t>> export_metadata() const;
  Result<std::vector<uint8_t>> export_metadata(std::span<const RegionId> regions) const;
  // Returns the peer's agent name.
  Result<std::string> load_metadata(std::span<const uint8_t> metadata);
  Status invalidate_peer(const std::string& peer);
  bool knows_peer(const std::string& peer) const;

  // Descriptor lists. Adjacent descriptors are merged when `merge` is set
  // (indices then refer to the merged list, reported by descriptor_count).
  Result<DescriptorListId> prepare_local(std::span<const Descriptor> descriptors, bool merge = false);
  Result<DescriptorListId> prepare_remote(const std::string& peer, std::span<const Descriptor> descriptors,
                                          bool merge = false);
  Result<size_t> descriptor_count(DescriptorListId list) const;
  Status release_descriptor_list(DescriptorListId list);

  // Requests: local_indices[i] pairs with remote_indices[i]; the two
  // descriptors must have the same length. An empty index span means "all
  // descriptors, in order". `notification` (may be empty: none) is
  // delivered to the peer once the transfer has landed. `checksum_landed`
  // (READ): where the backend copies the bytes itself (UCX shared memory,
  // loopback) it also hashes them as they land; see landed_checksums().
  Result<RequestId> make_request(Operation op, DescriptorListId local, std::span<const int> local_indices,
                                 DescriptorListId remote, std::span<const int> remote_indices,
                                 const std::string& notification = {}, bool checksum_landed = false);
  // Starts (or, once finished, restarts) a request. NotAllowed while in progress.
  Status post(RequestId request);
  // Drives progress and reports the state; a Failed status carries the message.
  RequestStatus status(RequestId request);
  // Cancels if still running, then frees. A second release is NotFound.
  Status release(RequestId request);
  // Of a Done READ made with checksum_landed, per segment (one per picked
  // descriptor pair, in order): the XXH3-64 (seed 0) of the bytes that
  // landed, computed while they were copied, or empty where the backend did
  // not copy them itself (the caller hashes those). NotAllowed unless Done.
  Result<std::vector<std::optional<uint64_t>>> landed_checksums(RequestId request);

  // Waits until every request is Done (ok), one Failed (its failure), or the
  // deadline passes (Timeout listing the requests still in progress).
  Status wait(std::span<const RequestId> requests, Deadline deadline);

  // Standalone notifications.
  Status send_notification(const std::string& peer, const std::string& message);
  std::vector<Notification> take_notifications();
  // Waits until at least one notification arrived or the deadline passes (Timeout).
  Result<std::vector<Notification>> wait_notifications(Deadline deadline);

  // One round of backend progress (status() and wait() call it too). True
  // when it handled any event: a caller that progresses only to serve its
  // peers (software-emulated READs) may back off while it returns false.
  bool progress();

  class Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace eplb::xfer
