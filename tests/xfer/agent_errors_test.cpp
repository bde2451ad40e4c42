// Every failure path of the Agent API, with the code and the message's key
// pieces asserted. Parameterized over the backend (see agent_fixture.h).
#include <gmock/gmock.h>

#include "agent_fixture.h"

namespace eplb::xfer::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_P(AgentErrorTest, CreateRejectsBadConfigurations) {
  AgentConfig config;
  config.name = "x";
  config.backend = "carrier-pigeon";
  auto unknown = Agent::create(config);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().code(), Code::InvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("carrier-pigeon"));
  config.backend = GetParam();
  config.name = "";
  EXPECT_EQ(Agent::create(config).status().code(), Code::InvalidArgument);
  config.name = std::string(300, 'x');
  EXPECT_EQ(Agent::create(config).status().code(), Code::InvalidArgument);
}

TEST_P(AgentErrorTest, RegisterRejectsNullEmptyAndDeviceMemory) {
  auto agent = make_agent("solo");
  ASSERT_TRUE(agent);
  std::vector<uint8_t> buffer(16);
  EXPECT_EQ(agent->register_memory({nullptr, 16}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(agent->register_memory({buffer.data(), 0}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(agent->register_memory({buffer.data(), 16, MemoryKind::Device, 0}).status().code(), Code::Unsupported);
}

TEST_P(AgentErrorTest, UnknownPeerIsNotFound) {
  make_pair(64);
  Descriptor d = descriptor_of(remote_buffer.data(), 8);
  auto list = initiator->prepare_remote("nobody", {&d, 1});
  ASSERT_FALSE(list);
  EXPECT_EQ(list.status().code(), Code::NotFound);
  EXPECT_THAT(list.status().message(), HasSubstr("unknown peer nobody"));
  EXPECT_EQ(initiator->send_notification("nobody", "hi").code(), Code::NotFound);
  EXPECT_EQ(initiator->invalidate_peer("nobody").code(), Code::NotFound);
  EXPECT_FALSE(initiator->knows_peer("nobody"));
  EXPECT_TRUE(initiator->knows_peer("target"));
}

TEST_P(AgentErrorTest, UnknownAndReleasedHandlesAreNotFound) {
  make_pair(64);
  EXPECT_EQ(initiator->descriptor_count(0).status().code(), Code::NotFound);
  EXPECT_EQ(initiator->release_descriptor_list(0).code(), Code::NotFound);
  EXPECT_EQ(initiator->release(0).code(), Code::NotFound);
  EXPECT_EQ(initiator->post(12345).code(), Code::NotFound);
  EXPECT_EQ(initiator->status(12345).state, RequestState::Failed);
  EXPECT_EQ(initiator->status(12345).failure.code(), Code::NotFound);
  EXPECT_EQ(initiator->deregister_memory(0).code(), Code::NotFound);
  // A region handle is not a list handle.
  EXPECT_EQ(initiator->release_descriptor_list(local_region).code(), Code::NotFound);

  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request));
  EXPECT_TRUE(initiator->release(*request));
  Status second = initiator->release(*request);
  EXPECT_EQ(second.code(), Code::NotFound);
  EXPECT_THAT(second.message(), HasSubstr("request " + std::to_string(*request)));
  EXPECT_EQ(initiator->post(*request).code(), Code::NotFound);
  RequestId ids[] = {*request};
  EXPECT_EQ(initiator->wait(ids, Deadline::after_seconds(1)).code(), Code::NotFound);
  EXPECT_TRUE(initiator->release_descriptor_list(local));
  EXPECT_EQ(initiator->release_descriptor_list(local).code(), Code::NotFound);
  EXPECT_TRUE(initiator->release_descriptor_list(remote));
  EXPECT_TRUE(initiator->deregister_memory(local_region));
  EXPECT_EQ(initiator->deregister_memory(local_region).code(), Code::NotFound);
}

TEST_P(AgentErrorTest, RemoteDescriptorOutsideTheRegionIsNotFoundBeforeAnyByteMoves) {
  make_pair(4096);
  std::vector<Descriptor> descriptors = {descriptor_of(remote_buffer.data(), 100),
                                         descriptor_of(remote_buffer.data() + 4000, 200)};  // runs 104 bytes past
  auto list = initiator->prepare_remote("target", descriptors);
  ASSERT_FALSE(list);
  EXPECT_EQ(list.status().code(), Code::NotFound);
  EXPECT_THAT(list.status().message(),
              AllOf(HasSubstr("remote descriptor 1"), HasSubstr("200 bytes"), HasSubstr("address 0x"),
                    HasSubstr("agent target")));
  // Entirely outside, and before the start.
  Descriptor before = descriptor_of(remote_buffer.data() - 16, 8);
  EXPECT_EQ(initiator->prepare_remote("target", {&before, 1}).status().code(), Code::NotFound);
  Descriptor empty = descriptor_of(remote_buffer.data(), 0);
  EXPECT_EQ(initiator->prepare_remote("target", {&empty, 1}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(initiator->prepare_remote("target", {}).status().code(), Code::InvalidArgument);
}

TEST_P(AgentErrorTest, DescriptorSpanningTwoRegionsIsNotFound) {
  initiator = make_agent("initiator");
  target = make_agent("target");
  local_buffer.assign(4096, 0);
  remote_buffer.assign(4096, 0);
  ASSERT_TRUE(target->register_memory({remote_buffer.data(), 2048}));
  ASSERT_TRUE(target->register_memory({remote_buffer.data() + 2048, 2048}));
  ASSERT_TRUE(initiator->register_memory({local_buffer.data(), 2048}));
  ASSERT_TRUE(initiator->register_memory({local_buffer.data() + 2048, 2048}));
  exchange();
  Descriptor across_remote = descriptor_of(remote_buffer.data() + 2000, 100);
  auto remote = initiator->prepare_remote("target", {&across_remote, 1});
  ASSERT_FALSE(remote);
  EXPECT_EQ(remote.status().code(), Code::NotFound);
  EXPECT_THAT(remote.status().message(), HasSubstr("not inside one region"));
  Descriptor across_local = descriptor_of(local_buffer.data() + 2000, 100);
  auto local = initiator->prepare_local({&across_local, 1});
  ASSERT_FALSE(local);
  EXPECT_EQ(local.status().code(), Code::NotFound);
  EXPECT_THAT(local.status().message(), HasSubstr("local descriptor 0"));
  // Adjacent descriptors in different regions are not merged into one.
  std::vector<Descriptor> halves = {descriptor_of(local_buffer.data() + 1024, 1024),
                                    descriptor_of(local_buffer.data() + 2048, 1024)};
  auto merged = initiator->prepare_local(halves, /*merge=*/true);
  ASSERT_TRUE(merged);
  EXPECT_EQ(*initiator->descriptor_count(*merged), 2u);
}

TEST_P(AgentErrorTest, WrongDeviceIdIsNotFound) {
  make_pair(4096);
  Descriptor other_device = descriptor_of(remote_buffer.data(), 64, /*device=*/3);
  auto remote = initiator->prepare_remote("target", {&other_device, 1});
  ASSERT_FALSE(remote);
  EXPECT_EQ(remote.status().code(), Code::NotFound);
  EXPECT_THAT(remote.status().message(), AllOf(HasSubstr("device 3"), HasSubstr("has device 0")));
  Descriptor local_other = descriptor_of(local_buffer.data(), 64, 1);
  EXPECT_EQ(initiator->prepare_local({&local_other, 1}).status().code(), Code::NotFound);
}

TEST_P(AgentErrorTest, UnregisteredLocalMemoryIsNotFound) {
  make_pair(64);
  std::vector<uint8_t> elsewhere(64);
  Descriptor d = descriptor_of(elsewhere.data(), 64);
  auto list = initiator->prepare_local({&d, 1});
  ASSERT_FALSE(list);
  EXPECT_EQ(list.status().code(), Code::NotFound);
  EXPECT_THAT(list.status().message(), HasSubstr("registered on this agent"));
}

TEST_P(AgentErrorTest, MakeRequestChecksIndicesLengthsAndListKinds) {
  make_pair(4096);
  std::vector<Descriptor> local_descriptors = {descriptor_of(local_buffer.data(), 100),
                                               descriptor_of(local_buffer.data() + 100, 200)};
  std::vector<Descriptor> remote_descriptors = {descriptor_of(remote_buffer.data(), 100),
                                                descriptor_of(remote_buffer.data() + 100, 300)};
  auto local = initiator->prepare_local(local_descriptors);
  auto remote = initiator->prepare_remote("target", remote_descriptors);
  ASSERT_TRUE(local && remote);
  std::vector<int> out_of_range = {0, 2}, negative = {-1}, zero = {0}, one = {1}, both = {0, 1};
  auto bad = initiator->make_request(Operation::Read, *local, out_of_range, *remote, both);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), Code::InvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("local index 2"), HasSubstr("out of range")));
  EXPECT_EQ(initiator->make_request(Operation::Read, *local, zero, *remote, negative).status().code(),
            Code::InvalidArgument);
  auto mismatch = initiator->make_request(Operation::Write, *local, one, *remote, one);
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.status().code(), Code::InvalidArgument);
  EXPECT_THAT(mismatch.status().message(), AllOf(HasSubstr("pair 0"), HasSubstr("200"), HasSubstr("300")));
  EXPECT_EQ(initiator->make_request(Operation::Read, *local, both, *remote, zero).status().code(),
            Code::InvalidArgument);
  EXPECT_EQ(initiator->make_request(Operation::Read, *remote, zero, *remote, zero).status().code(),
            Code::InvalidArgument);
  EXPECT_EQ(initiator->make_request(Operation::Read, *local, zero, *local, zero).status().code(),
            Code::InvalidArgument);
  EXPECT_EQ(initiator->make_request(static_cast<Operation>(7), *local, zero, *remote, zero).status().code(),
            Code::InvalidArgument);
  EXPECT_EQ(initiator->make_request(Operation::Read, 999, zero, *remote, zero).status().code(), Code::NotFound);
  EXPECT_TRUE(initiator->make_request(Operation::Read, *local, zero, *remote, zero));
}

