// ucx_address.cpp - the structural check of a peer's UCX worker address
// (ucx::read_worker_address, ucx::check_worker_address), done before the
// bytes reach ucp_ep_create. UCX 1.13's unpacker trusts the bytes: lengths
// and flags in them steer its reads, and its transports read their device
// and interface addresses at the lengths they expect, not the lengths given.
//
// The layout walked here (UCX's packed worker address, versions 1 and 2 of
// its format, non-unified mode), every field bounds-checked:
//   header u8 (version in the low 4 bits; v1: flags in the high 4 bits;
//   v2: flags in a second byte) | uuid u64 (v1 always, v2 when flagged) |
//   client id u64 (flagged) | name: u8 length + bytes (flagged) |
//   0xff (no devices) or, per device:
//     md byte (0x80 = no interfaces; index in the rest, v2: 0x7f = next byte)
//     | length byte (0x80 last device, 0x40 paths byte follows, 0x20 system
//       device byte follows; length in the low 5 bits, v2: 31 = next byte)
//     | [paths u8] | [system device u8] | device address
//     | per interface: name checksum u16 | attributes (v1: 16 bytes,
//       v2: 8 bytes) | length byte (0x80 last, 0x40 endpoint addresses follow;
//       length in the low 6 bits, v2: 63 = next byte) | interface address.
// A worker address never carries endpoint addresses: one that says it does
// is refused. The check is anchored on this process's own address: it must
// walk cleanly (else the agent is not created: a UCX whose format differs,
// or unified mode), and every interface of the peer whose transport this
// process also has must give the device and interface address lengths this
// process's UCX packs for it (UCX's transports read exactly those).
#include <fmt/format.h>

#include <fcntl.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include <ucs/algorithm/crc.h>

#include "ucx_internal.h"

