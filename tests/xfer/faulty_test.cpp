// The faulty decorator: each fault kind yields the right status within the
// deadline, the sequence is deterministic for a seed, the spec parser names
// what is wrong, and failure messages have the documented format.
#include <gmock/gmock.h>


#include "agent_fixture.h"
#include "common/bytes.h"

namespace eplb::xfer::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Prepares 9 descriptors of 4 KiB (36 KiB) on each side.
void prepare_nine(AgentPairTest& pair, DescriptorListId* local, DescriptorListId* remote) {
  std::vector<Descriptor> l, r;
  for (int i = 0; i < 9; ++i) {
    l.push_back(descriptor_of(pair.local_buffer.data() + i * 4096, 4096));
    r.push_back(descriptor_of(pair.remote_buffer.data() + i * 4096, 4096));
  }
  auto local_list = pair.initiator->prepare_local(l);
  auto remote_list = pair.initiator->prepare_remote("target", r);
  ASSERT_TRUE(local_list && remote_list);
  *local = *local_list;
  *remote = *remote_list;
}

size_t differing_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t* where) {
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      ++count;
      *where = i;
    }
  return count;
}

TEST_P(FaultyTest, ErrFailsWithTheDocumentedMessageAndMovesNoBytes) {
  make_pair(9 * 4096, "err=1");
  fill_pattern(remote_buffer.data(), remote_buffer.size(), 1);
  DescriptorListId local = 0, remote = 0;
  prepare_nine(*this, &local, &remote);
  for (Operation op : {Operation::Read, Operation::Write}) {
    auto request = initiator->make_request(op, local, {}, remote, {});
    ASSERT_TRUE(request);
    Stopwatch watch;
    Status failed = run(*request, 5);
    EXPECT_LT(watch.seconds(), 5.0);
    EXPECT_EQ(failed.code(), Code::Backend);
    std::string prefix = op == Operation::Read ? "READ of 9 descriptors (36 KiB) from agent target failed after "
                                               : "WRITE of 9 descriptors (36 KiB) to agent target failed after ";
    const std::string suffix = ": backend error (injected backend error)";
    const std::string& message = failed.message();
    ASSERT_TRUE(message.starts_with(prefix)) << message;
    ASSERT_TRUE(message.ends_with(suffix)) << message;
    // Between them: the elapsed time, "<digits>[.<digit>] <us|ms|s>".
    std::string elapsed = message.substr(prefix.size(), message.size() - prefix.size() - suffix.size());
    size_t space = elapsed.find(' ');
    ASSERT_NE(space, std::string::npos) << elapsed;
    EXPECT_TRUE(elapsed.find_first_not_of("0123456789.") == space && space > 0) << elapsed;
    std::string unit = elapsed.substr(space + 1);
    EXPECT_TRUE(unit == "us" || unit == "ms" || unit == "s") << elapsed;
    RequestStatus status = initiator->status(*request);
    EXPECT_EQ(status.state, RequestState::Failed);
    EXPECT_EQ(status.failure.message(), failed.message());
  }
  EXPECT_TRUE(std::all_of(local_buffer.begin(), local_buffer.end(), [](uint8_t b) { return b == 0; }));
}

TEST_P(FaultyTest, StallStaysInProgressUntilTheDeadlineAndRelease) {
  make_pair(4096, "stall=1");
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 4096, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request && initiator->post(*request));
  RequestId ids[] = {*request};
  Stopwatch watch;
  Status waited = wait_driving(*initiator, *target, ids, Deadline::after(std::chrono::milliseconds(100)));
  EXPECT_EQ(waited.code(), Code::Timeout);
  EXPECT_GE(watch.seconds(), 0.099);
  EXPECT_LT(watch.seconds(), 3.0);
  EXPECT_EQ(initiator->status(*request).state, RequestState::InProgress);
  EXPECT_TRUE(initiator->release(*request));
  EXPECT_EQ(initiator->status(*request).failure.code(), Code::NotFound);
}

