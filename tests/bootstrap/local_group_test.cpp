// Local groups across forked processes: data correctness for 0 B .. 1 MiB,
// votes with reasons, and failures that name the rank: a SIGKILLed rank
// (RemoteDisconnect), a SIGKILLed hub ("rank 0 lost"), a SIGSTOPped rank
// (Timeout), diverging and late ranks (Mismatch).
#include <gtest/gtest.h>

#include <thread>

#include "eplb/bootstrap.h"
#include "test_support.h"

namespace eplb {
namespace {

using testing::contribution;
using testing::expect_failure;
using testing::fork_local_ranks;
using testing::wait_children;

class LocalGroupTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir(); }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string dir_;
};

TEST_F(LocalGroupTest, AllgatherOfVariedSizesBarrierAndVote) {
  const int size = 4;
  const size_t lengths[] = {0, 1, 7, 4096, 65537, 1 << 20};
  auto pids = fork_local_ranks(size, dir_, [&](ProcessGroup& group) {
    int rank = group.rank();
    if (group.size() != size || group.backend_name() != "local") return 1;
    for (int round = 0; round < 8; ++round) {
      auto length_of = [&](int r) { return lengths[(r + round) % 6] * (round == 7 ? 0 : 1); };
      auto all = group.allgather(contribution(rank, round, length_of(rank)), Deadline::after_seconds(10));
      if (!all.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, all.status().to_string().c_str());
        return 2;
      }
      if (all->size() != size) return 3;
      for (int r = 0; r < size; ++r)
        if ((*all)[r] != contribution(r, round, length_of(r))) return 4;
      if (!group.barrier(Deadline::after_seconds(10)).is_ok()) return 5;
    }
    std::vector<std::string> reasons;
    auto yes = group.vote(true, "", Deadline::after_seconds(10), &reasons);
    if (!yes.is_ok() || !*yes || reasons != std::vector<std::string>(size)) return 6;
    bool mine = rank != 1 && rank != 3;
    auto no = group.vote(mine, mine ? "" : "rank " + std::to_string(rank) + ": layer 5 checksum mismatch",
                         Deadline::after_seconds(10), &reasons);
    if (!no.is_ok() || *no) return 7;
    if (reasons[0] != "" || reasons[1] != "rank 1: layer 5 checksum mismatch" || reasons[2] != "" ||
        reasons[3] != "rank 3: layer 5 checksum mismatch")
      return 8;
    return 0;
  });
  auto codes = wait_children(pids, 60);
  EXPECT_EQ(codes, std::vector<int>(size, 0));
}

TEST_F(LocalGroupTest, KilledRankIsRemoteDisconnectNamingIt) {
  Stopwatch watch;
  auto pids = fork_local_ranks(3, dir_, [&](ProcessGroup& group) {
    if (!group.barrier(Deadline::after_seconds(10)).is_ok()) return 1;
    if (group.rank() == 2) ::raise(SIGKILL);
    Stopwatch wait;
    Status status = group.allgather("after", Deadline::after_seconds(8)).status();
    if (wait.seconds() > 4) return 3;  // detected by EOF, not by the deadline
    return expect_failure(status, Code::RemoteDisconnect, {"rank 2 lost", "allgather #2"}, group.rank(), 2);
  });
  auto codes = wait_children(pids, 30);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 128 + SIGKILL}));
  EXPECT_LT(watch.seconds(), 8.0);
}

TEST_F(LocalGroupTest, KilledHubIsRankZeroLost) {
  auto pids = fork_local_ranks(3, dir_, [&](ProcessGroup& group) {
    if (!group.barrier(Deadline::after_seconds(10)).is_ok()) return 1;
    if (group.rank() == 0) ::raise(SIGKILL);
    Stopwatch wait;
    Status status = group.vote(true, "", Deadline::after_seconds(8)).status();
    if (wait.seconds() > 4) return 3;
    return expect_failure(status, Code::RemoteDisconnect, {"rank 0 lost", "vote #2"}, group.rank(), 2);
  });
  auto codes = wait_children(pids, 30);
  EXPECT_EQ(codes, (std::vector<int>{128 + SIGKILL, 0, 0}));
}

