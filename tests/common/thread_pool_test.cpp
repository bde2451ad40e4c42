// Tests of the persistent pool behind parallel_for: every item once, worker
// indices in range and never shared by two running items, real parallelism,
// threads reused across calls (not started per call), nested and concurrent
// callers, and a forked child that gets workers of its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "../../src/common/thread_pool.h"
#include "eplb/common.h"

namespace eplb {
namespace {

// Both of two items wait (bounded) until the other has started: true only
// when two threads ran them at the same time.
class Rendezvous {
 public:
  bool arrive() {
    arrived_.fetch_add(1);
    const auto deadline = Deadline::after_seconds(10);
    while (arrived_.load() < 2)
      if (deadline.expired()) return false;
    return true;
  }

 private:
  std::atomic<int> arrived_{0};
};

TEST(ThreadPool, VisitsEveryItemOnceForAnySizeAndThreadCount) {
  for (int threads : {1, 2, 3, 8})
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(1000)}) {
      std::vector<std::atomic<int>> visits(n);
      parallel_for(n, threads, [&](size_t i, int) { visits[i]++; });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(visits[i].load(), 1) << "item " << i << " threads " << threads;
    }
}

TEST(ThreadPool, WorkerIndexIsInRangeAndNeverSharedByRunningItems) {
  for (int threads : {2, 4}) {
    std::vector<std::atomic<int>> running(static_cast<size_t>(threads));
    std::atomic<int> bad{0};
    parallel_for(2000, threads, [&](size_t, int worker) {
      if (worker < 0 || worker >= threads || running[size_t(worker)].fetch_add(1) != 0) bad++;
      if (worker >= 0 && worker < threads) running[size_t(worker)].fetch_sub(1);
    });
    EXPECT_EQ(bad.load(), 0) << "threads " << threads;
  }
}

TEST(ThreadPool, TwoThreadsRunItemsAtTheSameTime) {
  Rendezvous both;
  std::atomic<int> met{0};
  parallel_for(2, 2, [&](size_t) { met += both.arrive() ? 1 : 0; });
  EXPECT_EQ(met.load(), 2);
}

TEST(ThreadPool, ReusesItsThreadsAcrossCalls) {
  ThreadPool pool(1);
  std::mutex mutex;
  std::set<std::thread::id> helpers;
  for (int call = 0; call < 50; ++call) {
    Rendezvous both;  // forces the helper to take part in every call
    pool.run(2, 2, [&](size_t, int worker) {
      EXPECT_TRUE(both.arrive());
      if (worker != 0) {
        std::lock_guard lock(mutex);
        helpers.insert(std::this_thread::get_id());
      }
    });
  }
  EXPECT_EQ(helpers.size(), 1u) << "a new thread per call";
  EXPECT_EQ(pool.workers(), 1);
}

TEST(ThreadPool, SharedPoolGrowsToTheLargestRequestOnly) {
  parallel_for(4, 3, [](size_t) {});
  const int after_three = ThreadPool::shared(1).workers();
  EXPECT_GE(after_three, 2);
  for (int call = 0; call < 20; ++call) parallel_for(4, 2, [](size_t) {});
  EXPECT_EQ(ThreadPool::shared(1).workers(), after_three);
}

TEST(ThreadPool, NestedCallsRunInlineWithoutDeadlock) {
  std::atomic<int> inner{0};
  parallel_for(8, 2, [&](size_t) {
    parallel_for(10, 2, [&](size_t, int worker) {
      EXPECT_EQ(worker, 0);  // inline on the thread that runs the outer item
      inner++;
    });
  });
  EXPECT_EQ(inner.load(), 80);
}

TEST(ThreadPool, ConcurrentCallersEachGetEveryItem) {
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < 100; ++round) {
        std::vector<std::atomic<int>> visits(64);
        parallel_for(visits.size(), 2, [&](size_t i, int worker) {
          if (worker < 0 || worker > 1) wrong++;
          visits[i]++;
        });
        for (auto& v : visits)
          if (v.load() != 1) wrong++;
      }
    });
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPool, PoolsStartAndStopCleanly) {
  for (int round = 0; round < 20; ++round) {
    ThreadPool pool(3);
    std::atomic<int> sum{0};
    pool.run(100, 4, [&](size_t i, int) { sum += int(i); });
    EXPECT_EQ(sum.load(), 4950);
  }
}

TEST(ThreadPool, ForkedChildGetsWorkersOfItsOwn) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started after a multi-threaded fork";
#elif defined(__SANITIZE_ADDRESS__)
  // Measured 2026-12-05: under AddressSanitizer the child's new worker
  // sometimes never runs (3 of 20 runs of a build from before any change
  // that day, 1-2 of 15 after; 0 of 30 without sanitizers), a fork of a
  // multi-threaded process that the sanitizer's runtime does not survive
  // reliably. The test runs in every uninstrumented build (scripts/test.sh).
  GTEST_SKIP() << "AddressSanitizer's runtime does not reliably start threads after a multi-threaded fork";
#else
  parallel_for(8, 2, [](size_t) {});  // the parent's pool has a worker
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Rendezvous both;
    std::atomic<int> met{0};
    parallel_for(2, 2, [&](size_t) { met += both.arrive() ? 1 : 0; });
    ::_exit(met.load() == 2 ? 0 : 1);
  }
  int status = 0;
  const auto deadline = Deadline::after_seconds(30);
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && !deadline.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_EQ(done, child) << "the child hung";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
#endif
}

}  // namespace
}  // namespace eplb