namespace eplb::xfer::ucx {
namespace {

constexpr uint8_t kNoDevices = 0xff;
constexpr uint8_t kFlagLast = 0x80;
constexpr uint8_t kDeviceHasPaths = 0x40, kDeviceHasSystemDevice = 0x20, kDeviceLengthMask = 0x1f;
constexpr uint8_t kInterfaceHasEndpoints = 0x40, kInterfaceLengthMask = 0x3f;
constexpr uint8_t kMdEmpty = 0x80, kMdMaskV1 = 0x1f, kMdMaskV2 = 0x7f;
constexpr uint8_t kHeaderHasUuid = 0x02, kHeaderHasClientId = 0x04, kHeaderHasName = 0x01;
constexpr size_t kAttributesV1 = 16, kAttributesV2 = 8;
constexpr int kMaxDevices = 64;      // UCX indexes 64-bit device maps by device
constexpr int kMaxInterfaces = 128;  // UCP_MAX_RESOURCES
constexpr int kMaxMdIndex = 63;      // UCX indexes 64-bit md maps by md index
constexpr double kMaxSeconds = 10, kMaxBandwidth = 1e15;

class Walk {
 public:
  Walk(std::span<const uint8_t> bytes, const std::string& whose) : bytes_(bytes), whose_(whose) {}
  size_t at() const { return at_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  bool at_end() const { return at_ == bytes_.size(); }
  Status fail(const std::string& what) const {
    return error(Code::Mismatch, fmt::format("ucx backend: worker address of {} ({} bytes): {} at offset {}", whose_,
                                             bytes_.size(), what, at_));
  }
  // The next byte, or nothing when the address has ended.
  std::optional<uint8_t> byte() {
    if (at_ >= bytes_.size()) return std::nullopt;
    return bytes_[at_++];
  }
  std::optional<uint8_t> peek() const {
    if (at_ >= bytes_.size()) return std::nullopt;
    return bytes_[at_];
  }
  bool skip(size_t count) {
    if (count > bytes_.size() - at_) return false;
    at_ += count;
    return true;
  }
  // A length field: `first & mask`, or (format 2) the next byte when it is the mask.
  std::optional<size_t> extended(uint8_t first, uint8_t mask, int version) {
    const uint8_t value = first & mask;
    if (version == 1 && value == mask) {
      auto next = byte();
      if (!next) return std::nullopt;
      return *next;
    }
    return value;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& whose_;
  size_t at_ = 0;
};

// The header, uuid, client id and name; sets the format (0 = v1, 1 = v2).
Status read_header(Walk& walk, int* version) {
  auto first = walk.byte();
  if (!first) return walk.fail("no header");
  *version = *first & 0x0f;
  if (*version > 1) return walk.fail(fmt::format("unknown address format {}", *version + 1));
  uint8_t flags = uint8_t(*first >> 4);
  if (*version == 1) {
    auto second = walk.byte();
    if (!second) return walk.fail("no header flags");
    flags = *second;
  }
  if ((*version == 0 || (flags & kHeaderHasUuid)) && !walk.skip(8)) return walk.fail("no worker uuid");
  if ((flags & kHeaderHasClientId) && !walk.skip(8)) return walk.fail("no client id");
  if (flags & kHeaderHasName) {
    auto length = walk.byte();
    if (!length || !walk.skip(*length)) return walk.fail("the worker name runs past the address");
  }
  return Status::ok();
}

// Format v1's attributes are floats UCX scores lanes with (asserting the
// score is not negative): overhead, bandwidth (negative: a shared one),
// latency overhead. Each must be finite; the times in [0, 10 s], the
// bandwidth not 0 and at most 1e15 B/s.
Status check_attributes_v1(const Walk& walk, size_t at) {
  float values[3];
  std::memcpy(values, walk.bytes().data() + at, sizeof values);
  const char* names[3] = {"overhead", "bandwidth", "latency overhead"};
  for (int i = 0; i < 3; ++i) {
    const double value = values[i];
    const bool sane = std::isfinite(value) && (i == 1 ? value != 0 && std::fabs(value) <= kMaxBandwidth
                                                       : value >= 0 && value <= kMaxSeconds);
    if (!sane) return walk.fail(fmt::format("interface {} {} out of range (at {})", names[i], value, at + 4 * i));
  }
  return Status::ok();
}

Status read_interface(Walk& walk, int version, int md_index, size_t device_at, size_t device_length,
                      WorkerAddressShape& shape, bool* last) {
  const size_t starts = walk.at();
  auto low = walk.byte();
  auto high = walk.byte();
  if (!low || !high) return walk.fail("no transport checksum");
  const uint16_t checksum = uint16_t(*low | (*high << 8));
  const size_t attributes_at = walk.at();
  if (!walk.skip(version == 0 ? kAttributesV1 : kAttributesV2)) return walk.fail("interface attributes cut short");
  if (version == 0) EPLB_TRY(check_attributes_v1(walk, attributes_at));
  auto flags = walk.byte();
  if (!flags) return walk.fail("no interface address length");
  if (*flags & kInterfaceHasEndpoints) return walk.fail("endpoint addresses in a worker address");
  *last = *flags & kFlagLast;
  auto length = walk.extended(*flags, kInterfaceLengthMask, version);
  const size_t interface_at = walk.at();
  if (!length || !walk.skip(*length)) return walk.fail("the interface address runs past the address");
  shape.interfaces.push_back({.checksum = checksum,
                              .device_length = device_length,
                              .interface_length = *length,
                              .offset = starts,
                              .device_offset = device_at,
                              .interface_offset = interface_at,
                              .md_index = md_index});
  return Status::ok();
}

Status read_device(Walk& walk, int version, WorkerAddressShape& shape, bool* last) {
  auto md = walk.byte();
  if (!md) return walk.fail("no md byte");
  const bool empty = *md & kMdEmpty;
  auto md_index = walk.extended(*md, version == 0 ? kMdMaskV1 : kMdMaskV2, version);
  if (!md_index) return walk.fail("no md index");
  if (*md_index > size_t(kMaxMdIndex)) return walk.fail(fmt::format("md index {} > {}", *md_index, kMaxMdIndex));
  auto flags = walk.byte();
  if (!flags) return walk.fail("no device address length");
  *last = *flags & kFlagLast;
  auto length = walk.extended(*flags, kDeviceLengthMask, version);
  if (!length) return walk.fail("no device address length");
  if ((*flags & kDeviceHasPaths) && !walk.skip(1)) return walk.fail("no path count");
  if ((*flags & kDeviceHasSystemDevice) && !walk.skip(1)) return walk.fail("no system device");
  const size_t device_at = walk.at();
  if (!walk.skip(*length)) return walk.fail("the device address runs past the address");
  if (empty) return Status::ok();
  for (bool last_interface = false; !last_interface;) {
    if (shape.interfaces.size() >= size_t(kMaxInterfaces))
      return walk.fail(fmt::format("more than {} interfaces", kMaxInterfaces));
    EPLB_TRY(read_interface(walk, version, int(*md_index), device_at, *length, shape, &last_interface));
  }
  return Status::ok();
}

uint64_t little_u64(std::span<const uint8_t> bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) value |= uint64_t(bytes[i]) << (8 * i);
  return value;
}

// The shared-memory transports map the FIFO segment an interface address
// names, at this process's FIFO size: a segment that is not there, or is
// smaller, is a fault in UCX (SIGBUS), not an error. Each rule finds the
// segment's size, or says why the address is wrong ("" when it is fine).
using SegmentRule = std::string (*)(std::span<const uint8_t> interface, uint64_t* size);

// UCX opens the segment read-write and maps it; a failure to unpack a key is
// itself a crash in UCX 1.13 (its error path releases parts it never
// unpacked), so the open is tried here first: a regular file first (stat),
// then opened as UCX will (nothing blocks, no terminal is taken).
std::string file_size(const std::string& path, uint64_t* size) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0 || !S_ISREG(status.st_mode))
    return fmt::format("its segment {} is not a regular file", path);
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return fmt::format("its segment {} cannot be opened for reading and writing", path);
  const bool stated = ::fstat(fd, &status) == 0;
  ::close(fd);
  if (!stated) return fmt::format("its segment {} cannot be read", path);
  *size = uint64_t(status.st_size);
  return "";
}

// posix: a segment id (u64): flags in bits 60-63; procfs (63): the id holds
// the owner's pid (30 bits) and fd (the next 30); shm_open (62):
// /dev/shm/ucx_shm_posix_<id>; neither: a directory path follows.
std::string posix_file_size(uint64_t segment, std::span<const uint8_t> path_bytes, uint64_t* size) {
  constexpr uint64_t kProcfs = uint64_t(1) << 63, kShmOpen = uint64_t(1) << 62, kIdMask = (uint64_t(1) << 60) - 1;
  const uint64_t id = segment & kIdMask;
  if (segment & kProcfs) return file_size(fmt::format("/proc/{}/fd/{}", id & ((1u << 30) - 1), id >> 30), size);
  if (segment & kShmOpen) return file_size(fmt::format("/dev/shm/ucx_shm_posix_{:x}", id), size);
  auto end = std::find(path_bytes.begin(), path_bytes.end(), uint8_t(0));
  if (path_bytes.empty() || end == path_bytes.end()) return "a posix segment path that is not a terminated string";
  return file_size(fmt::format("{}/ucx_shm_posix_{:x}", std::string(path_bytes.begin(), end), id), size);
}

// posix interface address: the FIFO's segment id, [path].
std::string posix_segment(std::span<const uint8_t> interface, uint64_t* size) {
  if (interface.size() < 8) return "a posix interface address shorter than its segment id";
  return posix_file_size(little_u64(interface), interface.subspan(8), size);
}

// sysv: the FIFO's segment id is a System V shmid.
std::string sysv_segment(std::span<const uint8_t> interface, uint64_t* size) {
  if (interface.size() < 4) return "a sysv address shorter than its segment id";
  const uint64_t id = little_u64(interface.first(std::min<size_t>(interface.size(), 8)));
  struct shmid_ds status {};
  if (id > uint64_t(INT32_MAX) || ::shmctl(int(id), IPC_STAT, &status) != 0)
    return fmt::format("its System V segment {} is not there", id);
  *size = uint64_t(status.shm_segsz);
  return "";
}

// A packed key's part for one md (UCX maps the segment it names at once,
// and reads it later at the offsets a READ asks for): "" when it is fine.
using KeyRule = std::string (*)(std::span<const uint8_t> part);

// posix key: segment id u64 | address u64 | length u64 (> 0) | [path]; the
// segment must hold `length` bytes (UCX maps that many).
std::string posix_key(std::span<const uint8_t> part) {
  if (part.size() < 24) return fmt::format("a posix key of {} B, shorter than its 24 B header", part.size());
  const uint64_t length = little_u64(part.subspan(16));
  if (length == 0) return "a posix key of an empty segment";
  uint64_t size = 0;
  std::string wrong = posix_file_size(little_u64(part), part.subspan(24), &size);
  if (wrong.empty() && size < length) wrong = fmt::format("a posix key of {} B on a segment of {} B", length, size);
  return wrong;
}

// sysv key: shmid u32 | owner's address u64; UCX attaches the segment at
// once, and a failed attach is a crash (see file_size): attached and
// detached here first.
std::string sysv_key(std::span<const uint8_t> part) {
  if (part.size() < 12) return fmt::format("a sysv key of {} B, shorter than its 12 B", part.size());
  uint64_t size = 0;
  std::string wrong = sysv_segment(part.first(4), &size);
  if (!wrong.empty()) return wrong;
  void* attached = ::shmat(int(little_u64(part.first(4))), nullptr, 0);
  if (attached == reinterpret_cast<void*>(-1)) return "a sysv key of a segment that cannot be attached";
  ::shmdt(attached);
  return "";
}

struct SharedMemoryTransport {
  const char* name;
  SegmentRule segment;
  KeyRule key;
};
constexpr SharedMemoryTransport kSharedMemoryTransports[] = {{"posix", posix_segment, posix_key},
                                                             {"sysv", sysv_segment, sysv_key}};

const SharedMemoryTransport* shared_memory_transport(uint16_t checksum) {
  for (const auto& transport : kSharedMemoryTransports)
    if (ucs_crc16_string(transport.name) == checksum) return &transport;
  return nullptr;
}

// `theirs` (an interface of the peer's address) against `mine` (this
// process's interface of the same transport, its segment measured).
// On this host (the device address, UCX's host id for shared memory, is
// this process's), the peer's UCX numbers its mds as this process's does
// (every rank runs the same transports): the md a shared-memory transport
// claims selects which part of a packed key UCX hands that transport.
Status check_segment(std::span<const uint8_t> address, const WorkerAddressShape::Interface& theirs,
                     const WorkerAddressShape::Interface& mine, const std::string& peer) {
  const SharedMemoryTransport* transport = shared_memory_transport(theirs.checksum);
  if (transport == nullptr || !mine.segment_size) return Status::ok();
  auto device = address.subspan(theirs.device_offset, theirs.device_length);
  if (std::equal(device.begin(), device.end(), mine.device_address.begin(), mine.device_address.end()) &&
      theirs.md_index != mine.md_index)
    return error(Code::Mismatch, fmt::format("ucx backend: worker address of peer {} ({} bytes): {} interface at "
                                             "offset {} on this host claims md {}, this host's UCX has it at md {}",
                                             peer, address.size(), transport->name, theirs.offset, theirs.md_index,
                                             mine.md_index));
  uint64_t size = 0;
  std::string wrong = transport->segment(address.subspan(theirs.interface_offset, theirs.interface_length), &size);
  if (wrong.empty() && size < *mine.segment_size)
    wrong = fmt::format("its segment has {} B, less than the {} B FIFO UCX would map", size, *mine.segment_size);
  if (wrong.empty()) return Status::ok();
  return error(Code::Mismatch, fmt::format("ucx backend: worker address of peer {} ({} bytes): {} interface at offset "
                                           "{}: {}",
                                           peer, address.size(), transport->name, theirs.offset, wrong));
}

}  // namespace