// Made with checksum_landed: no segment reports the checksum of bytes that
// are no longer what landed (the flipped one's is dropped); loopback copies
// itself, so every other segment reports its landed bytes' checksum.
TEST_P(FaultyTest, CorruptReadFlipsOneLandedByte) {
  make_pair(9 * 4096, "corrupt=1,seed=3");
  fill_pattern(remote_buffer.data(), remote_buffer.size(), 4);
  DescriptorListId local = 0, remote = 0;
  prepare_nine(*this, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {}, {}, /*checksum_landed=*/true);
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request, 10));
  size_t where = 0;
  EXPECT_EQ(differing_bytes(local_buffer, remote_buffer, &where), 1u);
  EXPECT_EQ(local_buffer[where], static_cast<uint8_t>(remote_buffer[where] ^ 0xFF));
  auto landed = initiator->landed_checksums(*request);
  ASSERT_TRUE(landed) << landed.status().to_string();
  ASSERT_EQ(landed->size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    const bool flipped = where / 4096 == i;
    if ((*landed)[i]) {
      EXPECT_EQ(*(*landed)[i], bytes::checksum(std::span<const uint8_t>(local_buffer.data() + i * 4096, 4096)));
    }
    EXPECT_FALSE(flipped && (*landed)[i]) << "segment " << i << " kept the checksum of the bytes before the flip";
    if (GetParam() == "loopback") {
      EXPECT_EQ((*landed)[i].has_value(), !flipped) << "segment " << i;
    }
  }
}

TEST_P(FaultyTest, CorruptWriteFlipsOneRemoteByteAndKeepsTheSource) {
  make_pair(9 * 4096, "corrupt=1,seed=5");
  fill_pattern(local_buffer.data(), local_buffer.size(), 6);
  std::vector<uint8_t> source = local_buffer;
  DescriptorListId local = 0, remote = 0;
  prepare_nine(*this, &local, &remote);
  auto request = initiator->make_request(Operation::Write, local, {}, remote, {}, "written");
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request, 10));
  EXPECT_EQ(local_buffer, source) << "the source must stay intact";
  size_t where = 0;
  EXPECT_EQ(differing_bytes(remote_buffer, source, &where), 1u);
  EXPECT_EQ(remote_buffer[where], static_cast<uint8_t>(source[where] ^ 0xFF));
  auto arrived = wait_notifications_driving(*target, *initiator, Deadline::after_seconds(10));
  ASSERT_TRUE(arrived) << arrived.status().to_string();
  ASSERT_EQ(arrived->size(), 1u);
  EXPECT_EQ((*arrived)[0].message, "written");
}

TEST_P(FaultyTest, DelayHoldsCompletionForAtLeastTheDelay) {
  make_pair(4096, "delay_ms=120");
  fill_pattern(remote_buffer.data(), 4096, 8);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 4096, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  Stopwatch watch;
  ASSERT_TRUE(initiator->post(*request));
  EXPECT_EQ(initiator->status(*request).state, RequestState::InProgress);
  RequestId ids[] = {*request};
  ASSERT_TRUE(wait_driving(*initiator, *target, ids, Deadline::after_seconds(10)));
  EXPECT_GE(watch.seconds(), 0.119);
  EXPECT_EQ(local_buffer, remote_buffer);
}

