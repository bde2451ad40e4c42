// Placeholder until the UCX backend lands (it replaces this file).
#include "backend.h"

namespace eplb::xfer {

Result<std::unique_ptr<Backend>> make_ucx_backend(const AgentConfig&) {
  return error(Code::Unsupported, "UCX backend not built yet");
}

}  // namespace eplb::xfer
