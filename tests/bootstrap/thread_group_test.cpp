// In-process thread groups: allgather / barrier / vote, and failures that
// name the rank (a rank that never arrives, diverges, leaves, or is late).
#include <gtest/gtest.h>

#include <thread>

#include "eplb/bootstrap.h"

namespace eplb {
namespace {

template <typename Fn>
void run_ranks(std::vector<std::unique_ptr<ProcessGroup>>& groups, Fn fn) {
  std::vector<std::thread> threads;
  for (auto& group : groups) threads.emplace_back([&, g = group.get()] { fn(*g); });
  for (auto& thread : threads) thread.join();
}

TEST(ThreadGroup, AllgatherBarrierVote) {
  auto groups = make_thread_groups(4);
  ASSERT_EQ(groups.size(), 4u);
  std::vector<std::string> failures(4);
  run_ranks(groups, [&](ProcessGroup& group) {
    int rank = group.rank();
    std::string& failure = failures[rank];
    for (int round = 0; round < 20; ++round) {
      std::string mine(static_cast<size_t>((rank + round) % 5) * 100, static_cast<char>('a' + rank));
      auto all = group.allgather(mine, Deadline::after_seconds(10));
      if (!all.is_ok()) { failure = all.status().to_string(); return; }
      for (int r = 0; r < 4; ++r)
        if ((*all)[r] != std::string(static_cast<size_t>((r + round) % 5) * 100, static_cast<char>('a' + r)))
          failure = "allgather content of rank " + std::to_string(r);
      Status barrier = group.barrier(Deadline::after_seconds(10));
      if (!barrier.is_ok()) { failure = barrier.to_string(); return; }
      std::vector<std::string> reasons;
      bool yes = !(round % 3 == 1 && rank == 2);
      auto vote = group.vote(yes, yes ? "" : "rank 2 says no in round " + std::to_string(round),
                             Deadline::after_seconds(10), &reasons);
      if (!vote.is_ok()) { failure = vote.status().to_string(); return; }
      if (*vote != (round % 3 != 1)) failure = "wrong vote result in round " + std::to_string(round);
      if (reasons.size() != 4 || reasons[0] != "" ||
          reasons[2] != (round % 3 == 1 ? "rank 2 says no in round " + std::to_string(round) : ""))
        failure = "wrong vote reasons in round " + std::to_string(round);
    }
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(ThreadGroup, SingleRank) {
  auto groups = make_thread_groups(1);
  ASSERT_EQ(groups.size(), 1u);
  auto all = groups[0]->allgather("x", Deadline::after_seconds(1));
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
  EXPECT_TRUE(groups[0]->barrier(Deadline::after_seconds(1)).is_ok());
  EXPECT_TRUE(make_thread_groups(0).empty());
}

TEST(ThreadGroup, MissingRankTimesOutNamingIt) {
  auto groups = make_thread_groups(3);
  std::vector<Status> statuses(3);
  std::vector<double> seconds(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 never arrives
    threads.emplace_back([&, r] {
      Stopwatch watch;
      statuses[r] = groups[r]->allgather("x", Deadline::after_seconds(0.3)).status();
      seconds[r] = watch.seconds();
    });
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), Code::Timeout) << statuses[r].to_string();
    EXPECT_NE(statuses[r].message().find("rank 2 has not arrived"), std::string::npos) << statuses[r].to_string();
    EXPECT_NE(statuses[r].message().find("allgather #1"), std::string::npos) << statuses[r].to_string();
    EXPECT_GE(seconds[r], 0.29);
    EXPECT_LT(seconds[r], 2.0);
  }
  // Rank 2 arriving late learns that it is late.
  Status late = groups[2]->allgather("x", Deadline::after_seconds(0.3)).status();
  EXPECT_EQ(late.code(), Code::Timeout) << late.to_string();
  EXPECT_NE(late.message().find("rank 2 is late"), std::string::npos) << late.to_string();
}

TEST(ThreadGroup, LateRankIsAMismatchNamingBothSequenceNumbers) {
  auto groups = make_thread_groups(2);
  // Rank 0 gives up on #1 and moves on to #2; rank 1 then arrives at #1.
  EXPECT_EQ(groups[0]->barrier(Deadline::after_seconds(0.05)).code(), Code::Timeout);
  std::thread rank0([&] { (void)groups[0]->barrier(Deadline::after_seconds(0.3)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Status late = groups[1]->barrier(Deadline::after_seconds(0.3));
  rank0.join();
  EXPECT_EQ(late.code(), Code::Mismatch) << late.to_string();
  EXPECT_NE(late.message().find("rank 0 is already at collective #2 while rank 1 is at #1"), std::string::npos)
      << late.to_string();
}

TEST(ThreadGroup, DivergingCollectivesAreAMismatch) {
  auto groups = make_thread_groups(2);
  Status statuses[2];
  std::thread rank0([&] { statuses[0] = groups[0]->allgather("a", Deadline::after_seconds(5)).status(); });
  std::thread rank1([&] { statuses[1] = groups[1]->barrier(Deadline::after_seconds(5)); });
  rank0.join();
  rank1.join();
  for (auto& status : statuses) {
    EXPECT_EQ(status.code(), Code::Mismatch) << status.to_string();
    EXPECT_NE(status.message().find("collectives must be called in the same order"), std::string::npos);
  }
}

TEST(ThreadGroup, DestroyedRankIsRemoteDisconnect) {
  auto groups = make_thread_groups(3);
  Status statuses[2];
  Stopwatch watch;
  std::thread rank0([&] { statuses[0] = groups[0]->barrier(Deadline::after_seconds(10)); });
  std::thread rank1([&] { statuses[1] = groups[1]->barrier(Deadline::after_seconds(10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  groups[2].reset();  // rank 2 leaves
  rank0.join();
  rank1.join();
  EXPECT_LT(watch.seconds(), 5.0);
  for (auto& status : statuses) {
    EXPECT_EQ(status.code(), Code::RemoteDisconnect) << status.to_string();
    EXPECT_NE(status.message().find("rank 2 lost"), std::string::npos) << status.to_string();
  }
}

}  // namespace
}  // namespace eplb
