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

namespace eplb::xfer::testing {
namespace {

// Memory allocated by the UCX backend is registered like any region and
// reachable by a peer; loopback cannot allocate.
TEST(UcxAllocateMemory, AllocatedRegionsTransferAndFree) {
  AgentConfig config;
  config.name = "owner";
  auto owner = Agent::create(config);
  config.name = "reader";
  auto reader = Agent::create(config);
  ASSERT_TRUE(owner && reader);
  constexpr size_t kBytes = (1 << 20) + 123;
  auto source = (*owner)->allocate_memory(kBytes);
  ASSERT_TRUE(source) << source.status().to_string();
  ASSERT_NE(source->address, nullptr);
  EXPECT_EQ(source->length, kBytes);
  fill_pattern(static_cast<uint8_t*>(source->address), kBytes, 42);
  auto destination = (*reader)->allocate_memory(kBytes);
  ASSERT_TRUE(destination) << destination.status().to_string();
  std::memset(destination->address, 0, kBytes);

  auto metadata = (*owner)->export_metadata();
  ASSERT_TRUE(metadata);
  ASSERT_TRUE((*reader)->load_metadata(*metadata));
  auto metadata_back = (*reader)->export_metadata();
  ASSERT_TRUE(metadata_back);
  ASSERT_TRUE((*owner)->load_metadata(*metadata_back));
  Descriptor local = descriptor_of(destination->address, kBytes);
  Descriptor remote = descriptor_of(source->address, kBytes);
  auto local_list = (*reader)->prepare_local({&local, 1});
  auto remote_list = (*reader)->prepare_remote("owner", {&remote, 1});
  ASSERT_TRUE(local_list && remote_list);
  auto request = (*reader)->make_request(Operation::Read, *local_list, {}, *remote_list, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE((*reader)->post(*request));
  const RequestId id = *request;
  Status done = wait_driving(**reader, **owner, {&id, 1}, Deadline::after_seconds(10));
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(std::memcmp(destination->address, source->address, kBytes), 0);

  ASSERT_TRUE((*reader)->release(*request));
  ASSERT_TRUE((*reader)->release_descriptor_list(*local_list));
  ASSERT_TRUE((*reader)->release_descriptor_list(*remote_list));
  EXPECT_TRUE((*reader)->deregister_memory(destination->id));
  EXPECT_EQ((*reader)->deregister_memory(destination->id).code(), Code::NotFound);
  EXPECT_TRUE((*owner)->deregister_memory(source->id));
  EXPECT_EQ((*owner)->allocate_memory(0).status().code(), Code::InvalidArgument);

  config.backend = "loopback";
  auto loopback = Agent::create(config);
  ASSERT_TRUE(loopback);
  EXPECT_EQ((*loopback)->allocate_memory(4096).status().code(), Code::Unsupported);
}

}  // namespace
}  // namespace eplb::xfer::testing
