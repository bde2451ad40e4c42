// Two processes over UCX (shared memory and TCP on loopback), through the
// public Agent API: READ and WRITE of 1 to 1024 descriptors and 1 byte to
// 64 MiB checked byte for byte, notifications both ways, and a peer killed
// with SIGKILL before and after a READ is posted.
//
// The peer process is this test binary itself: fork + exec of
// /proc/self/exe with EPLB_UCX_TEST_CHILD_FD set, caught by a static
// initializer before gtest starts (a fresh process, so no UCX state crosses
// the fork). Parent and child talk over a socketpair: the child sends its
// buffer address and agent metadata, then serves small commands (hash a
// range, report notifications, send a notification, pause, quit) while
// progressing its agent.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "eplb/common.h"
#include "common/bytes.h"
#include "eplb/xfer.h"
#include "ucx_test_util.h"

namespace eplb::xfer {
namespace {

// --- wire: [type u8][length u64][payload] -------------------------------

bool write_all(int fd, const void* data, size_t length) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = ::write(fd, bytes, length);
    if (n <= 0) return false;
    bytes += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t length) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = ::read(fd, bytes, length);
    if (n <= 0) return false;
    bytes += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

bool send_message(int fd, char type, const std::vector<uint8_t>& payload) {
  const uint64_t length = payload.size();
  return write_all(fd, &type, 1) && write_all(fd, &length, 8) && write_all(fd, payload.data(), payload.size());
}

bool receive_message(int fd, char* type, std::vector<uint8_t>* payload) {
  uint64_t length = 0;
  if (!read_all(fd, type, 1) || !read_all(fd, &length, 8) || length > (1u << 26)) return false;
  payload->resize(length);
  return read_all(fd, payload->data(), length);
}

template <typename T>
void append(std::vector<uint8_t>& out, const T& value) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

template <typename T>
T take(const std::vector<uint8_t>& in, size_t offset) {
  T value{};
  if (offset + sizeof(T) <= in.size()) std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

// The wire formats' checksum (XXH3-64).
uint64_t checksum(const uint8_t* data, size_t length) { return bytes::checksum(std::span<const uint8_t>(data, length)); }

// --- the child process ---------------------------------------------------

int run_child(int fd) {
  const std::string name = std::getenv("EPLB_UCX_TEST_CHILD_NAME");
  const size_t bytes = std::strtoull(std::getenv("EPLB_UCX_TEST_CHILD_BYTES"), nullptr, 10);
  AgentConfig config;
  config.name = name;
  auto created = Agent::create(config);
  if (!created) return 10;
  std::unique_ptr<Agent> agent = std::move(created).value();
  std::vector<uint8_t> buffer(bytes);
  test::fill_pattern(buffer, 5);
  if (!agent->register_memory({buffer.data(), buffer.size()})) return 11;
  auto metadata = agent->export_metadata();
  if (!metadata) return 12;
  std::vector<uint8_t> hello;
  append(hello, reinterpret_cast<uint64_t>(buffer.data()));
  hello.insert(hello.end(), metadata->begin(), metadata->end());
  if (!send_message(fd, 'M', hello)) return 13;
  char type = 0;
  std::vector<uint8_t> payload;
  if (!receive_message(fd, &type, &payload) || type != 'M') return 14;
  auto peer = agent->load_metadata(payload);
  if (!peer) return 15;

  std::vector<Notification> notes;
  bool paused = false;
  for (;;) {
    if (!paused) {
      agent->progress();
      for (auto& note : agent->take_notifications()) notes.push_back(std::move(note));
    }
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, paused ? 10 : 0) <= 0) continue;
    if (!receive_message(fd, &type, &payload)) return 0;  // parent gone
    std::vector<uint8_t> reply;
    switch (type) {
      case 'H': {  // hash of [offset, offset + length)
        const auto offset = take<uint64_t>(payload, 0);
        const auto length = take<uint64_t>(payload, 8);
        append(reply, offset + length <= buffer.size() ? checksum(buffer.data() + offset, length) : 0);
        send_message(fd, 'h', reply);
        break;
      }
      case 'N': {  // notifications, waiting up to 5 s for `count`
        const auto count = take<uint32_t>(payload, 0);
        const Deadline deadline = Deadline::after_seconds(5);
        while (notes.size() < count && !deadline.expired()) {
          agent->progress();
          for (auto& note : agent->take_notifications()) notes.push_back(std::move(note));
        }
        for (const auto& note : notes) {
          append(reply, static_cast<uint32_t>(note.peer.size()));
          reply.insert(reply.end(), note.peer.begin(), note.peer.end());
          append(reply, static_cast<uint32_t>(note.message.size()));
          reply.insert(reply.end(), note.message.begin(), note.message.end());
        }
        notes.clear();
        send_message(fd, 'n', reply);
        break;
      }
      case 'S': {
        const Status sent = agent->send_notification(*peer, std::string(payload.begin(), payload.end()));
        append(reply, static_cast<uint8_t>(sent.is_ok()));
        send_message(fd, 's', reply);
        break;
      }
      case 'P':
        paused = true;
        send_message(fd, 'p', reply);
        break;
      case 'Q':
        return 0;
      default:
        return 16;
    }
  }
}

