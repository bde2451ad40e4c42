// ucx_shared_memory.cpp - what UCX 1.13's shared-memory transports (posix,
// sysv) do with the bytes of a peer's worker address and packed keys, tried
// here first (ucx::measure_segments, check_shared_memory, check_key_part).
//
// UCX reaches a peer's posix/sysv interface only when the peer is on this
// host (its device address, the host id and IPC namespace, is this
// process's) and, for posix, in this pid namespace. Then it maps the FIFO
// segment the interface address names (at this process's FIFO size), and
// each key part for that md names a segment it maps at once. A segment that
// is not there, or is smaller, is a SIGBUS inside UCX, and a key it fails to
// unpack crashes its error path (it releases parts it never unpacked). So,
// for the interfaces UCX would reach, and only for those: the segment must
// open read-write (posix: a regular file, the one that was stat'ed) or
// attach (sysv), and be large enough; a key's mapping must cover the region
// the metadata gives it. Interfaces UCX would not reach are not probed.
//
// Layouts: posix segment id u64 (bit 63 procfs: pid in the low 30 bits of
// the id, fd in the next 30; bit 62 shm_open: /dev/shm/ucx_shm_posix_<id>;
// neither: a directory path follows; bit 60: the pid namespace follows;
// bit 61: huge pages); posix key: segment id u64 | owner's address u64 |
// length u64 | [path], mapped at once (tried here: opened and mapped);
// sysv interface: shmid u64; sysv key: shmid u32 | owner's address u64.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ucs/algorithm/crc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/bytes.h"
#include "ucx_internal.h"

