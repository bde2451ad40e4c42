// cma_backend_test.cpp - the cma decorator (cma_backend.cpp) over a counting
// inner backend, against a forked child of this process (same addresses):
// a local peer's READ is one process_vm_readv; once the kernel refuses the
// peer (EPERM: the child made itself non-dumpable and this process lacks
// CAP_SYS_PTRACE), the peer is on the inner backend for good, whether the
// refusal came at a post or at a repost of a finished request.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../../src/xfer/backend.h"

namespace eplb::xfer {
namespace {

constexpr size_t kTrailerLength = 56;  // cma_backend.cpp: magic, pid, uid, pid namespace, boot id
constexpr size_t kBytes = 4096;

struct DoneRequest final : BackendRequest {
  RequestState poll(Status*) override { return RequestState::Done; }
};

// Moves nothing; counts the transfers the decorator passes on to it.
struct CountingBackend final : Backend {
  int* posts;
  explicit CountingBackend(int* counter) : posts(counter) {}
  std::string name() const override { return "counting"; }
  std::vector<uint8_t> connection_info() const override { return {1, 2, 3}; }
  Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion&) override {
    return Status(Code::Unsupported, "counting");
  }
  Result<std::unique_ptr<BackendPeer>> connect(const std::string&, std::span<const uint8_t>) override {
    return std::make_unique<BackendPeer>();
  }
  Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer&, std::span<const uint8_t>, const KeyRegion&) override {
    return Status(Code::Unsupported, "counting");
  }
  Result<std::unique_ptr<BackendRequest>> post(Operation, BackendPeer&, std::span<const TransferSegment>,
                                               const std::string&, const std::string&) override {
    ++*posts;
    return std::unique_ptr<BackendRequest>(new DoneRequest());
  }
  Status send_notification(BackendPeer&, const std::string&, const std::string&) override { return Status(); }
  std::vector<Notification> take_notifications() override { return {}; }
  bool progress() override { return false; }
};

// A forked child that keeps this process's memory until destroyed; told
// to, it makes itself non-dumpable (so that only CAP_SYS_PTRACE reaches it).
class Child {
 public:
  Child() {
    if (::pipe(to_child_) != 0 || ::pipe(from_child_) != 0) return;
    pid_ = ::fork();
    if (pid_ != 0) {
      ::close(to_child_[0]);
      ::close(from_child_[1]);
      return;
    }
    ::close(to_child_[1]);  // so that the parent's close is the end of the input
    ::close(from_child_[0]);
    ::alarm(30);  // a deadline, should the test never release it
    char command = 0;
    while (::read(to_child_[0], &command, 1) == 1) {
      ::prctl(PR_SET_DUMPABLE, 0);
      if (::write(from_child_[1], "k", 1) != 1) break;
    }
    ::_exit(0);
  }
  ~Child() {
    ::close(to_child_[1]);
    ::close(from_child_[0]);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  bool make_non_dumpable() {
    char ack = 0;
    return ::write(to_child_[1], "n", 1) == 1 && ::read(from_child_[0], &ack, 1) == 1;
  }

 private:
  int to_child_[2] = {-1, -1}, from_child_[2] = {-1, -1};
  pid_t pid_ = -1;
};

// Takes CAP_SYS_PTRACE out of this thread's effective set (kept permitted,
// put back at the end), so that a non-dumpable process refuses us as root too.
class WithoutPtraceCapability {
 public:
  WithoutPtraceCapability() {
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    if (::syscall(SYS_capget, &header_, saved_) != 0) return;
    __user_cap_data_struct lowered[2];
    std::memcpy(lowered, saved_, sizeof lowered);
    lowered[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    ok_ = ::syscall(SYS_capset, &header_, lowered) == 0;
  }
  ~WithoutPtraceCapability() {
    if (ok_) ::syscall(SYS_capset, &header_, saved_);
  }
  bool ok() const { return ok_; }

 private:
  __user_cap_header_struct header_{};
  __user_cap_data_struct saved_[2]{};
  bool ok_ = false;
};

bool lists_cma(Backend& backend, BackendPeer& peer) {
  const auto names = backend.peer_transports(peer);
  return std::find(names.begin(), names.end(), "cma") != names.end();
}

class CmaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_.assign(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) source_[i] = uint8_t(i * 13 + 5);
    child_ = std::make_unique<Child>();  // after the pattern: the child holds it at the same address
    ASSERT_GT(child_->pid(), 0);
    auto made = make_cma_backend(std::make_unique<CountingBackend>(&inner_posts_));
    ASSERT_TRUE(made.is_ok());
    cma_ = std::move(made).value();
  }
  // A peer whose trailer names the child (same host, user and namespace as us).
  std::unique_ptr<BackendPeer> connect_child() {
    std::vector<uint8_t> info = cma_->connection_info();
    const uint32_t pid = uint32_t(child_->pid());
    std::memcpy(info.data() + info.size() - kTrailerLength + 4, &pid, 4);
    auto peer = cma_->connect("child", info);
    return peer.is_ok() ? std::move(peer).value() : nullptr;
  }
  Result<std::unique_ptr<BackendRequest>> read_into(BackendPeer& peer, std::vector<uint8_t>& local) {
    segment_ = {local.data(), nullptr, reinterpret_cast<uint64_t>(source_.data()), nullptr, kBytes, nullptr};
    return cma_->post(Operation::Read, peer, std::span<const TransferSegment>(&segment_, 1), "self", "");
  }