// Runs before gtest's main when this binary was exec'd as a child.
const bool kIsChild = [] {
  if (const char* fd = std::getenv("EPLB_UCX_TEST_CHILD_FD")) {
    const int code = run_child(std::atoi(fd));
    std::fflush(nullptr);
    _exit(code);
  }
  return false;
}();

// --- the parent side -----------------------------------------------------

class ChildPeer {
 public:
  ~ChildPeer() { stop(); }

  // Starts the child, exchanges metadata with `initiator`.
  ::testing::AssertionResult start(Agent& initiator, const std::string& name, size_t bytes) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return ::testing::AssertionFailure() << "socketpair";
    ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      setenv("EPLB_UCX_TEST_CHILD_FD", std::to_string(fds[1]).c_str(), 1);
      setenv("EPLB_UCX_TEST_CHILD_NAME", name.c_str(), 1);
      setenv("EPLB_UCX_TEST_CHILD_BYTES", std::to_string(bytes).c_str(), 1);
      ::execl("/proc/self/exe", "test_xfer_child", static_cast<char*>(nullptr));
      _exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
    char type = 0;
    std::vector<uint8_t> payload;
    if (!receive_message(fd_, &type, &payload) || type != 'M' || payload.size() < 8) {
      return ::testing::AssertionFailure() << "child " << name << " did not send its metadata";
    }
    base_ = take<uint64_t>(payload, 0);
    auto loaded = initiator.load_metadata(std::span<const uint8_t>(payload).subspan(8));
    if (!loaded) return ::testing::AssertionFailure() << loaded.status().to_string();
    if (*loaded != name) return ::testing::AssertionFailure() << "peer name " << *loaded;
    auto mine = initiator.export_metadata();
    if (!mine || !send_message(fd_, 'M', *mine)) return ::testing::AssertionFailure() << "sending metadata";
    return ::testing::AssertionSuccess();
  }

  uint64_t base() const { return base_; }

  std::vector<uint8_t> call(char type, const std::vector<uint8_t>& payload, char reply_type) {
    std::vector<uint8_t> reply;
    char got = 0;
    if (!send_message(fd_, type, payload) || !receive_message(fd_, &got, &reply) || got != reply_type) {
      ADD_FAILURE() << "child did not answer '" << type << "'";
      return {};
    }
    return reply;
  }

  uint64_t hash(uint64_t offset, uint64_t length) {
    std::vector<uint8_t> request;
    append(request, offset);
    append(request, length);
    return take<uint64_t>(call('H', request, 'h'), 0);
  }

  std::vector<Notification> notifications(uint32_t at_least) {
    std::vector<uint8_t> request;
    append(request, at_least);
    const auto reply = call('N', request, 'n');
    std::vector<Notification> notes;
    size_t at = 0;
    while (at + 4 <= reply.size()) {
      Notification note;
      const auto peer_length = take<uint32_t>(reply, at);
      note.peer.assign(reply.begin() + at + 4, reply.begin() + at + 4 + peer_length);
      at += 4 + peer_length;
      const auto message_length = take<uint32_t>(reply, at);
      note.message.assign(reply.begin() + at + 4, reply.begin() + at + 4 + message_length);
      at += 4 + message_length;
      notes.push_back(std::move(note));
    }
    return notes;
  }

  void kill_now() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  void stop() {
    if (pid_ > 0) {
      send_message(fd_, 'Q', {});
      int status = 0;
      // Bounded: a child that does not quit within 5 s is killed.
      const Deadline deadline = Deadline::after_seconds(5);
      while (::waitpid(pid_, &status, WNOHANG) == 0) {
        if (deadline.expired()) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
      pid_ = -1;
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void pause() { call('P', {}, 'p'); }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  uint64_t base_ = 0;
};

constexpr size_t kChildBytes = 64 << 20;

class UcxProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    test::use_ucx_transport(GetParam());
    AgentConfig config;
    config.name = "initiator";
    auto created = Agent::create(config);
    ASSERT_TRUE(created) << created.status().to_string();
    agent = std::move(created).value();
    local.assign(kChildBytes, 0);
    auto region = agent->register_memory({local.data(), local.size()});
    ASSERT_TRUE(region) << region.status().to_string();
  }
  void TearDown() override { test::use_ucx_transport("shm"); }

  // Prepares lists and runs one request to completion (or failure).
  Status transfer(Operation op, const std::string& peer, const std::vector<Descriptor>& locals,
                  const std::vector<Descriptor>& remotes, const std::string& notification = {},
                  double seconds = 20) {
    auto local_list = agent->prepare_local(locals);
    if (!local_list) return local_list.status();
    auto remote_list = agent->prepare_remote(peer, remotes);
    if (!remote_list) return remote_list.status();
    auto request = agent->make_request(op, *local_list, {}, *remote_list, {}, notification);
    if (!request) return request.status();
    Status result = agent->post(*request);
    if (result) {
      const RequestId id = *request;
      result = agent->wait({&id, 1}, Deadline::after_seconds(seconds));
    }
    EXPECT_TRUE(agent->release(*request).is_ok());
    EXPECT_TRUE(agent->release_descriptor_list(*local_list).is_ok());
    EXPECT_TRUE(agent->release_descriptor_list(*remote_list).is_ok());
    return result;
  }

  Descriptor local_at(size_t offset, size_t length) {
    return {reinterpret_cast<uint64_t>(local.data()) + offset, length, 0};
  }

  std::unique_ptr<Agent> agent;
  std::vector<uint8_t> local;
};

