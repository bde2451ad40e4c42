// libFuzzer target for the worker address check (src/xfer/ucx_address.cpp,
// ucx::check_worker_address) that stands between a peer's metadata and UCX
// 1.13's ucp_ep_create: on any bytes it returns the address's shape or
// Mismatch, and reads only inside the address (the input is copied to an
// exact-size buffer, so ASan sees a read past it). An accepted address's
// entries lie inside it, in order. The local shape it is checked against is
// the seed corpus's real address (self, sysv, posix, cma over UCX 1.13),
// unmeasured: no shared-memory segment is probed (no file is opened or
// segment attached for fuzzed bytes; tests/xfer/worker_address_test.cpp
// covers the probes).
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "../src/xfer/ucx_internal.h"

namespace ucx = eplb::xfer::ucx;

static const ucx::WorkerAddressShape& local_shape() {
  static const ucx::WorkerAddressShape shape = [] {
    ucx::WorkerAddressShape made;
    for (uint16_t checksum : {0x7563, 0x538d, 0xd3a7, 0x8b47}) {  // self, sysv, posix, cma
      ucx::WorkerAddressShape::Interface entry;
      entry.checksum = checksum;
      entry.device_length = checksum == 0x7563 ? 0 : 8;
      entry.interface_length = checksum == 0x8b47 ? 4 : 8;
      made.interfaces.push_back(entry);
    }
    return made;
  }();
  return shape;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> address(data, data + size);
  auto checked = ucx::check_worker_address(address, local_shape(), "fuzz");
  if (!checked) {
    if (checked.status().code() != eplb::Code::Mismatch) std::abort();
    return 0;
  }
  size_t previous = 0;
  for (const auto& entry : checked->interfaces) {
    if (entry.offset < previous || entry.device_offset + entry.device_length > size ||
        entry.interface_offset + entry.interface_length > size || entry.md_index > 63)
      std::abort();
    previous = entry.offset;
  }
  return 0;
}
