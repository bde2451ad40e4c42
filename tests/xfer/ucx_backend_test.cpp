// The UCX backend driven directly through src/xfer/backend.h: two backends
// in one process, over shared memory and over TCP on loopback.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../src/xfer/backend.h"
#include "eplb/common.h"
#include "ucx_test_util.h"

namespace eplb::xfer {
namespace {

struct Side {
  std::unique_ptr<Backend> backend;
  std::vector<uint8_t> buffer;
  std::unique_ptr<BackendMemory> memory;
};

Side make_side(const std::string& name, size_t bytes, uint64_t seed) {
  Side side;
  AgentConfig config;
  config.name = name;
  auto backend = make_ucx_backend(config);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
  if (!backend.is_ok()) return side;
  side.backend = std::move(backend).value();
  side.buffer.resize(bytes);
  test::fill_pattern(side.buffer, seed);
  auto memory = side.backend->register_memory({side.buffer.data(), side.buffer.size(), MemoryKind::Host, 0});
  EXPECT_TRUE(memory.is_ok()) << memory.status().to_string();
  if (memory.is_ok()) side.memory = std::move(memory).value();
  return side;
}

// Polls `request` while progressing both sides, until not InProgress or the deadline.
RequestState drive(BackendRequest& request, Backend& other, Status* failure, double seconds = 10) {
  const Deadline deadline = Deadline::after_seconds(seconds);
  while (!deadline.expired()) {
    other.progress();
    const RequestState state = request.poll(failure);
    if (state != RequestState::InProgress) return state;
  }
  return RequestState::InProgress;
}

class UcxBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { test::use_ucx_transport(GetParam()); }
  void TearDown() override { test::use_ucx_transport("shm"); }
};

TEST_P(UcxBackendTest, ReadAndWriteManySegmentsWithNotification) {
  constexpr size_t kBytes = 1 << 20;
  Side a = make_side("agent-a", kBytes, 1);
  Side b = make_side("agent-b", kBytes, 2);
  ASSERT_TRUE(a.memory && b.memory);

  auto peer = a.backend->connect("agent-b", b.backend->connection_info());
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  auto rkey = a.backend->unpack_remote_key(**peer, b.memory->packed_remote_key(), {});
  ASSERT_TRUE(rkey.is_ok()) << rkey.status().to_string();

  // READ: 16 segments of varying sizes from b's buffer into a's, shifted.
  std::vector<TransferSegment> segments;
  size_t offset = 0;
  for (int i = 0; i < 16; ++i) {
    const size_t length = 1000 + 977 * i;
    segments.push_back({a.buffer.data() + offset, a.memory.get(),
                        reinterpret_cast<uint64_t>(b.buffer.data()) + offset + 13, rkey->get(), length});
    offset += length + 100;
  }
  auto request = a.backend->post(Operation::Read, **peer, segments, "agent-a", "read-done");
  ASSERT_TRUE(request.is_ok()) << request.status().to_string();
  Status failure;
  ASSERT_EQ(drive(**request, *b.backend, &failure), RequestState::Done) << failure.to_string();
  for (const auto& segment : segments) {
    const uint8_t* source = reinterpret_cast<const uint8_t*>(segment.remote_address);
    ASSERT_EQ(std::memcmp(segment.local_address, source, segment.length), 0);
  }
  // The notification arrives at b, from a, after the bytes landed.
  std::vector<Notification> notes;
  const Deadline deadline = Deadline::after_seconds(5);
  while (notes.empty() && !deadline.expired()) {
    a.backend->progress();
    notes = b.backend->take_notifications();
  }
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].peer, "agent-a");
  EXPECT_EQ(notes[0].message, "read-done");

  // WRITE: a's bytes pushed into b at other offsets.
  test::fill_pattern(a.buffer, 3);
  std::vector<TransferSegment> writes;
  for (int i = 0; i < 8; ++i) {
    writes.push_back({a.buffer.data() + 4096 * i, a.memory.get(),
                      reinterpret_cast<uint64_t>(b.buffer.data()) + 500000 + 8192 * i, rkey->get(), 4096});
  }
  auto write = a.backend->post(Operation::Write, **peer, writes, "agent-a", "");
  ASSERT_TRUE(write.is_ok()) << write.status().to_string();
  ASSERT_EQ(drive(**write, *b.backend, &failure), RequestState::Done) << failure.to_string();
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(std::memcmp(a.buffer.data() + 4096 * i, b.buffer.data() + 500000 + 8192 * i, 4096), 0) << i;
  }
  EXPECT_TRUE(b.backend->take_notifications().empty());
}

TEST_P(UcxBackendTest, StandaloneNotificationsKeepOrderAndSender) {
  Side a = make_side("sender", 4096, 1);
  Side b = make_side("receiver", 4096, 2);
  auto peer = a.backend->connect("receiver", b.backend->connection_info());
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a.backend->send_notification(**peer, "sender", "m" + std::to_string(i)).is_ok());
  }
  ASSERT_TRUE(a.backend->send_notification(**peer, "sender", std::string(100000, 'x')).is_ok());
  std::vector<Notification> notes;
  const Deadline deadline = Deadline::after_seconds(5);
  while (notes.size() < 6 && !deadline.expired()) {
    a.backend->progress();
    for (auto& note : b.backend->take_notifications()) notes.push_back(std::move(note));
  }
  ASSERT_EQ(notes.size(), 6u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(notes[i].peer, "sender");
    EXPECT_EQ(notes[i].message, "m" + std::to_string(i));
  }
  EXPECT_EQ(notes[5].message.size(), 100000u);
}