TEST_P(UcxProcessTest, ReadAndWriteOneToManyDescriptorsCheckedByteForByte) {
  ChildPeer child;
  ASSERT_TRUE(child.start(*agent, "target", kChildBytes));

  // READ: 1 descriptor of 1 byte.
  Status done = transfer(Operation::Read, "target", {local_at(0, 1)}, {{child.base() + 7, 1, 0}});
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(local[0], test::pattern_byte(5, 7));

  // READ: 1024 descriptors of 1..4096 bytes, scattered, with a notification.
  std::vector<Descriptor> locals, remotes;
  std::vector<std::pair<size_t, size_t>> spans;  // remote offset, length
  size_t local_offset = 0;
  for (size_t i = 0; i < 1024; ++i) {
    const size_t length = 1 + (i * 37) % 4096;
    const size_t remote_offset = i * 65536 + (i % 13);
    locals.push_back(local_at(local_offset, length));
    remotes.push_back({child.base() + remote_offset, length, 0});
    spans.emplace_back(remote_offset, length);
    local_offset += length;
  }
  done = transfer(Operation::Read, "target", locals, remotes, "read of 1024");
  ASSERT_TRUE(done) << done.to_string();
  local_offset = 0;
  for (const auto& [remote_offset, length] : spans) {
    for (size_t j = 0; j < length; ++j) {
      ASSERT_EQ(local[local_offset + j], test::pattern_byte(5, remote_offset + j)) << remote_offset + j;
    }
    local_offset += length;
  }
  auto notes = child.notifications(1);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].peer, "initiator");
  EXPECT_EQ(notes[0].message, "read of 1024");

  // READ: one descriptor of 64 MiB.
  done = transfer(Operation::Read, "target", {local_at(0, kChildBytes)}, {{child.base(), kChildBytes, 0}});
  ASSERT_TRUE(done) << done.to_string();
  std::vector<uint8_t> expected(kChildBytes);
  test::fill_pattern(expected, 5);
  ASSERT_TRUE(local == expected);

  // WRITE: 1024 descriptors, then 64 MiB in one, each checked by the child's hash.
  test::fill_pattern(local, 9);
  locals.clear();
  remotes.clear();
  for (size_t i = 0; i < 1024; ++i) {
    locals.push_back(local_at(i * 4096, 4096));
    remotes.push_back({child.base() + i * 4096, 4096, 0});
  }
  done = transfer(Operation::Write, "target", locals, remotes, "write of 1024");
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(child.hash(0, 1024 * 4096), checksum(local.data(), 1024 * 4096));
  notes = child.notifications(1);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "write of 1024");

  test::fill_pattern(local, 11);
  done = transfer(Operation::Write, "target", {local_at(0, kChildBytes)}, {{child.base(), kChildBytes, 0}});
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(child.hash(0, kChildBytes), checksum(local.data(), kChildBytes));

  // A standalone notification from the child.
  EXPECT_EQ(child.call('S', {'h', 'i'}, 's'), std::vector<uint8_t>{1});
  auto arrived = agent->wait_notifications(Deadline::after_seconds(5));
  ASSERT_TRUE(arrived) << arrived.status().to_string();
  ASSERT_EQ(arrived->size(), 1u);
  EXPECT_EQ((*arrived)[0].peer, "target");
  EXPECT_EQ((*arrived)[0].message, "hi");
}

