// ucx_test_util.h - helpers shared by the tests/xfer/ucx_*.cpp files.
//
// Transport selection: every UCX test picks its transport by setting UCX's
// own environment (UCX_TLS, UCX_NET_DEVICES) right before it creates its
// backends or agents; UCX reads it in ucp_config_read(), so one test binary
// covers shared memory and TCP. Forked children inherit it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace eplb::xfer::test {

// "shm": posix, sysv and cma shared memory; "tcp": TCP on the loopback device.
inline void use_ucx_transport(const std::string& transport) {
  if (transport == "tcp") {
    setenv("UCX_TLS", "tcp,self", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
  } else {
    setenv("UCX_TLS", "posix,sysv,cma,self", 1);
    unsetenv("UCX_NET_DEVICES");
  }
}

// Sets (a value) or unsets (nullopt) an environment variable for its
// lifetime, then restores what was there.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedVariable() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Deterministic content: byte i of a buffer seeded with `seed`.
inline uint8_t pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return static_cast<uint8_t>(x);
}

inline void fill_pattern(std::vector<uint8_t>& buffer, uint64_t seed) {
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = pattern_byte(seed, i);
}

}  // namespace eplb::xfer::test