TEST_P(AgentErrorTest, NeverPostedRequestIsReportedNotWaitedFor) {
  make_pair(64);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  RequestStatus status = initiator->status(*request);
  EXPECT_EQ(status.state, RequestState::Failed);
  EXPECT_EQ(status.failure.code(), Code::NotAllowed);
  EXPECT_THAT(status.failure.message(), HasSubstr("never posted"));
  RequestId ids[] = {*request};
  EXPECT_EQ(initiator->wait(ids, Deadline::after_seconds(5)).code(), Code::NotAllowed);
}

TEST_P(AgentErrorTest, ReloadingIdenticalMetadataIsIdempotent) {
  make_pair(64);
  auto metadata = target->export_metadata();
  ASSERT_TRUE(metadata);
  for (int i = 0; i < 3; ++i) {
    auto loaded = initiator->load_metadata(*metadata);
    ASSERT_TRUE(loaded) << loaded.status().to_string();
  }
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  EXPECT_TRUE(run(*request));
}

TEST_P(AgentErrorTest, ChangedMetadataIsRefusedUntilThePeerIsInvalidated) {
  make_pair(256);
  fill_pattern(remote_buffer.data(), 256, 1);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 256, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request && run(*request));

  // The target restarts under the same name: new connection info, new keys.
  std::vector<uint8_t> new_remote(256);
  fill_pattern(new_remote.data(), 256, 2);
  target.reset();
  target = make_agent("target");
  ASSERT_TRUE(target->register_memory({new_remote.data(), new_remote.size()}));
  auto changed = target->export_metadata();
  ASSERT_TRUE(changed);
  auto refused = initiator->load_metadata(*changed);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::NotAllowed);
  EXPECT_THAT(refused.status().message(), AllOf(HasSubstr("agent target"), HasSubstr("invalidate_peer")));

  ASSERT_TRUE(initiator->invalidate_peer("target"));
  EXPECT_FALSE(initiator->knows_peer("target"));
  ASSERT_TRUE(initiator->load_metadata(*changed));
  ASSERT_TRUE(target->load_metadata(*initiator->export_metadata()));

  // Lists and requests prepared before the invalidation are stale.
  Status stale_post = initiator->post(*request);
  EXPECT_EQ(stale_post.code(), Code::NotAllowed);
  EXPECT_THAT(stale_post.message(), AllOf(HasSubstr("invalidated"), HasSubstr("agent target")));
  auto stale_request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_FALSE(stale_request);
  EXPECT_EQ(stale_request.status().code(), Code::NotAllowed);

  // A fresh list against the reloaded peer works and reads the new memory.
  Descriptor fresh = descriptor_of(new_remote.data(), 256);
  auto fresh_list = initiator->prepare_remote("target", {&fresh, 1});
  ASSERT_TRUE(fresh_list) << fresh_list.status().to_string();
  auto fresh_request = initiator->make_request(Operation::Read, local, {}, *fresh_list, {});
  ASSERT_TRUE(fresh_request);
  ASSERT_TRUE(run(*fresh_request));
  EXPECT_EQ(local_buffer, new_remote);
  target.reset();  // before new_remote goes away
}