TEST_F(LocalGroupTest, StoppedRankTimesOutNamingIt) {
  auto pids = fork_local_ranks(4, dir_, [&](ProcessGroup& group) {
    if (!group.barrier(Deadline::after_seconds(10)).is_ok()) return 1;
    if (group.rank() == 3) ::raise(SIGSTOP);
    Stopwatch wait;
    Status status = group.allgather(std::string(1000, 'x'), Deadline::after_seconds(1.0)).status();
    double seconds = wait.seconds();
    if (seconds > 3.0) {  // the 1 s deadline plus scheduling slack on a loaded machine
      std::fprintf(stderr, "rank %d: took %.2f s\n", group.rank(), seconds);
      return 3;
    }
    return expect_failure(status, Code::Timeout, {"rank 3 has not answered", "allgather #2"}, group.rank(), 2);
  });
  auto codes = wait_children({pids[0], pids[1], pids[2]}, 20);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
  ::kill(pids[3], SIGKILL);
  EXPECT_EQ(wait_children({pids[3]}, 10), std::vector<int>{128 + SIGKILL});
}

TEST_F(LocalGroupTest, DivergingRankIsAMismatch) {
  auto pids = fork_local_ranks(3, dir_, [&](ProcessGroup& group) {
    Status status = group.rank() == 1 ? group.barrier(Deadline::after_seconds(5))
                                      : group.allgather("x", Deadline::after_seconds(5)).status();
    return expect_failure(status, Code::Mismatch, {"rank 1 sent barrier #1 while rank 0 is in allgather #1"},
                          group.rank(), 2);
  });
  EXPECT_EQ(wait_children(pids, 20), std::vector<int>(3, 0));
}

TEST_F(LocalGroupTest, LateRankIsAMismatchNamingBothSequenceNumbers) {
  auto pids = fork_local_ranks(3, dir_, [&](ProcessGroup& group) {
    int rank = group.rank();
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      // Rank 0 gave up on #1 while this rank slept: the notice says so.
      Status status = group.allgather("late", Deadline::after_seconds(3)).status();
      return expect_failure(status, Code::Timeout, {"rank 2 has not answered", "reported by rank 0"}, rank, 2);
    }
    Status first = group.allgather("early", Deadline::after_seconds(0.5)).status();
    if (int code = expect_failure(first, Code::Timeout, {"rank 2 has not answered"}, rank, 3)) return code;
    Status second = group.allgather("again", Deadline::after_seconds(5)).status();
    return expect_failure(second, Code::Mismatch,
                          {"rank 2 sent allgather #1 while rank 0 is in allgather #2", "rank 2 is late"}, rank, 4);
  });
  EXPECT_EQ(wait_children(pids, 20), std::vector<int>(3, 0));
}

TEST_F(LocalGroupTest, SizeMismatchAtJoinIsNamed) {
  // Rank 0 thinks the group has 2 ranks, rank 1 thinks 3: both refuse.
  Status statuses[2];
  std::thread hub([&] {
    statuses[0] = make_local_group({0, 2, dir_, 5, {}, 0, {}}).status();
  });
  std::thread member([&] {
    statuses[1] = make_local_group({1, 3, dir_, 5, {}, 0, {}}).status();
  });
  hub.join();
  member.join();
  for (auto& status : statuses) {
    EXPECT_EQ(status.code(), Code::Mismatch) << status.to_string();
    EXPECT_NE(status.message().find("was started for a group of 3 ranks, rank 0 for 2"), std::string::npos)
        << status.to_string();
  }
}

TEST_F(LocalGroupTest, MissingHubIsATimeoutWithinTheConnectTimeout) {
  Stopwatch watch;
  auto group = make_local_group({1, 2, dir_, 0.3, {}, 0, {}});
  ASSERT_FALSE(group.is_ok());
  EXPECT_EQ(group.status().code(), Code::Timeout) << group.status().to_string();
  EXPECT_NE(group.status().message().find("could not connect to rank 0"), std::string::npos);
  EXPECT_LT(watch.seconds(), 2.0);
}

