// libFuzzer target for the packed remote key check (src/xfer/ucx_backend.cpp,
// ucx::check_packed_key) that stands between a peer's metadata and UCX 1.13's
// ucp_ep_rkey_unpack: on any bytes it returns Ok or Mismatch and reads only
// inside the key (the input is copied to an exact-size buffer, so ASan sees a
// read past it). An accepted key's walk is redone here: every md's size byte
// and bytes lie inside the key.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "../src/xfer/ucx_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> key(data, data + size);
  eplb::Status checked = eplb::xfer::ucx::check_packed_key(key, "fuzz");
  if (!checked) {
    if (checked.code() != eplb::Code::Mismatch) std::abort();
    return 0;
  }
  if (key.size() < 9 || key[8] >= UCS_MEMORY_TYPE_LAST) std::abort();
  uint64_t md_map = 0;
  for (int i = 0; i < 8; ++i) md_map |= uint64_t(key[i]) << (8 * i);
  size_t at = 9;
  for (int md = 0; md < 64; ++md) {
    if ((md_map >> md & 1) == 0) continue;
    if (at >= key.size()) std::abort();
    at += 1 + key[at];
    if (at > key.size()) std::abort();
  }
  return 0;
}