namespace eplb::xfer::ucx {
namespace {

constexpr uint64_t kPosixProcfs = uint64_t(1) << 63, kPosixShmOpen = uint64_t(1) << 62;
constexpr uint64_t kPosixHugePages = uint64_t(1) << 61, kPosixPidNamespace = uint64_t(1) << 60;
constexpr uint64_t kPosixIdMask = (uint64_t(1) << 60) - 1;

// The little-endian u64 at the start of `bytes` (callers check there are 8).
uint64_t u64_of(std::span<const uint8_t> bytes) { return bytes::Reader(bytes).u64(); }

bool same_bytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// What UCX does with a posix key: maps `length` bytes of the segment at once
// (with MAP_HUGETLB when the key says so). Tried here, then unmapped.
struct MapProbe {
  uint64_t length = 0;  // 0: no mapping tried (an interface's FIFO)
  bool huge_pages = false;
};

std::string map_problem(int fd, const MapProbe& probe) {
  if (probe.length == 0) return "";
  if (probe.length > (uint64_t(1) << 46)) return fmt::format("a mapping of {} B", probe.length);
  const int flags = MAP_SHARED | (probe.huge_pages ? MAP_HUGETLB : 0);
  void* mapped = ::mmap(nullptr, probe.length, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (mapped == MAP_FAILED)
    return fmt::format("{} B of it cannot be mapped{}: {}", probe.length, probe.huge_pages ? " on huge pages" : "",
                       std::strerror(errno));
  ::munmap(mapped, probe.length);
  return "";
}

// A regular file (stat), opened as UCX opens it (read-write; nothing blocks,
// no terminal is taken), the same file (device and inode), mapped as `probe`
// says; its size.
std::string file_size(const std::string& path, uint64_t* size, const MapProbe& probe = {}) {
  struct stat named {}, opened {};
  if (::stat(path.c_str(), &named) != 0) return fmt::format("its segment {}: {}", path, std::strerror(errno));
  if (!S_ISREG(named.st_mode)) return fmt::format("its segment {} is not a regular file", path);
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return fmt::format("its segment {} cannot be opened read-write: {}", path, std::strerror(errno));
  const bool same = ::fstat(fd, &opened) == 0 && opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
  const std::string unmappable = same && uint64_t(opened.st_size) >= probe.length ? map_problem(fd, probe) : "";
  ::close(fd);
  if (!same) return fmt::format("its segment {} changed while it was checked", path);
  if (!unmappable.empty()) return fmt::format("its segment {}: {}", path, unmappable);
  *size = uint64_t(opened.st_size);
  return "";
}

// The posix segment `segment` names, its size (and, with `map_length`, a
// trial mapping). `tail` is what follows the segment id in the peer's
// address or key (a path, or the pid namespace); `local_tail` the same of
// this process's own posix interface.
std::string posix_file_size(uint64_t segment, std::span<const uint8_t> tail, std::span<const uint8_t> local_tail,
                            uint64_t* size, uint64_t map_length = 0) {
  const uint64_t id = segment & kPosixIdMask;
  const MapProbe probe{map_length, (segment & kPosixHugePages) != 0};
  if (segment & kPosixProcfs)
    return file_size(fmt::format("/proc/{}/fd/{}", id & ((1u << 30) - 1), id >> 30), size, probe);
  if (segment & kPosixShmOpen) return file_size(fmt::format("/dev/shm/ucx_shm_posix_{:x}", id), size, probe);
  // A directory of the peer's choosing: only this process's own (the same configuration).
  auto end = std::find(tail.begin(), tail.end(), uint8_t(0));
  if (end == tail.end() || !same_bytes(tail, local_tail))
    return "a posix segment in a directory other than this process's UCX_POSIX_DIR";
  return file_size(fmt::format("{}/ucx_shm_posix_{:x}", std::string(tail.begin(), end), id), size, probe);
}

// The size of a System V segment, attached and detached as UCX will attach it.
std::string sysv_size(uint64_t id, uint64_t* size) {
  struct shmid_ds status {};
  if (id > uint64_t(INT32_MAX) || ::shmctl(int(id), IPC_STAT, &status) != 0)
    return fmt::format("its System V segment {} is not there", id);
  void* attached = ::shmat(int(id), nullptr, 0);
  if (attached == reinterpret_cast<void*>(-1))
    return fmt::format("its System V segment {} cannot be attached: {}", id, std::strerror(errno));
  ::shmdt(attached);
  *size = uint64_t(status.shm_segsz);
  return "";
}

enum class SharedMemory { None, Posix, Sysv };

SharedMemory shared_memory(uint16_t checksum) {
  static const uint16_t posix = ucs_crc16_string("posix"), sysv = ucs_crc16_string("sysv");
  return checksum == posix ? SharedMemory::Posix : checksum == sysv ? SharedMemory::Sysv : SharedMemory::None;
}

const char* name_of(SharedMemory kind) { return kind == SharedMemory::Posix ? "posix" : "sysv"; }

std::span<const uint8_t> interface_bytes(std::span<const uint8_t> address, const WorkerAddressShape::Interface& entry) {
  return address.subspan(entry.interface_offset, entry.interface_length);
}

// Whether UCX would reach the peer's interface `theirs` from `mine` (this
// process's interface of the same transport): the same host id and IPC
// namespace (device address); posix also the same pid namespace (bit 60 of
// the segment id and the namespace after it, as this process packs them).
bool reachable(std::span<const uint8_t> address, const WorkerAddressShape::Interface& theirs,
               const WorkerAddressShape::Interface& mine, SharedMemory kind) {
  if (!same_bytes(address.subspan(theirs.device_offset, theirs.device_length), mine.device_address)) return false;
  if (kind != SharedMemory::Posix) return true;
  auto bytes = interface_bytes(address, theirs);
  if (bytes.size() < 8 || mine.interface_address.size() < 8) return true;  // refused by the size check
  const bool their_namespace = u64_of(bytes) & kPosixPidNamespace;
  const bool my_namespace = u64_of(mine.interface_address) & kPosixPidNamespace;
  if (their_namespace != my_namespace) return false;
  return !their_namespace || (bytes.size() >= 16 && mine.interface_address.size() >= 16 &&
                              same_bytes(bytes.subspan(8, 8), std::span(mine.interface_address).subspan(8, 8)));
}

// The size of the FIFO segment an interface address (`bytes`, at least 8)
// names; `local_interface` is this process's own of the same transport.
std::string fifo_size(SharedMemory kind, std::span<const uint8_t> bytes, std::span<const uint8_t> local_interface,
                      uint64_t* size) {
  if (kind == SharedMemory::Sysv) return sysv_size(u64_of(bytes), size);
  return posix_file_size(u64_of(bytes), bytes.subspan(8), local_interface.subspan(8), size);
}

// The FIFO segment a reachable interface names, against this process's own.
std::string fifo_problem(std::span<const uint8_t> bytes, const WorkerAddressShape::Interface& mine, SharedMemory kind) {
  if (bytes.size() < 8) return fmt::format("an interface address of {} B, shorter than its segment id", bytes.size());
  uint64_t size = 0;
  std::string wrong = fifo_size(kind, bytes, mine.interface_address, &size);
  if (wrong.empty() && size < *mine.segment_size)
    wrong = fmt::format("its segment has {} B, less than the {} B FIFO UCX would map", size, *mine.segment_size);
  return wrong;
}

// Whether [region] lies inside the `length` bytes mapped from `owner` (UCX
// reads a READ's offsets from the owner's address, unchecked).
std::string geometry_problem(uint64_t owner, uint64_t length, const KeyRegion& region) {
  if (region.length == 0) return "";  // no region to check against
  if (region.address >= owner && region.length <= length && region.address - owner <= length - region.length)
    return "";
  return fmt::format("maps {} B from {:#x}, which does not cover the region's {} B at {:#x}", length, owner,
                     region.length, region.address);
}

// A key part for a reachable posix/sysv md; `their_interface` is the peer's
// interface address of that transport (its directory, when it uses one).
std::string key_problem(std::span<const uint8_t> part, SharedMemory kind, std::span<const uint8_t> their_interface,
                        const KeyRegion& region) {
  if (part.empty()) return "empty (UCX would read the bytes after it as the key)";
  uint64_t size = 0;
  if (kind == SharedMemory::Sysv) {
    if (part.size() < 12) return fmt::format("{} B, shorter than a sysv key's 12", part.size());
    std::string wrong = sysv_size(bytes::Reader(part).u32(), &size);
    return wrong.empty() ? geometry_problem(u64_of(part.subspan(4)), size, region) : wrong;
  }
  if (part.size() < 24) return fmt::format("{} B, shorter than a posix key's 24", part.size());
  const uint64_t owner = u64_of(part.subspan(8)), length = u64_of(part.subspan(16));
  if (length == 0) return "a posix key of an empty segment";
  auto tail = their_interface.size() > 8 ? their_interface.subspan(8) : std::span<const uint8_t>();
  std::string wrong = posix_file_size(u64_of(part), part.subspan(24), tail, &size, length);
  if (wrong.empty() && size < length) wrong = fmt::format("a posix key of {} B on a segment of {} B", length, size);
  return wrong.empty() ? geometry_problem(owner, length, region) : wrong;
}

}  // namespace

Status check_key_part(int md, std::span<const uint8_t> part, const WorkerAddressShape& remote,
                      const KeyRegion& region, const std::string& peer) {
  for (const auto& entry : remote.interfaces) {
    if (entry.md_index != md || !entry.on_this_host) continue;
    const SharedMemory kind = shared_memory(entry.checksum);
    const std::string wrong = key_problem(part, kind, entry.interface_address, region);
    if (!wrong.empty())
      return error(Code::Mismatch, fmt::format("ucx backend: packed remote key of peer {}: md {} is {} on this host "
                                               "in the peer's address, and its part is {}",
                                               peer, md, name_of(kind), wrong));
  }
  return Status::ok();
}

void measure_segments(std::span<const uint8_t> address, WorkerAddressShape& shape) {
  for (auto& entry : shape.interfaces) {
    const SharedMemory kind = shared_memory(entry.checksum);
    auto bytes = interface_bytes(address, entry);
    if (kind == SharedMemory::None || bytes.size() < 8) continue;
    uint64_t size = 0;
    if (!fifo_size(kind, bytes, bytes, &size).empty()) continue;
    entry.segment_size = size;
    auto device = address.subspan(entry.device_offset, entry.device_length);
    entry.device_address.assign(device.begin(), device.end());
    entry.interface_address.assign(bytes.begin(), bytes.end());
  }
}

Status check_shared_memory(std::span<const uint8_t> address, WorkerAddressShape& remote,
                           const WorkerAddressShape& local, const std::string& peer) {
  for (auto& theirs : remote.interfaces) {
    const SharedMemory kind = shared_memory(theirs.checksum);
    if (kind == SharedMemory::None) continue;
    for (const auto& mine : local.interfaces) {
      if (mine.checksum != theirs.checksum || !mine.segment_size || !reachable(address, theirs, mine, kind)) continue;
      theirs.on_this_host = true;
      auto bytes = interface_bytes(address, theirs);
      theirs.interface_address.assign(bytes.begin(), bytes.end());
      const std::string wrong = fifo_problem(bytes, mine, kind);
      if (!wrong.empty())
        return error(Code::Mismatch, fmt::format("ucx backend: worker address of peer {} ({} bytes): {} interface "
                                                 "at offset {}, on this host: {}",
                                                 peer, address.size(), name_of(kind), theirs.offset, wrong));
      break;
    }
  }
  return Status::ok();
}

}  // namespace eplb::xfer::ucx
