// Behaviour specific to the loopback backend: process-local addressing,
// destroyed peers, deregistered remote regions, self transfers, threads.
#include <gmock/gmock.h>
#include <unistd.h>

#include <thread>

#include "../../src/xfer/metadata.h"
#include "agent_fixture.h"

namespace eplb::xfer::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class LoopbackTest : public AgentPairTest {};

TEST_P(LoopbackTest, MetadataFromAnotherProcessIsUnsupported) {
  make_pair(64);
  auto exported = target->export_metadata();
  ASSERT_TRUE(exported);
  auto metadata = decode_metadata(*exported);
  ASSERT_TRUE(metadata);
  ASSERT_EQ(metadata->connection_info.size(), 16u);
  uint32_t other_pid = static_cast<uint32_t>(getpid()) + 1;
  for (int i = 0; i < 4; ++i) metadata->connection_info[4 + i] = static_cast<uint8_t>(other_pid >> (8 * i));
  metadata->agent_name = "elsewhere";
  auto foreign = encode_metadata(*metadata);
  ASSERT_TRUE(foreign);
  auto loaded = initiator->load_metadata(*foreign);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.status().code(), Code::Unsupported);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr("agent elsewhere"), HasSubstr("process " + std::to_string(other_pid)), HasSubstr("ucx")));
}

TEST_P(LoopbackTest, DestroyedPeerGivesRemoteDisconnectAndOtherPeersStillWork) {
  make_pair(64);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  auto metadata = target->export_metadata();
  target.reset();
  Status failed = initiator->post(*request);
  if (failed) {
    RequestId ids[] = {*request};
    failed = initiator->wait(ids, Deadline::after_seconds(5));
  }
  EXPECT_EQ(failed.code(), Code::RemoteDisconnect);
  EXPECT_THAT(failed.message(), AllOf(HasSubstr("READ of 1 descriptor (64 B) from agent target failed after"),
                                      HasSubstr("remote disconnect (loopback: agent target was destroyed)")));
  EXPECT_EQ(initiator->send_notification("target", "hello?").code(), Code::RemoteDisconnect);
  ASSERT_TRUE(initiator->invalidate_peer("target"));
  EXPECT_EQ(initiator->load_metadata(*metadata).status().code(), Code::RemoteDisconnect);

  // Another peer still works.
  auto other = make_agent("other");
  std::vector<uint8_t> other_buffer(64);
  fill_pattern(other_buffer.data(), 64, 11);
  ASSERT_TRUE(other->register_memory({other_buffer.data(), 64}));
  ASSERT_TRUE(initiator->load_metadata(*other->export_metadata()));
  Descriptor d = descriptor_of(other_buffer.data(), 64);
  auto other_list = initiator->prepare_remote("other", {&d, 1});
  ASSERT_TRUE(other_list);
  auto read = initiator->make_request(Operation::Read, local, {}, *other_list, {});
  ASSERT_TRUE(read);
  ASSERT_TRUE(initiator->post(*read));
  RequestId ids[] = {*read};
  ASSERT_TRUE(initiator->wait(ids, Deadline::after_seconds(5)));
  EXPECT_EQ(local_buffer, other_buffer);
  other.reset();
}

TEST_P(LoopbackTest, DeregisteredRemoteRegionFailsTheTransfer) {
  make_pair(64);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 64, &local, &remote);
  auto request = initiator->make_request(Operation::Write, local, {}, remote, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(target->deregister_memory(remote_region));
  Status failed = run(*request, 5);
  EXPECT_EQ(failed.code(), Code::Backend);
  EXPECT_THAT(failed.message(), HasSubstr("deregistered"));
}

TEST_P(LoopbackTest, AnAgentCanTransferWithinItself) {
  auto solo = make_agent("solo");
  std::vector<uint8_t> buffer(8192);
  fill_pattern(buffer.data(), 4096, 12);
  ASSERT_TRUE(solo->register_memory({buffer.data(), buffer.size()}));
  ASSERT_TRUE(solo->load_metadata(*solo->export_metadata()));
  Descriptor source = descriptor_of(buffer.data(), 4096), destination = descriptor_of(buffer.data() + 4096, 4096);
  auto local = solo->prepare_local({&destination, 1});
  auto remote = solo->prepare_remote("solo", {&source, 1});
  ASSERT_TRUE(local && remote);
  auto request = solo->make_request(Operation::Read, *local, {}, *remote, {}, "self");
  ASSERT_TRUE(request && solo->post(*request));
  RequestId ids[] = {*request};
  ASSERT_TRUE(solo->wait(ids, Deadline::after_seconds(5)));
  EXPECT_EQ(std::memcmp(buffer.data(), buffer.data() + 4096, 4096), 0);
  auto notes = solo->take_notifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].peer, "solo");
}

// Two agents driven from two threads at once (one thread per agent).
TEST_P(LoopbackTest, AgentsOnDifferentThreads) {
  constexpr size_t kBytes = 1 << 16;
  constexpr int kRounds = 200;
  auto left = make_agent("left"), right = make_agent("right");
  std::vector<uint8_t> left_source(kBytes), right_source(kBytes), left_sink(kBytes), right_sink(kBytes);
  fill_pattern(left_source.data(), kBytes, 1);
  fill_pattern(right_source.data(), kBytes, 2);
  for (auto* pair : {&left, &right}) ASSERT_TRUE(*pair);
  ASSERT_TRUE(left->register_memory({left_source.data(), kBytes}));
  ASSERT_TRUE(left->register_memory({left_sink.data(), kBytes}));
  ASSERT_TRUE(right->register_memory({right_source.data(), kBytes}));
  ASSERT_TRUE(right->register_memory({right_sink.data(), kBytes}));
  ASSERT_TRUE(left->load_metadata(*right->export_metadata()));
  ASSERT_TRUE(right->load_metadata(*left->export_metadata()));

  auto worker = [&](Agent& self, const std::string& peer, std::vector<uint8_t>& sink, std::vector<uint8_t>& source,
                    Status* result) {
    Descriptor l = descriptor_of(sink.data(), kBytes), r = descriptor_of(source.data(), kBytes);
    auto local = self.prepare_local({&l, 1});
    auto remote = self.prepare_remote(peer, {&r, 1});
    if (!local || !remote) {
      *result = !local ? local.status() : remote.status();
      return;
    }
    auto request = self.make_request(Operation::Read, *local, {}, *remote, {}, "round");
    if (!request) {
      *result = request.status();
      return;
    }
    for (int round = 0; round < kRounds; ++round) {
      Status posted = self.post(*request);
      RequestId ids[] = {*request};
      if (posted) posted = self.wait(ids, Deadline::after_seconds(10));
      if (!posted) {
        *result = posted;
        return;
      }
      (void)self.take_notifications();
    }
    *result = sink == source ? Status::ok() : error(Code::Mismatch, "bytes differ");
  };
  Status left_result, right_result;
  std::thread left_thread(worker, std::ref(*left), "right", std::ref(left_sink), std::ref(right_source), &left_result);
  std::thread right_thread(worker, std::ref(*right), "left", std::ref(right_sink), std::ref(left_source),
                           &right_result);
  left_thread.join();
  right_thread.join();
  EXPECT_TRUE(left_result) << left_result.to_string();
  EXPECT_TRUE(right_result) << right_result.to_string();
}

INSTANTIATE_TEST_SUITE_P(Loopback, LoopbackTest, ::testing::Values("loopback"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