Result<WorkerAddressShape> read_worker_address(std::span<const uint8_t> address, const std::string& whose) {
  Walk walk(address, whose);
  WorkerAddressShape shape;
  EPLB_TRY(read_header(walk, &shape.format));
  auto next = walk.peek();
  if (!next) return walk.fail("no device list");
  if (*next == kNoDevices) {
    walk.skip(1);
  } else {
    bool last = false;
    for (int device = 0; !last; ++device) {
      if (device >= kMaxDevices) return walk.fail(fmt::format("more than {} devices", kMaxDevices));
      EPLB_TRY(read_device(walk, shape.format, shape, &last));
    }
  }
  if (!walk.at_end()) return walk.fail("bytes after the last device");
  return shape;
}

Status check_key_part(int md, std::span<const uint8_t> part, const WorkerAddressShape& remote,
                      const std::string& peer) {
  for (const auto& entry : remote.interfaces) {
    if (entry.md_index != md) continue;
    const SharedMemoryTransport* transport = shared_memory_transport(entry.checksum);
    if (transport == nullptr) continue;
    const std::string wrong = transport->key(part);
    if (!wrong.empty())
      return error(Code::Mismatch, fmt::format("ucx backend: packed remote key of peer {}: md {} is {} in the peer's "
                                               "address, and its part is {}",
                                               peer, md, transport->name, wrong));
  }
  return Status::ok();
}