TEST_P(UcxProcessTest, DescriptorOutsideThePeersRegionIsNotFoundBeforeAnyByteMoves) {
  ChildPeer child;
  ASSERT_TRUE(child.start(*agent, "target", 1 << 20));
  auto remote = agent->prepare_remote("target", std::vector<Descriptor>{{child.base() + (1 << 20) - 4, 8, 0}});
  ASSERT_FALSE(remote);
  EXPECT_EQ(remote.status().code(), Code::NotFound);
}

bool is_disconnect_or_timeout(const Status& status) {
  return status.code() == Code::RemoteDisconnect || status.code() == Code::Timeout;
}

constexpr double kDeadlineSeconds = 2.0;

// After losing a peer the agent still works with another one.
void expect_new_peer_works(UcxProcessTest& test, Agent& agent, std::vector<uint8_t>& local) {
  ChildPeer other;
  ASSERT_TRUE(other.start(agent, "target-2", 1 << 20));
  auto local_list = agent.prepare_local(std::vector<Descriptor>{{reinterpret_cast<uint64_t>(local.data()), 1 << 20, 0}});
  auto remote_list = agent.prepare_remote("target-2", std::vector<Descriptor>{{other.base(), 1 << 20, 0}});
  ASSERT_TRUE(local_list && remote_list);
  auto request = agent.make_request(Operation::Read, *local_list, {}, *remote_list, {});
  ASSERT_TRUE(request);
  ASSERT_TRUE(agent.post(*request));
  const RequestId id = *request;
  Status done = agent.wait({&id, 1}, Deadline::after_seconds(10));
  ASSERT_TRUE(done) << done.to_string();
  std::vector<uint8_t> expected(1 << 20);
  test::fill_pattern(expected, 5);
  EXPECT_EQ(std::memcmp(local.data(), expected.data(), expected.size()), 0);
  EXPECT_TRUE(agent.release(*request));
}

