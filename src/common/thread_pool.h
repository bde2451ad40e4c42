// thread_pool.h - the persistent worker threads behind parallel_for
// (internal to src/common/; tests reach it directly).
//
// Contract: a ThreadPool owns `workers` threads started once, which sleep
// between jobs. run(n, threads, fn) calls fn(i, worker) exactly once for
// every i in [0, n) on the caller (worker 0) and up to threads - 1 pool
// workers (1 .. threads - 1), handing out items one at a time, and returns
// when every call has returned. Items go to whichever worker is free, so fn
// must not depend on which worker runs an item; `worker` only selects
// per-worker scratch. One job at a time: a run() that finds the pool busy
// (another thread's job, or a call from inside fn) runs its items inline on
// the caller, as worker 0. After fork() the child gets a fresh set of
// workers on its first run() (the parent's threads do not exist there).
// fn must not throw.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace eplb {

class ThreadPool {
 public:
  using Body = std::function<void(size_t item, int worker)>;

  explicit ThreadPool(int workers);
  ~ThreadPool();  // stops and joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int workers() const;  // pool threads, the caller not counted
  void run(size_t n, int threads, const Body& fn);

  // The process-wide pool parallel_for uses; it grows (never shrinks) to the
  // largest thread count asked for, up to kMaxThreads.
  static ThreadPool& shared(int threads);
  static constexpr int kMaxThreads = 1024;

 private:
  struct State;
  void adopt_after_fork();  // in a forked child: fresh workers
  std::unique_ptr<State> state_;
};

}  // namespace eplb