TEST_F(LocalGroupTest, MissingMemberIsATimeoutNamingIt) {
  auto group = make_local_group({0, 3, dir_, 0.3, {}, 0, {}});
  ASSERT_FALSE(group.is_ok());
  EXPECT_EQ(group.status().code(), Code::Timeout);
  EXPECT_NE(group.status().message().find("ranks 1, 2 did not join"), std::string::npos)
      << group.status().to_string();
}

TEST_F(LocalGroupTest, BadOptionsAreRejected) {
  EXPECT_EQ(make_local_group({0, 0, dir_, 1, {}, 0, {}}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(make_local_group({2, 2, dir_, 1, {}, 0, {}}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(make_local_group({0, 2, "", 1, {}, 0, {}}).status().code(), Code::InvalidArgument);
  EXPECT_EQ(make_local_group({0, 2, "/tmp/" + std::string(200, 'd'), 1, {}, 0, {}}).status().code(), Code::InvalidArgument);
  auto single = make_local_group({0, 1, "", 1, {}, 0, {}});
  ASSERT_TRUE(single.is_ok());
  auto all = (*single)->allgather("solo", Deadline::after_seconds(1));
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(*all, std::vector<std::string>{"solo"});
}

class EnvGuard {
 public:
  EnvGuard(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* name : {"EPLB_RANK", "EPLB_SIZE", "EPLB_BOOTSTRAP_DIR", "EPLB_BOOTSTRAP_TIMEOUT"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (auto& [name, value] : values) ::setenv(name, value, 1);
  }
  ~EnvGuard() {
    for (auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(LocalGroupTest, OptionsFromEnvironment) {
  {
    EnvGuard env({});
    EXPECT_EQ(local_group_options_from_env().status().code(), Code::NotFound);
  }
  {
    EnvGuard env({{"EPLB_RANK", "2"}, {"EPLB_SIZE", "4"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()},
                  {"EPLB_BOOTSTRAP_TIMEOUT", "7.5"}});
    auto options = local_group_options_from_env();
    ASSERT_TRUE(options.is_ok()) << options.status().to_string();
    EXPECT_EQ(options->rank, 2);
    EXPECT_EQ(options->size, 4);
    EXPECT_EQ(options->rendezvous_dir, dir_);
    EXPECT_EQ(options->connect_timeout_seconds, 7.5);
  }
  auto expect_invalid = [](std::initializer_list<std::pair<const char*, const char*>> values,
                           const std::string& needle) {
    EnvGuard env(values);
    auto options = local_group_options_from_env();
    ASSERT_FALSE(options.is_ok());
    EXPECT_EQ(options.status().code(), Code::InvalidArgument);
    EXPECT_NE(options.status().message().find(needle), std::string::npos) << options.status().to_string();
  };
  expect_invalid({{"EPLB_RANK", "4"}, {"EPLB_SIZE", "4"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()}},
                 "EPLB_RANK '4' is not an integer in [0, 3]");
  expect_invalid({{"EPLB_RANK", "1x"}, {"EPLB_SIZE", "4"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()}}, "EPLB_RANK '1x'");
  expect_invalid({{"EPLB_RANK", "0"}, {"EPLB_SIZE", "-1"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()}},
                 "EPLB_SIZE '-1' is not an integer in [1, 65536]");
  expect_invalid({{"EPLB_RANK", "0"}, {"EPLB_SIZE", "2"}}, "EPLB_BOOTSTRAP_DIR is not set");
  expect_invalid({{"EPLB_RANK", "0"}, {"EPLB_SIZE", "2"}, {"EPLB_BOOTSTRAP_DIR", "/nonexistent/eplb"}},
                 "/nonexistent/eplb");
  expect_invalid({{"EPLB_SIZE", "2"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()}}, "EPLB_RANK is not set");
  expect_invalid({{"EPLB_RANK", "0"}, {"EPLB_SIZE", "2"}, {"EPLB_BOOTSTRAP_DIR", dir_.c_str()},
                  {"EPLB_BOOTSTRAP_TIMEOUT", "soon"}},
                 "EPLB_BOOTSTRAP_TIMEOUT='soon'");
}

}  // namespace
}  // namespace eplb