TEST_P(AgentErrorTest, DeregisterRefusedWhileAListUsesTheRegion) {
  make_pair(64);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  Status refused = initiator->deregister_memory(local_region);
  EXPECT_EQ(refused.code(), Code::NotAllowed);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(initiator->release_descriptor_list(local));
  EXPECT_EQ(initiator->deregister_memory(local_region).code(), Code::NotAllowed) << "the request still uses it";
  ASSERT_TRUE(run(*request)) << "a request keeps its lists alive after they are released";
  ASSERT_TRUE(initiator->release(*request));
  EXPECT_TRUE(initiator->deregister_memory(local_region));
}

TEST_P(AgentErrorTest, RepostWhileInProgressIsNotAllowed) {
  make_pair(64, "delay_ms=200");
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(initiator->post(*request));
  EXPECT_EQ(initiator->status(*request).state, RequestState::InProgress);
  Status again = initiator->post(*request);
  EXPECT_EQ(again.code(), Code::NotAllowed);
  EXPECT_THAT(again.message(), AllOf(HasSubstr("still in progress"), HasSubstr("READ of 1 descriptor (64 B)")));
  RequestId ids[] = {*request};
  EXPECT_TRUE(wait_driving(*initiator, *target, ids, Deadline::after_seconds(10)));
  EXPECT_TRUE(initiator->post(*request)) << "a finished request can be posted again";
  EXPECT_TRUE(wait_driving(*initiator, *target, ids, Deadline::after_seconds(10)));
}

