// cma_backend.cpp - a decorator over the UCX backend (AgentConfig::cma_local_peers):
// a READ or WRITE of a peer that runs on this host, in this process
// namespace, as this user is one process_vm_readv / process_vm_writev
// (Linux cross-memory attach) inside post(), done by the initiator alone:
// the peer's CPU takes no part, whatever memory it registered (heap memory
// included, which UCX 1.13 reaches only through its software RMA emulation,
// served by the owner's progress). Everything else (registration, remote
// keys, notifications, progress, other peers) goes to the inner backend.
//
// Connection info: the inner backend's bytes, then a fixed trailer
//   magic "EPCM" (4) | pid u32 | uid u32 | pid-namespace inode u64 | boot id (36)
// A peer is local when uid, namespace and boot id equal ours. The backend's
// name is "ucx+cma", so a plain "ucx" agent refuses its metadata (and the
// reverse) by name instead of misreading the trailer. The Agent has already
// checked every descriptor against the peer's registered regions; if the
// kernel refuses the copy (EPERM: ptrace restrictions), the peer falls back
// to the inner backend for good; a vanished process (ESRCH) is
// RemoteDisconnect; any other failure is Backend, naming errno.
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "backend.h"
#include "common/bytes.h"

namespace eplb::xfer {
namespace {

constexpr char kCmaTrailerMagic[4] = {'E', 'P', 'C', 'M'};
constexpr size_t kBootIdLength = 36;
constexpr size_t kTrailerLength = 4 + 4 + 4 + 8 + kBootIdLength;

struct Host {
  uint32_t pid = 0, uid = 0;
  uint64_t pid_namespace = 0;
  std::string boot_id;  // kBootIdLength bytes, or empty when unknown (then never local)

  static Host self() {
    Host host{uint32_t(::getpid()), uint32_t(::geteuid()), 0, {}};
    struct stat ns {};
    if (::stat("/proc/self/ns/pid", &ns) == 0) host.pid_namespace = uint64_t(ns.st_ino);
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::getline(file, host.boot_id);
    if (host.boot_id.size() != kBootIdLength || host.pid_namespace == 0) host.boot_id.clear();
    return host;
  }
  bool same_host(const Host& other) const {
    return !boot_id.empty() && boot_id == other.boot_id && pid_namespace == other.pid_namespace && uid == other.uid;
  }
};

struct CmaPeer final : BackendPeer {
  std::unique_ptr<BackendPeer> inner;
  uint32_t pid = 0;  // 0: not local (or the kernel refused): the inner backend moves the bytes
};

// Copies every segment with as few system calls as IOV_MAX allows; *error_number: errno of a failure.
Status copy(Operation op, uint32_t pid, std::span<const TransferSegment> segments, int* error_number) {
  std::vector<iovec> local, remote;
  for (const TransferSegment& segment : segments) {
    if (segment.length == 0) continue;
    local.push_back({segment.local_address, size_t(segment.length)});
    remote.push_back({reinterpret_cast<void*>(segment.remote_address), size_t(segment.length)});
  }
  size_t next = 0;
  while (next < local.size()) {
    const size_t count = std::min<size_t>(local.size() - next, IOV_MAX);
    const ssize_t moved = op == Operation::Read
                              ? ::process_vm_readv(pid_t(pid), &local[next], count, &remote[next], count, 0)
                              : ::process_vm_writev(pid_t(pid), &local[next], count, &remote[next], count, 0);
    if (moved <= 0) {
      *error_number = moved < 0 ? errno : EIO;
      return Status(*error_number == ESRCH ? Code::RemoteDisconnect : Code::Backend,
                    std::string("cma: ") + (op == Operation::Read ? "process_vm_readv" : "process_vm_writev") +
                        " of process " + std::to_string(pid) + ": " + std::strerror(*error_number));
    }
    // A partial copy stops at an iovec boundary or inside one: skip what moved, go on.
    size_t done = size_t(moved);
    while (done > 0 && done >= local[next].iov_len) done -= local[next++].iov_len;
    if (done > 0) {
      local[next].iov_base = static_cast<uint8_t*>(local[next].iov_base) + done;
      local[next].iov_len -= done;
      remote[next].iov_base = static_cast<uint8_t*>(remote[next].iov_base) + done;
      remote[next].iov_len -= done;
    }
  }
  return Status();
}

class CmaRequest final : public BackendRequest {
 public:
  CmaRequest(Operation op, Backend& inner, CmaPeer& peer, std::span<const TransferSegment> segments,
             std::string self_name, std::string notification)
      : op_(op), inner_(inner), peer_(peer), segments_(segments.begin(), segments.end()),
        self_name_(std::move(self_name)), notification_(std::move(notification)) {}

