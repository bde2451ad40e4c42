// READ / WRITE between two agents of one process, data checked byte for byte.
#include <numeric>
#include <random>

#include "agent_fixture.h"

namespace eplb::xfer::testing {
namespace {

void expect_same_bytes(const uint8_t* actual, const uint8_t* expected, size_t length) {
  if (std::memcmp(actual, expected, length) == 0) return;
  for (size_t i = 0; i < length; ++i)
    if (actual[i] != expected[i]) {
      ADD_FAILURE() << "first differing byte at offset " << i << " of " << length;
      return;
    }
}

TEST_P(TransferTest, ReadAndWriteOneDescriptorFromOneByteTo64MiB) {
  const size_t kMax = 64u << 20;
  make_pair(kMax);
  for (size_t length : {size_t{1}, size_t{7}, size_t{4096}, size_t{(1u << 20) + 3}, kMax}) {
    for (Operation op : {Operation::Read, Operation::Write}) {
      SCOPED_TRACE(std::string(operation_name(op)) + " of " + std::to_string(length) + " bytes");
      uint8_t* source = op == Operation::Read ? remote_buffer.data() : local_buffer.data();
      uint8_t* destination = op == Operation::Read ? local_buffer.data() : remote_buffer.data();
      fill_pattern(source, length, length + static_cast<int>(op));
      std::memset(destination, 0, length + (length < kMax ? 1 : 0));
      DescriptorListId local = 0, remote = 0;
      prepare_whole(0, length, &local, &remote);
      auto request = initiator->make_request(op, local, {}, remote, {});
      ASSERT_TRUE(request) << request.status().to_string();
      Status done = run(*request);
      ASSERT_TRUE(done) << done.to_string();
      EXPECT_EQ(initiator->status(*request).state, RequestState::Done);
      expect_same_bytes(destination, source, length);
      if (length < kMax) {
        EXPECT_EQ(destination[length], 0) << "wrote past the descriptor";
      }
      EXPECT_TRUE(initiator->release(*request));
      EXPECT_TRUE(initiator->release_descriptor_list(local));
      EXPECT_TRUE(initiator->release_descriptor_list(remote));
    }
  }
}

// `count` descriptors of different lengths at scattered offsets, paired in
// a shuffled order, in one request.
void run_scattered(AgentPairTest& pair, Operation op, size_t count) {
  std::mt19937_64 random(count * 31 + static_cast<int>(op));
  std::vector<Descriptor> local_descriptors, remote_descriptors;
  std::vector<size_t> lengths;
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t length = 1 + random() % 3000;
    lengths.push_back(length);
    local_descriptors.push_back(descriptor_of(pair.local_buffer.data() + offset, length));
    offset += length + random() % 64;
  }
  ASSERT_LE(offset, pair.local_buffer.size());
  // Remote descriptors: same lengths, placed in reverse order.
  std::vector<int> remote_order(count);
  std::iota(remote_order.begin(), remote_order.end(), 0);
  std::shuffle(remote_order.begin(), remote_order.end(), random);
  remote_descriptors.resize(count);
  offset = 0;
  for (int index : remote_order) {
    remote_descriptors[index] = descriptor_of(pair.remote_buffer.data() + offset, lengths[index]);
    offset += lengths[index] + 5;
  }
  ASSERT_LE(offset, pair.remote_buffer.size());
  fill_pattern(pair.local_buffer.data(), pair.local_buffer.size(), count);
  fill_pattern(pair.remote_buffer.data(), pair.remote_buffer.size(), count + 1000);
  std::vector<uint8_t> local_before = pair.local_buffer, remote_before = pair.remote_buffer;

  auto local = pair.initiator->prepare_local(local_descriptors);
  ASSERT_TRUE(local) << local.status().to_string();
  auto remote = pair.initiator->prepare_remote("target", remote_descriptors);
  ASSERT_TRUE(remote) << remote.status().to_string();
  // local descriptor i pairs with remote descriptor i, but listed in a permuted order.
  std::vector<int> indices(remote_order.begin(), remote_order.end());
  auto request = pair.initiator->make_request(op, *local, indices, *remote, indices);
  ASSERT_TRUE(request) << request.status().to_string();
  Status done = pair.run(*request);
  ASSERT_TRUE(done) << done.to_string();