void measure_segments(std::span<const uint8_t> address, WorkerAddressShape& shape) {
  for (auto& entry : shape.interfaces) {
    const SharedMemoryTransport* transport = shared_memory_transport(entry.checksum);
    uint64_t size = 0;
    if (!transport || !transport->segment(address.subspan(entry.interface_offset, entry.interface_length), &size).empty())
      continue;
    entry.segment_size = size;
    auto device = address.subspan(entry.device_offset, entry.device_length);
    entry.device_address.assign(device.begin(), device.end());
  }
}

Result<WorkerAddressShape> check_worker_address(std::span<const uint8_t> address, const WorkerAddressShape& local,
                                                const std::string& peer) {
  EPLB_ASSIGN_OR_RETURN(WorkerAddressShape remote, read_worker_address(address, "peer " + peer));
  if (remote.format != local.format)
    return error(Code::Mismatch, fmt::format("ucx backend: worker address of peer {} is in UCX's address format {}, "
                                             "this process's UCX packs format {}",
                                             peer, remote.format + 1, local.format + 1));
  for (const auto& theirs : remote.interfaces) {
    const WorkerAddressShape::Interface* known = nullptr;  // this process has the transport
    const WorkerAddressShape::Interface* same = nullptr;   // ... at the same lengths
    for (const auto& mine : local.interfaces) {
      if (mine.checksum != theirs.checksum) continue;
      known = &mine;
      if (mine.device_length == theirs.device_length && mine.interface_length == theirs.interface_length) same = &mine;
    }
    if (known == nullptr) continue;
    if (same != nullptr) {
      EPLB_TRY(check_segment(address, theirs, *same, peer));
      continue;
    }
    return error(Code::Mismatch,
                 fmt::format("ucx backend: worker address of peer {} ({} bytes): transport {:#06x} at offset {} has "
                             "a {} B device and {} B interface address, this process's UCX packs {} B and {} B",
                             peer, address.size(), theirs.checksum, theirs.offset, theirs.device_length,
                             theirs.interface_length, known->device_length, known->interface_length));
  }
  return remote;
}

}  // namespace eplb::xfer::ucx
