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
// is refused. What the shared-memory transports then read of the addresses
// (segments named by id, path or fd) is checked in ucx_shared_memory.cpp.
// The agent is not created when its own address does not walk (a UCX whose
// format differs) or UCX_UNIFIED_MODE is on (lengths are not packed then).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>

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
  std::optional<size_t> extended(uint8_t first, uint8_t mask, AddressFormat format) {
    const uint8_t value = first & mask;
    if (format == AddressFormat::V2 && value == mask) {
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

// The header, uuid, client id and name; sets the format.
Status read_header(Walk& walk, AddressFormat* format) {
  auto first = walk.byte();
  if (!first) return walk.fail("no header");
  const int version = *first & 0x0f;  // 0: v1, 1: v2
  if (version > 1) return walk.fail(fmt::format("unknown address format {}", version + 1));
  *format = version == 0 ? AddressFormat::V1 : AddressFormat::V2;
  uint8_t flags = uint8_t(*first >> 4);
  if (*format == AddressFormat::V2) {
    auto second = walk.byte();
    if (!second) return walk.fail("no header flags");
    flags = *second;
  }
  if ((*format == AddressFormat::V1 || (flags & kHeaderHasUuid)) && !walk.skip(8)) return walk.fail("no worker uuid");
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

Status read_interface(Walk& walk, AddressFormat format, int md_index, size_t device_at, size_t device_length,
                      WorkerAddressShape& shape, bool* last) {
  const size_t starts = walk.at();
  auto low = walk.byte();
  auto high = walk.byte();
  if (!low || !high) return walk.fail("no transport checksum");
  const uint16_t checksum = uint16_t(*low | (*high << 8));
  const size_t attributes_at = walk.at();
  const bool v1 = format == AddressFormat::V1;
  if (!walk.skip(v1 ? kAttributesV1 : kAttributesV2)) return walk.fail("interface attributes cut short");
  if (v1) EPLB_TRY(check_attributes_v1(walk, attributes_at));
  auto flags = walk.byte();
  if (!flags) return walk.fail("no interface address length");
  if (*flags & kInterfaceHasEndpoints) return walk.fail("endpoint addresses in a worker address");
  *last = *flags & kFlagLast;
  auto length = walk.extended(*flags, kInterfaceLengthMask, format);
  const size_t interface_at = walk.at();
  if (!length || !walk.skip(*length)) return walk.fail("the interface address runs past the address");
  WorkerAddressShape::Interface& entry = shape.interfaces.emplace_back();
  entry.checksum = checksum;
  entry.device_length = device_length;
  entry.interface_length = *length;
  entry.offset = starts;
  entry.device_offset = device_at;
  entry.interface_offset = interface_at;
  entry.md_index = md_index;
  return Status::ok();
}

Status read_device(Walk& walk, AddressFormat format, WorkerAddressShape& shape, bool* last) {
  auto md = walk.byte();
  if (!md) return walk.fail("no md byte");
  const bool empty = *md & kMdEmpty;
  auto md_index = walk.extended(*md, format == AddressFormat::V1 ? kMdMaskV1 : kMdMaskV2, format);
  if (!md_index) return walk.fail("no md index");
  if (*md_index > size_t(kMaxMdIndex)) return walk.fail(fmt::format("md index {} > {}", *md_index, kMaxMdIndex));
  auto flags = walk.byte();
  if (!flags) return walk.fail("no device address length");
  *last = *flags & kFlagLast;
  auto length = walk.extended(*flags, kDeviceLengthMask, format);
  if (!length) return walk.fail("no device address length");
  if ((*flags & kDeviceHasPaths) && !walk.skip(1)) return walk.fail("no path count");
  if ((*flags & kDeviceHasSystemDevice) && !walk.skip(1)) return walk.fail("no system device");
  const size_t device_at = walk.at();
  if (!walk.skip(*length)) return walk.fail("the device address runs past the address");
  if (empty) return Status::ok();
  for (bool last_interface = false; !last_interface;) {
    if (shape.interfaces.size() >= size_t(kMaxInterfaces))
      return walk.fail(fmt::format("more than {} interfaces", kMaxInterfaces));
    EPLB_TRY(read_interface(walk, format, int(*md_index), device_at, *length, shape, &last_interface));
  }
  return Status::ok();
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

namespace {

// UCX hands a transport a null pointer for an empty device or interface
// address, and the transports this process has read theirs unconditionally
// (lengths may differ from this process's: IPv4 or IPv6, namespaces; a short
// one reads on into the zeros connect() puts after the address).
Status check_not_empty(std::span<const uint8_t> address, const WorkerAddressShape& remote,
                       const WorkerAddressShape& local, const std::string& peer) {
  for (const auto& theirs : remote.interfaces) {
    for (const auto& mine : local.interfaces) {
      if (mine.checksum != theirs.checksum) continue;
      const char* empty = mine.device_length > 0 && theirs.device_length == 0         ? "device"
                          : mine.interface_length > 0 && theirs.interface_length == 0 ? "interface"
                                                                                      : nullptr;
      if (empty != nullptr)
        return error(Code::Mismatch, fmt::format("ucx backend: worker address of peer {} ({} bytes): transport {:#06x} "
                                                 "at offset {} has an empty {} address (this process's has one)",
                                                 peer, address.size(), theirs.checksum, theirs.offset, empty));
    }
  }
  return Status::ok();
}

}  // namespace

Result<WorkerAddressShape> check_worker_address(std::span<const uint8_t> address, const WorkerAddressShape& local,
                                                const std::string& peer) {
  EPLB_ASSIGN_OR_RETURN(WorkerAddressShape remote, read_worker_address(address, "peer " + peer));
  EPLB_TRY(check_not_empty(address, remote, local, peer));
  EPLB_TRY(check_shared_memory(address, remote, local, peer));
  return remote;
}

}  // namespace eplb::xfer::ucx