  std::vector<uint8_t> expected_local = local_before, expected_remote = remote_before;
  for (size_t i = 0; i < count; ++i) {
    auto* l = reinterpret_cast<uint8_t*>(local_descriptors[i].address);
    auto* r = reinterpret_cast<uint8_t*>(remote_descriptors[i].address);
    size_t local_offset = l - pair.local_buffer.data(), remote_offset = r - pair.remote_buffer.data();
    if (op == Operation::Read)
      std::memcpy(expected_local.data() + local_offset, remote_before.data() + remote_offset, lengths[i]);
    else
      std::memcpy(expected_remote.data() + remote_offset, local_before.data() + local_offset, lengths[i]);
  }
  EXPECT_TRUE(pair.local_buffer == expected_local) << "local buffer differs";
  EXPECT_TRUE(pair.remote_buffer == expected_remote) << "remote buffer differs";
  EXPECT_TRUE(pair.initiator->release(*request));
}

TEST_P(TransferTest, ManyDescriptorsInOneRequest) {
  make_pair(1024 * 3100);
  for (size_t count : {size_t{1}, size_t{2}, size_t{9}, size_t{16}, size_t{1024}})
    for (Operation op : {Operation::Read, Operation::Write}) {
      SCOPED_TRACE(std::string(operation_name(op)) + " of " + std::to_string(count) + " descriptors");
      run_scattered(*this, op, count);
    }
}

TEST_P(TransferTest, SubsetOfIndicesMovesOnlyThoseDescriptors) {
  make_pair(4096);
  fill_pattern(remote_buffer.data(), 4096, 5);
  std::vector<Descriptor> local_descriptors, remote_descriptors;
  for (int i = 0; i < 4; ++i) {
    local_descriptors.push_back(descriptor_of(local_buffer.data() + i * 1024, 1024));
    remote_descriptors.push_back(descriptor_of(remote_buffer.data() + i * 1024, 1024));
  }
  auto local = initiator->prepare_local(local_descriptors);
  auto remote = initiator->prepare_remote("target", remote_descriptors);
  ASSERT_TRUE(local && remote);
  std::vector<int> local_indices = {0, 3}, remote_indices = {2, 1};
  auto request = initiator->make_request(Operation::Read, *local, local_indices, *remote, remote_indices);
  ASSERT_TRUE(request) << request.status().to_string();
  ASSERT_TRUE(run(*request));
  EXPECT_EQ(std::memcmp(local_buffer.data(), remote_buffer.data() + 2048, 1024), 0);
  EXPECT_EQ(std::memcmp(local_buffer.data() + 3072, remote_buffer.data() + 1024, 1024), 0);
  std::vector<uint8_t> zeros(1024, 0);
  EXPECT_EQ(std::memcmp(local_buffer.data() + 1024, zeros.data(), 1024), 0);
  EXPECT_EQ(std::memcmp(local_buffer.data() + 2048, zeros.data(), 1024), 0);
}

TEST_P(TransferTest, AdjacentDescriptorsMergeWhenAsked) {
  make_pair(8192);
  fill_pattern(remote_buffer.data(), 8192, 9);
  std::vector<Descriptor> pieces;
  for (int i = 0; i < 8; ++i) pieces.push_back(descriptor_of(local_buffer.data() + i * 512, 512));
  pieces.push_back(descriptor_of(local_buffer.data() + 5000, 100));  // not adjacent
  auto merged = initiator->prepare_local(pieces, /*merge=*/true);
  ASSERT_TRUE(merged) << merged.status().to_string();
  EXPECT_EQ(*initiator->descriptor_count(*merged), 2u);
  auto unmerged = initiator->prepare_local(pieces, /*merge=*/false);
  ASSERT_TRUE(unmerged);
  EXPECT_EQ(*initiator->descriptor_count(*unmerged), 9u);
  std::vector<Descriptor> remote_pieces = {descriptor_of(remote_buffer.data(), 2048),
                                           descriptor_of(remote_buffer.data() + 2048, 2048),
                                           descriptor_of(remote_buffer.data() + 6000, 100)};
  auto remote = initiator->prepare_remote("target", remote_pieces, /*merge=*/true);
  ASSERT_TRUE(remote) << remote.status().to_string();
  EXPECT_EQ(*initiator->descriptor_count(*remote), 2u);
  auto request = initiator->make_request(Operation::Read, *merged, {}, *remote, {});
  ASSERT_TRUE(request) << request.status().to_string();
  ASSERT_TRUE(run(*request));
  EXPECT_EQ(std::memcmp(local_buffer.data(), remote_buffer.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(local_buffer.data() + 5000, remote_buffer.data() + 6000, 100), 0);
}

TEST_P(TransferTest, RequestCanBeRepostedOnceFinished) {
  make_pair(256);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 256, &local, &remote);
  auto request = initiator->make_request(Operation::Read, local, {}, remote, {});
  ASSERT_TRUE(request);
  for (int round = 0; round < 3; ++round) {
    fill_pattern(remote_buffer.data(), 256, round);
    ASSERT_TRUE(run(*request));
    EXPECT_EQ(local_buffer, remote_buffer) << "round " << round;
  }
}

// The UCX backend reposts a finished request on the same object (no new
// backend request); every repost must move the current bytes, for READ and
// WRITE, and deliver its notification again.
TEST_P(TransferTest, RepostedRequestMovesCurrentBytesAndNotifiesEveryTime) {
  make_pair(4096);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, 4096, &local, &remote);
  auto read = initiator->make_request(Operation::Read, local, {}, remote, {}, "read");
  auto write = initiator->make_request(Operation::Write, local, {}, remote, {}, "write");
  ASSERT_TRUE(read && write);
  for (int round = 0; round < 20; ++round) {
    fill_pattern(remote_buffer.data(), 4096, round);
    ASSERT_TRUE(run(*read)) << "round " << round;
    ASSERT_EQ(local_buffer, remote_buffer) << "READ round " << round;
    fill_pattern(local_buffer.data(), 4096, 1000 + round);
    ASSERT_TRUE(run(*write)) << "round " << round;
    ASSERT_EQ(local_buffer, remote_buffer) << "WRITE round " << round;
    auto arrived = wait_notifications_driving(*target, *initiator, Deadline::after_seconds(10));
    ASSERT_TRUE(arrived) << arrived.status().to_string();
    size_t total = arrived->size();
    if (total < 2) {
      auto more = wait_notifications_driving(*target, *initiator, Deadline::after_seconds(10));
      ASSERT_TRUE(more) << more.status().to_string();
      total += more->size();
    }
    EXPECT_EQ(total, 2u) << "round " << round;
  }
  // A finished request of an invalidated peer is not reposted.
  ASSERT_TRUE(initiator->invalidate_peer("target"));
  Status stale = initiator->post(*read);
  EXPECT_EQ(stale.code(), Code::NotAllowed) << stale.to_string();
}