TEST_P(FaultyTest, DisconnectAfterFailsLaterPostsAndNotifications) {
  make_pair(4096, "disconnect_after=2");
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 4096, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request, 10)) << "post 1";
  ASSERT_TRUE(initiator->send_notification("target", "still here"));
  ASSERT_TRUE(run(*request, 10)) << "post 2";
  for (int post = 3; post <= 4; ++post) {
    Status failed = run(*request, 10);
    EXPECT_EQ(failed.code(), Code::RemoteDisconnect) << "post " << post;
    EXPECT_THAT(failed.message(), AllOf(HasSubstr("READ of 1 descriptor (4 KiB) from agent target failed after"),
                                        HasSubstr("remote disconnect (injected: peer vanished)")));
  }
  Status notification = initiator->send_notification("target", "gone?");
  EXPECT_EQ(notification.code(), Code::RemoteDisconnect);
  EXPECT_THAT(notification.message(), AllOf(HasSubstr("notification to agent target failed"),
                                            HasSubstr("remote disconnect (injected: peer vanished)")));
}

// 'F' failed, 'C' done but corrupted, 'D' done intact.
std::string outcome_sequence(AgentPairTest& pair, const std::string& spec, int posts) {
  pair.make_pair(256, spec);
  std::string outcomes;
  DescriptorListId local = 0, remote = 0;
  pair.prepare_whole(0, 256, &local, &remote);
  auto request = pair.initiator->make_request(Operation::Read, local, {}, remote, {});
  EXPECT_TRUE(request);
  for (int i = 0; i < posts; ++i) {
    fill_pattern(pair.remote_buffer.data(), 256, i);
    std::fill(pair.local_buffer.begin(), pair.local_buffer.end(), 0);
    Status result = pair.run(*request, 10);
    outcomes += !result ? 'F' : pair.local_buffer == pair.remote_buffer ? 'D' : 'C';
  }
  return outcomes;
}

TEST_P(FaultyTest, FaultSequenceIsDeterministicForASeed) {
  const std::string spec = "err=0.25,corrupt=0.25,seed=42";
  std::string first = outcome_sequence(*this, spec, 60);
  std::string second = outcome_sequence(*this, spec, 60);
  EXPECT_EQ(first, second);
  EXPECT_NE(first.find('F'), std::string::npos) << first;
  EXPECT_NE(first.find('C'), std::string::npos) << first;
  EXPECT_NE(first.find('D'), std::string::npos) << first;
  std::string other_seed = outcome_sequence(*this, "err=0.25,corrupt=0.25,seed=43", 60);
  EXPECT_NE(first, other_seed);
  std::string clean = outcome_sequence(*this, "seed=42", 20);
  EXPECT_EQ(clean, std::string(20, 'D'));
}

TEST_P(FaultyTest, SpecErrorsNameTheKey) {
  auto create = [&](const std::string& spec) {
    AgentConfig config;
    config.name = "spec";
    config.backend = GetParam();
    config.fault_spec = spec;
    return Agent::create(config);
  };
  struct Case {
    const char* spec;
    const char* piece;
  } cases[] = {
      {"bogus=1", "unknown key 'bogus'"},     {"err=2", "key 'err'"},
      {"stall=-0.1", "key 'stall'"},          {"corrupt=x", "key 'corrupt'"},
      {"delay_ms=-5", "key 'delay_ms'"},      {"disconnect_after=1.5", "key 'disconnect_after'"},
      {"seed=", "key 'seed'"},                {"err=0.1,err=0.2", "key 'err' repeated"},
      {"err=0.6,stall=0.6", "exceeds 1"},     {"err=0.1,,seed=1", "not key=value"},
      {"err", "not key=value"},               {"err=nan", "key 'err'"},
  };
  for (const Case& c : cases) {
    auto agent = create(c.spec);
    ASSERT_FALSE(agent) << c.spec;
    EXPECT_EQ(agent.status().code(), Code::InvalidArgument) << c.spec;
    EXPECT_THAT(agent.status().message(), HasSubstr(c.piece)) << c.spec;
  }
  for (const char* good : {"seed=7", "delay_ms=0", "err=0.01,stall=0.002,corrupt=0.001,delay_ms=5,disconnect_after=100,seed=7"}) {
    auto agent = create(good);
    EXPECT_TRUE(agent) << good << ": " << agent.status().to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, FaultyTest, ::testing::Values("loopback"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
