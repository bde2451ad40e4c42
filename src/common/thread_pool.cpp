// thread_pool.cpp - persistent workers for parallel_for: one job at a time,
// items handed out by an atomic counter, workers that spin briefly after a
// job (back-to-back jobs start without a wake-up) and then sleep.
#include "thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "eplb/common.h"

namespace eplb {

namespace {

// How long an idle worker (or a caller waiting for its helpers) polls
// before it sleeps on a condition variable: long enough to cover the gap
// between the layers of one policy call, short enough not to hold a core.
constexpr auto kSpin = std::chrono::microseconds(50);

thread_local bool t_inside_job = false;  // the caller or a worker is running fn

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to kSpin; true once it holds.
template <class Done>
bool spin_until(Done done) {
  const auto until = Clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && Clock::now() >= until) return false;
    relax();
  }
}

}  // namespace

struct ThreadPool::State {
  std::mutex mutex;
  std::condition_variable wake;      // workers: a job was published, or stop
  std::condition_variable finished;  // the caller: the last helper left
  std::vector<std::thread> threads;
  std::atomic<int> size{0};  // threads.size(), readable without the mutex
  bool stopping = false;
  pid_t owner = ::getpid();

  uint64_t generation = 0;  // jobs published so far (under mutex)
  std::atomic<uint64_t> published{0};  // the same, for spinning workers
  std::atomic<bool> busy{false};       // a caller holds the pool

  // The current job; body == nullptr once the caller closed it.
  const Body* body = nullptr;
  size_t count = 0;
  int seats = 0;   // helpers that may still join
  int joined = 0;  // helpers that joined (their worker index)
  std::atomic<size_t> next{0};
  std::atomic<int> active{0};  // helpers inside the job

  void worker_loop();
  void serve(std::unique_lock<std::mutex>& lock);
  void grow(int workers);
  void stop();
};

void ThreadPool::State::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return published.load(std::memory_order_acquire) != seen; });
    std::unique_lock lock(mutex);
    wake.wait(lock, [&] { return stopping || generation != seen; });
    if (stopping) return;
    seen = generation;
    if (body != nullptr && seats > 0) serve(lock);
  }
}

// Joins the published job as the next helper and drains items until none
// are left; called and returns with `lock` held.
void ThreadPool::State::serve(std::unique_lock<std::mutex>& lock) {
  --seats;
  const int worker = ++joined;
  active.fetch_add(1, std::memory_order_relaxed);
  const Body& fn = *body;
  const size_t n = count;
  lock.unlock();
  t_inside_job = true;
  for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, worker);
  t_inside_job = false;
  lock.lock();
  if (active.fetch_sub(1, std::memory_order_release) == 1) finished.notify_one();
}

void ThreadPool::State::grow(int workers) {
  std::lock_guard lock(mutex);
  while (int(threads.size()) < workers) threads.emplace_back([this] { worker_loop(); });
  size.store(int(threads.size()), std::memory_order_release);
}

void ThreadPool::State::stop() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  for (auto& thread : threads) thread.join();
  threads.clear();
  size.store(0, std::memory_order_release);
}

void ThreadPool::adopt_after_fork() {
  if (state_->owner == ::getpid()) return;
  // A forked child: the parent's workers do not exist here. Keep their
  // state reachable (it cannot be destroyed) and start afresh.
  static auto* abandoned = new std::vector<std::unique_ptr<State>>();
  const int workers = state_->size.load(std::memory_order_relaxed);
  abandoned->push_back(std::exchange(state_, std::make_unique<State>()));
  state_->grow(workers);
}

ThreadPool::ThreadPool(int workers) : state_(std::make_unique<State>()) { state_->grow(std::max(0, workers)); }

ThreadPool::~ThreadPool() {
  if (state_->owner == ::getpid())
    state_->stop();
  else
    (void)state_.release();  // a forked child's copy of the parent's workers: never joinable here
}

int ThreadPool::workers() const { return state_->size.load(std::memory_order_acquire); }

void ThreadPool::run(size_t n, int threads, const Body& fn) {
  if (n == 0) return;
  const int helpers = int(std::min<size_t>(size_t(std::max(threads, 1) - 1), n - 1));
  if (helpers <= 0 || t_inside_job) {  // serial: no pool, and no getpid() system call
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  adopt_after_fork();
  State& s = *state_;
  if (s.size.load(std::memory_order_acquire) == 0 || s.busy.exchange(true, std::memory_order_acquire)) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard lock(s.mutex);
    s.body = &fn;
    s.count = n;
    s.seats = std::min(helpers, int(s.threads.size()));
    s.joined = 0;
    s.next.store(0, std::memory_order_relaxed);
    s.published.store(++s.generation, std::memory_order_release);
  }
  s.wake.notify_all();
  t_inside_job = true;
  for (size_t i = s.next.fetch_add(1); i < n; i = s.next.fetch_add(1)) fn(i, 0);
  t_inside_job = false;
  {
    std::lock_guard lock(s.mutex);
    s.body = nullptr;  // closed: a helper that wakes up late does not join
    s.seats = 0;
  }
  if (!spin_until([&] { return s.active.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(s.mutex);
    s.finished.wait(lock, [&] { return s.active.load(std::memory_order_acquire) == 0; });
  }
  s.busy.store(false, std::memory_order_release);
}

ThreadPool& ThreadPool::shared(int threads) {
  static ThreadPool pool(0);
  static std::mutex growing;
  const int wanted = std::clamp(threads, 1, kMaxThreads) - 1;
  if (wanted > pool.workers()) {
    std::lock_guard lock(growing);
    pool.adopt_after_fork();
    pool.state_->grow(wanted);
  }
  return pool;
}

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  parallel_for(n, threads, [&fn](size_t item, int) { fn(item); });
}

void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& fn) {
  ThreadPool::shared(threads).run(n, threads, fn);
}

}  // namespace eplb
