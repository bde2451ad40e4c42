// xfer-core's in-process Agent suites (agent_fixture.h), run again over the
// UCX backend. Two agents of one process talk through UCX shared memory:
// UCX_TLS defaults to posix,sysv,cma,self here unless the environment sets
// it (the ucx_process and ucx_backend tests cover TCP explicitly).
#include <cstdlib>

#include "agent_fixture.h"

namespace eplb::xfer::testing {
namespace {

const bool kDefaultTransport = [] {
  setenv("UCX_TLS", "posix,sysv,cma,self", /*overwrite=*/0);
  return true;
}();

INSTANTIATE_TEST_SUITE_P(Ucx, TransferTest, ::testing::Values("ucx"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