TEST_P(TransferTest, NotificationArrivesAfterTheTransferLanded) {
  make_pair(1 << 20);
  fill_pattern(local_buffer.data(), local_buffer.size(), 77);
  DescriptorListId local = 0, remote = 0;
  prepare_whole(0, local_buffer.size(), &local, &remote);
  auto request = initiator->make_request(Operation::Write, local, {}, remote, {}, "layer 3 landed");
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request));
  auto arrived = wait_notifications_driving(*target, *initiator, Deadline::after_seconds(10));
  ASSERT_TRUE(arrived) << arrived.status().to_string();
  ASSERT_EQ(arrived->size(), 1u);
  EXPECT_EQ((*arrived)[0].peer, "initiator");
  EXPECT_EQ((*arrived)[0].message, "layer 3 landed");
  EXPECT_EQ(local_buffer, remote_buffer) << "notified before the bytes landed";
  EXPECT_TRUE(target->take_notifications().empty());
  // A READ's notification goes to the peer too.
  auto read = initiator->make_request(Operation::Read, local, {}, remote, {}, "read done");
  ASSERT_TRUE(read && run(*read));
  arrived = wait_notifications_driving(*target, *initiator, Deadline::after_seconds(10));
  ASSERT_TRUE(arrived);
  ASSERT_EQ(arrived->size(), 1u);
  EXPECT_EQ((*arrived)[0].message, "read done");
}

TEST_P(TransferTest, StandaloneNotificationsBothWaysInOrder) {
  make_pair(64);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(initiator->send_notification("target", "message " + std::to_string(i)));
  std::string binary("\0\x01\xff zero", 8);
  ASSERT_TRUE(target->send_notification("initiator", binary));
  std::vector<Notification> received;
  Deadline deadline = Deadline::after_seconds(10);
  while (received.size() < 5 && !deadline.expired()) {
    auto arrived = wait_notifications_driving(*target, *initiator, deadline);
    ASSERT_TRUE(arrived) << arrived.status().to_string();
    received.insert(received.end(), arrived->begin(), arrived->end());
  }
  ASSERT_EQ(received.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(received[i].peer, "initiator");
    EXPECT_EQ(received[i].message, "message " + std::to_string(i));
  }
  auto back = wait_notifications_driving(*initiator, *target, Deadline::after_seconds(10));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].peer, "target");
  EXPECT_EQ((*back)[0].message, binary);
}

TEST_P(TransferTest, WaitNotificationsTimesOutWithoutOne) {
  make_pair(64);
  Stopwatch watch;
  auto arrived = target->wait_notifications(Deadline::after(std::chrono::milliseconds(30)));
  ASSERT_FALSE(arrived);
  EXPECT_EQ(arrived.status().code(), Code::Timeout);
  EXPECT_GE(watch.seconds(), 0.029);
  EXPECT_LT(watch.seconds(), 2.0);
}