TEST_P(AgentErrorTest, DeadlineReachedListsTheRequestsStillInProgress) {
  make_pair(4096, "stall=1");
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 4096, &local, &remote);
  auto first = initiator->make_request(Operation::Read, local, {}, remote, {});
  auto second = initiator->make_request(Operation::Write, local, {}, remote, {});
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(initiator->post(*first));
  ASSERT_TRUE(initiator->post(*second));
  RequestId ids[] = {*first, *second};
  Stopwatch watch;
  Status waited = initiator->wait(ids, Deadline::after(std::chrono::milliseconds(50)));
  double elapsed = watch.seconds();
  EXPECT_EQ(waited.code(), Code::Timeout);
  EXPECT_GE(elapsed, 0.049);
  EXPECT_LT(elapsed, 2.0);
  EXPECT_THAT(waited.message(),
              AllOf(HasSubstr("2 of 2 requests still in progress"), HasSubstr("request " + std::to_string(*first)),
                    HasSubstr("request " + std::to_string(*second)), HasSubstr("READ of 1 descriptor (4 KiB) from agent target"),
                    HasSubstr("WRITE of 1 descriptor (4 KiB) to agent target"), HasSubstr("timed out after")));
  EXPECT_EQ(initiator->status(*first).state, RequestState::InProgress);
  EXPECT_TRUE(initiator->release(*first)) << "release cancels a running request";
  EXPECT_TRUE(initiator->release(*second));
}

TEST_P(AgentErrorTest, InvalidatingAPeerCancelsItsRunningRequests) {
  make_pair(64, "stall=1");
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request && initiator->post(*request));
  ASSERT_TRUE(initiator->invalidate_peer("target"));
  RequestStatus status = initiator->status(*request);
  EXPECT_EQ(status.state, RequestState::Failed);
  EXPECT_EQ(status.failure.code(), Code::Canceled);
  EXPECT_THAT(status.failure.message(), HasSubstr("invalidated"));
}

INSTANTIATE_TEST_SUITE_P(Loopback, AgentErrorTest, ::testing::Values("loopback"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