  // The copy, the landed checksums, then the notification. False: the
  // peer is not (or no longer) reached by cma: the kernel refused the copy
  // (EPERM), and the peer is on the inner backend for good (pid 0), or it
  // already was.
  bool run() {
    if (peer_.pid == 0) return false;
    int error_number = 0;
    Status copied = copy(op_, peer_.pid, segments_, &error_number);
    if (error_number == EPERM) {
      peer_.pid = 0;
      return false;
    }
    if (copied.is_ok() && op_ == Operation::Read)
      for (const TransferSegment& segment : segments_)
        if (segment.landed_checksum != nullptr)
          *segment.landed_checksum = bytes::checksum(std::span<const uint8_t>(segment.local_address, segment.length));
    if (copied.is_ok() && !notification_.empty())
      copied = inner_.send_notification(*peer_.inner, self_name_, notification_);
    failure_ = copied;
    state_ = copied.is_ok() ? RequestState::Done : RequestState::Failed;
    return true;
  }
  RequestState poll(Status* failure) override {
    if (state_ == RequestState::Failed && failure != nullptr) *failure = failure_;
    return state_;
  }
  bool repost() override { return state_ == RequestState::Done && run(); }

 private:
  Operation op_;
  Backend& inner_;
  CmaPeer& peer_;
  std::vector<TransferSegment> segments_;
  std::string self_name_, notification_;
  RequestState state_ = RequestState::InProgress;
  Status failure_;
};

class CmaBackend final : public Backend {
 public:
  explicit CmaBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)), host_(Host::self()) {}

  std::string name() const override { return inner_->name() + "+cma"; }
  std::string transports() const override {
    return inner_->transports() + "; cma (process_vm_readv/writev) to peers of this host";
  }
  std::vector<std::string> peer_transports(BackendPeer& peer) const override {
    auto& cma = static_cast<CmaPeer&>(peer);
    auto names = inner_->peer_transports(*cma.inner);
    if (cma.pid != 0) names.insert(names.begin(), "cma");
    return names;
  }
  std::vector<uint8_t> connection_info() const override {
    bytes::Writer trailer;
    trailer.raw(std::string_view(kCmaTrailerMagic, 4));
    trailer.u32(host_.pid);
    trailer.u32(host_.uid);
    trailer.u64(host_.pid_namespace);
    std::string boot = host_.boot_id;
    boot.resize(kBootIdLength, '\0');
    trailer.raw(boot);
    std::vector<uint8_t> info = inner_->connection_info();
    info.insert(info.end(), trailer.view().begin(), trailer.view().end());
    return info;
  }
  Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion& region) override {
    return inner_->register_memory(region);
  }
  Result<std::unique_ptr<BackendMemory>> allocate_memory(size_t length, void** address) override {
    return inner_->allocate_memory(length, address);
  }
  Result<std::unique_ptr<BackendPeer>> connect(const std::string& peer_name,
                                               std::span<const uint8_t> info) override {
    if (info.size() < kTrailerLength || std::memcmp(info.data() + info.size() - kTrailerLength, kCmaTrailerMagic, 4) != 0)
      return Status(Code::Mismatch, "cma: the connection info of agent " + peer_name + " has no cma trailer");
    const uint8_t* trailer = info.data() + info.size() - kTrailerLength;
    Host peer_host{bytes::load<uint32_t>(trailer + 4), bytes::load<uint32_t>(trailer + 8),
                   bytes::load<uint64_t>(trailer + 12),
                   std::string(reinterpret_cast<const char*>(trailer + 20), kBootIdLength)};
    auto inner = inner_->connect(peer_name, info.first(info.size() - kTrailerLength));
    if (!inner) return inner.status();
    auto peer = std::make_unique<CmaPeer>();
    peer->inner = std::move(inner).value();
    if (host_.same_host(peer_host) && peer_host.pid != 0) peer->pid = peer_host.pid;
    return std::unique_ptr<BackendPeer>(std::move(peer));
  }
  Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer& peer, std::span<const uint8_t> packed_key,
                                                              const KeyRegion& region) override {
    return inner_->unpack_remote_key(*static_cast<CmaPeer&>(peer).inner, packed_key, region);
  }
  Result<std::unique_ptr<BackendRequest>> post(Operation op, BackendPeer& peer, std::span<const TransferSegment> segments,
                                               const std::string& self_name, const std::string& notification) override {
    auto& cma = static_cast<CmaPeer&>(peer);
    if (cma.pid != 0) {
      auto request = std::make_unique<CmaRequest>(op, *inner_, cma, segments, self_name, notification);
      if (request->run()) return std::unique_ptr<BackendRequest>(std::move(request));
      // EPERM: run() put the peer on the inner backend (UCX from now on).
    }
    return inner_->post(op, *cma.inner, segments, self_name, notification);
  }
  Status send_notification(BackendPeer& peer, const std::string& self_name, const std::string& message) override {
    return inner_->send_notification(*static_cast<CmaPeer&>(peer).inner, self_name, message);
  }
  std::vector<Notification> take_notifications() override { return inner_->take_notifications(); }
  bool progress() override { return inner_->progress(); }

 private:
  std::unique_ptr<Backend> inner_;
  Host host_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cma_backend(std::unique_ptr<Backend> inner) {
  return std::unique_ptr<Backend>(new CmaBackend(std::move(inner)));
}

}  // namespace eplb::xfer