TEST_P(TransferTest, PartialMetadataExposesOnlyTheListedRegions) {
  initiator = make_agent("initiator");
  target = make_agent("target");
  local_buffer.assign(4096, 0);
  remote_buffer.assign(4096, 0);
  fill_pattern(remote_buffer.data(), 4096, 3);
  auto first = target->register_memory({remote_buffer.data(), 2048});
  auto second = target->register_memory({remote_buffer.data() + 2048, 2048});
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(initiator->register_memory({local_buffer.data(), 4096}));
  RegionId only_second[] = {*second};
  auto partial = target->export_metadata(only_second);
  ASSERT_TRUE(partial) << partial.status().to_string();
  ASSERT_TRUE(initiator->load_metadata(*partial));
  Descriptor in_first = descriptor_of(remote_buffer.data(), 100);
  Descriptor in_second = descriptor_of(remote_buffer.data() + 3000, 100);
  auto refused = initiator->prepare_remote("target", {&in_first, 1});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::NotFound);
  auto accepted = initiator->prepare_remote("target", {&in_second, 1});
  ASSERT_TRUE(accepted) << accepted.status().to_string();
  // Loading more of the same agent's regions extends what is known.
  auto full = target->export_metadata();
  ASSERT_TRUE(full);
  ASSERT_TRUE(initiator->load_metadata(*full));
  auto now_accepted = initiator->prepare_remote("target", {&in_first, 1});
  ASSERT_TRUE(now_accepted) << now_accepted.status().to_string();
  Descriptor local = descriptor_of(local_buffer.data(), 100);
  auto local_list = initiator->prepare_local({&local, 1});
  ASSERT_TRUE(local_list);
  auto initiator_metadata = initiator->export_metadata();
  ASSERT_TRUE(target->load_metadata(*initiator_metadata));
  auto request = initiator->make_request(Operation::Read, *local_list, {}, *now_accepted, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(run(*request));
  EXPECT_EQ(std::memcmp(local_buffer.data(), remote_buffer.data(), 100), 0);
}

// A full export lists every region the peer has: loading one drops the
// regions the peer deregistered since (new lists cannot reach them, lists
// already prepared against them are refused), while a partial export
// leaves the others alone.
TEST_P(TransferTest, FullMetadataDropsTheRegionsThePeerDeregistered) {
  initiator = make_agent("initiator");
  target = make_agent("target");
  local_buffer.assign(4096, 0);
  remote_buffer.assign(4096, 0);
  auto first = target->register_memory({remote_buffer.data(), 2048});
  auto second = target->register_memory({remote_buffer.data() + 2048, 2048});
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(initiator->register_memory({local_buffer.data(), 4096}));
  ASSERT_TRUE(initiator->load_metadata(*target->export_metadata()));
  Descriptor in_first = descriptor_of(remote_buffer.data(), 100);
  Descriptor in_second = descriptor_of(remote_buffer.data() + 3000, 100);
  auto first_list = initiator->prepare_remote("target", {&in_first, 1});
  auto second_list = initiator->prepare_remote("target", {&in_second, 1});
  ASSERT_TRUE(first_list && second_list);
  Descriptor local = descriptor_of(local_buffer.data(), 100);
  auto local_list = initiator->prepare_local({&local, 1});
  ASSERT_TRUE(local_list);
  auto reposted = initiator->make_request(Operation::Read, *local_list, {}, *second_list, {});
  ASSERT_TRUE(reposted);
  ASSERT_TRUE(run(*reposted));

  // A partial export without the second region keeps it.
  ASSERT_TRUE(target->deregister_memory(*second));
  RegionId only_first[] = {*first};
  ASSERT_TRUE(initiator->load_metadata(*target->export_metadata(only_first)));
  ASSERT_TRUE(initiator->prepare_remote("target", {&in_second, 1}));

  // The full export drops it.
  ASSERT_TRUE(initiator->load_metadata(*target->export_metadata()));
  auto refused = initiator->prepare_remote("target", {&in_second, 1});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::NotFound);
  auto stale = initiator->make_request(Operation::Read, *local_list, {}, *second_list, {});
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.status().code(), Code::NotAllowed);
  EXPECT_NE(stale.status().message().find("no longer lists"), std::string::npos) << stale.status().to_string();
  Status repost = initiator->post(*reposted);
  EXPECT_EQ(repost.code(), Code::NotAllowed) << repost.to_string();
  EXPECT_TRUE(initiator->release(*reposted));

  // Lists into the region that stayed keep working, before and after.
  fill_pattern(remote_buffer.data(), 2048, 9);
  auto kept = initiator->make_request(Operation::Read, *local_list, {}, *first_list, {});
  ASSERT_TRUE(kept) << kept.status().to_string();
  ASSERT_TRUE(run(*kept));
  EXPECT_EQ(std::memcmp(local_buffer.data(), remote_buffer.data(), 100), 0);
  ASSERT_TRUE(initiator->prepare_remote("target", {&in_first, 1}));
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransferTest, ::testing::Values("loopback"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing
