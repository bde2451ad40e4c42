// The Agent error and fault-injection suites (agent_fixture.h) over UCX
// shared memory (TransferTest is instantiated for UCX in ucx_agent_test.cpp).
#include "agent_fixture.h"

namespace eplb::xfer::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Ucx, AgentErrorTest, ::testing::Values("ucx"), backend_test_name);
INSTANTIATE_TEST_SUITE_P(Ucx, FaultyTest, ::testing::Values("ucx"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