TEST_P(UcxProcessTest, PeerKilledBeforeReadIsPostedFailsWithinTheDeadline) {
  ChildPeer child;
  ASSERT_TRUE(child.start(*agent, "target", 1 << 20));
  // One successful READ first, so the connection is fully established.
  Status done = transfer(Operation::Read, "target", {local_at(0, 4096)}, {{child.base(), 4096, 0}});
  ASSERT_TRUE(done) << done.to_string();
  child.kill_now();
  const Stopwatch clock;
  done = transfer(Operation::Read, "target", {local_at(0, 1 << 20)}, {{child.base(), 1 << 20, 0}}, {},
                  kDeadlineSeconds);
  const double elapsed = clock.seconds();
  EXPECT_TRUE(is_disconnect_or_timeout(done)) << done.to_string();
  EXPECT_LT(elapsed, kDeadlineSeconds + 1.0);
  std::printf("[ info     ] %s after %.3f s: %s\n", GetParam().c_str(), elapsed, done.to_string().c_str());
  expect_new_peer_works(*this, *agent, local);
}

TEST_P(UcxProcessTest, PeerKilledAfterReadIsPostedFailsWithinTheDeadline) {
  ChildPeer child;
  ASSERT_TRUE(child.start(*agent, "target", kChildBytes));
  Status done = transfer(Operation::Read, "target", {local_at(0, 4096)}, {{child.base(), 4096, 0}});
  ASSERT_TRUE(done) << done.to_string();
  child.pause();  // the child stops progressing: transports that need it stall

  auto local_list = agent->prepare_local(std::vector<Descriptor>{local_at(0, kChildBytes)});
  auto remote_list = agent->prepare_remote("target", std::vector<Descriptor>{{child.base(), kChildBytes, 0}});
  ASSERT_TRUE(local_list && remote_list);
  auto request = agent->make_request(Operation::Read, *local_list, {}, *remote_list, {});
  ASSERT_TRUE(request);
  const Stopwatch clock;
  Status posted = agent->post(*request);
  child.kill_now();
  const RequestId id = *request;
  done = posted ? agent->wait({&id, 1}, Deadline::after_seconds(kDeadlineSeconds)) : posted;
  const double elapsed = clock.seconds();
  std::printf("[ info     ] %s after %.3f s: %s\n", GetParam().c_str(), elapsed,
              done ? "done (landed before the kill)" : done.to_string().c_str());
  EXPECT_LT(elapsed, kDeadlineSeconds + 1.0);
  if (done) {
    // One-sided transports (cma) can finish before the kill lands: the bytes must be right.
    std::vector<uint8_t> expected(kChildBytes);
    test::fill_pattern(expected, 5);
    EXPECT_TRUE(local == expected);
  } else {
    EXPECT_TRUE(is_disconnect_or_timeout(done)) << done.to_string();
  }
  EXPECT_TRUE(agent->release(*request));  // releasing a failed or stalled request is clean

  // The dead peer keeps failing within the deadline, never hangs.
  const Stopwatch again;
  done = transfer(Operation::Read, "target", {local_at(0, 4096)}, {{child.base(), 4096, 0}}, {}, kDeadlineSeconds);
  EXPECT_TRUE(is_disconnect_or_timeout(done)) << done.to_string();
  EXPECT_LT(again.seconds(), kDeadlineSeconds + 1.0);
  expect_new_peer_works(*this, *agent, local);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxProcessTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace eplb::xfer