  std::vector<uint8_t> source_;
  std::unique_ptr<Child> child_;
  int inner_posts_ = 0;
  std::unique_ptr<Backend> cma_;
  TransferSegment segment_;
};

TEST_F(CmaBackendTest, ARefusedRepostPutsThePeerOnTheInnerBackendForGood) {
  std::unique_ptr<BackendPeer> peer = connect_child();
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(lists_cma(*cma_, *peer));
  std::vector<uint8_t> local(kBytes, 0);
  auto request = read_into(*peer, local);
  ASSERT_TRUE(request.is_ok()) << request.status().to_string();
  ASSERT_EQ((*request)->poll(nullptr), RequestState::Done);
  EXPECT_EQ(local, source_);  // copied from the child by process_vm_readv
  EXPECT_EQ(inner_posts_, 0);
  ASSERT_TRUE((*request)->repost());  // allowed: the same copy again

  ASSERT_TRUE(child_->make_non_dumpable());
  WithoutPtraceCapability lowered;
  ASSERT_TRUE(lowered.ok());
  EXPECT_FALSE((*request)->repost());  // EPERM: the Agent posts anew
  EXPECT_FALSE(lists_cma(*cma_, *peer)) << "a refused repost leaves the peer on cma";
  EXPECT_FALSE((*request)->repost());  // and no copy to "process 0" either
  std::vector<uint8_t> again(kBytes, 0);
  auto fallback = read_into(*peer, again);
  ASSERT_TRUE(fallback.is_ok());
  EXPECT_EQ(inner_posts_, 1);  // the inner backend moves it
}

TEST_F(CmaBackendTest, ARefusedPostPutsThePeerOnTheInnerBackendForGood) {
  std::unique_ptr<BackendPeer> peer = connect_child();
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(child_->make_non_dumpable());
  WithoutPtraceCapability lowered;
  ASSERT_TRUE(lowered.ok());
  std::vector<uint8_t> local(kBytes, 0);
  ASSERT_TRUE(read_into(*peer, local).is_ok());
  EXPECT_EQ(inner_posts_, 1);
  EXPECT_FALSE(lists_cma(*cma_, *peer));
  ASSERT_TRUE(read_into(*peer, local).is_ok());
  EXPECT_EQ(inner_posts_, 2);
}

}  // namespace
}  // namespace eplb::xfer