TEST_P(UcxBackendTest, ReleasingARunningRequestCancelsCleanlyAndTheBackendKeepsWorking) {
  constexpr size_t kBytes = 16 << 20;
  Side a = make_side("a", kBytes, 1);
  Side b = make_side("b", kBytes, 2);
  auto peer = a.backend->connect("b", b.backend->connection_info());
  ASSERT_TRUE(peer.is_ok());
  auto rkey = a.backend->unpack_remote_key(**peer, b.memory->packed_remote_key(), {});
  ASSERT_TRUE(rkey.is_ok());
  std::vector<TransferSegment> whole{
      {a.buffer.data(), a.memory.get(), reinterpret_cast<uint64_t>(b.buffer.data()), rkey->get(), kBytes}};
  {
    auto request = a.backend->post(Operation::Read, **peer, whole, "a", "");
    ASSERT_TRUE(request.is_ok());
  }  // destroyed while (probably) in flight
  auto again = a.backend->post(Operation::Read, **peer, whole, "a", "");
  ASSERT_TRUE(again.is_ok());
  Status failure;
  ASSERT_EQ(drive(**again, *b.backend, &failure), RequestState::Done) << failure.to_string();
  EXPECT_EQ(a.buffer, b.buffer);
}

TEST_P(UcxBackendTest, BadConnectionInfoAndKeysAreRejectedWithoutCrashing) {
  Side a = make_side("a", 4096, 1);
  Side b = make_side("b", 4096, 2);
  std::vector<uint8_t> empty;
  auto no_peer = a.backend->connect("b", empty);
  ASSERT_FALSE(no_peer.is_ok());
  EXPECT_EQ(no_peer.status().code(), Code::Mismatch);

  auto peer = a.backend->connect("b", b.backend->connection_info());
  ASSERT_TRUE(peer.is_ok());
  auto key = b.memory->packed_remote_key();
  auto no_key = a.backend->unpack_remote_key(**peer, std::span<const uint8_t>(), {});
  EXPECT_FALSE(no_key.is_ok());
  // A truncated key must not make UCX read outside our copy (ASan checks);
  // whether UCX accepts the prefix is its business.
  for (size_t length = 1; length < key.size(); ++length) {
    auto truncated = a.backend->unpack_remote_key(**peer, std::span<const uint8_t>(key.data(), length), {});
    (void)truncated;
  }
  const MemoryRegion device{b.buffer.data(), 16, MemoryKind::Device, 0};
  auto unsupported = a.backend->register_memory(device);
  ASSERT_FALSE(unsupported.is_ok());
  EXPECT_EQ(unsupported.status().code(), Code::Unsupported);
}

TEST_P(UcxBackendTest, TeardownInAnyOrder) {
  Side a = make_side("a", 1 << 16, 1);
  Side b = make_side("b", 1 << 16, 2);
  auto peer = a.backend->connect("b", b.backend->connection_info());
  ASSERT_TRUE(peer.is_ok());
  auto rkey = a.backend->unpack_remote_key(**peer, b.memory->packed_remote_key(), {});
  ASSERT_TRUE(rkey.is_ok());
  std::vector<TransferSegment> whole{
      {a.buffer.data(), a.memory.get(), reinterpret_cast<uint64_t>(b.buffer.data()), rkey->get(), 1 << 16}};
  auto request = a.backend->post(Operation::Read, **peer, whole, "a", "done");
  ASSERT_TRUE(request.is_ok());
  // Backend first, then the handles that depend on it.
  a.backend.reset();
  peer->reset();
  request->reset();
  rkey->reset();
  a.memory.reset();
}

// Unified mode packs no address lengths, so a peer's address cannot be
// checked: the backend refuses it (its own address then no longer walks, and
// the variable, read as UCX reads it: y/yes/1, any case, says so anyway); a
// value UCX reads as "no" keeps the backend.
TEST(UcxBackend, UnifiedModeIsRefused) {
  AgentConfig config;
  config.name = "unified";
  for (const char* on : {"y", "YES", "1"}) {
    test::ScopedVariable unified("UCX_UNIFIED_MODE", on);
    auto backend = make_ucx_backend(config);
    ASSERT_FALSE(backend.is_ok()) << on;
    EXPECT_EQ(backend.status().code(), Code::Unsupported) << on;
    EXPECT_NE(backend.status().message().find("unified mode, UCX_UNIFIED_MODE, is not supported"), std::string::npos)
        << backend.status().to_string();
  }
  test::ScopedVariable off("UCX_UNIFIED_MODE", "no");
  auto backend = make_ucx_backend(config);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxBackendTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace eplb::xfer
