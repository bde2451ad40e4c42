// eplb/common.h - small shared utilities: deadlines, byte formatting, a
// fixed-size thread pool for independent work items.
//
// Contract: Deadline is the only way eplb expresses "how long may this
// wait"; every blocking call takes one. parallel_for runs fn(i) for i in
// [0, n) on at most `threads` threads (the caller's included) and returns
// when all are done; fn must not throw. Its threads are a persistent
// process-wide pool, started on first use and reused by every later call;
// a call made while the pool runs another job (or from inside fn) runs
// inline on the caller. Nothing here allocates per item.
// Memory admission: read_machine_memory says what this machine can give,
// admit_allocation whether one more allocation fits (the one rule, used by
// the transfer agent's allocations, the expert store's staging and the
// Python package's spare buffers; `eplb run` sums its ranks on top of it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "eplb/status.h"

namespace eplb {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  // A deadline `timeout` from now. Saturating: a timeout past the clock's
  // range is "never" (time_point::max()), a negative or NaN one is "now".
  static Deadline after(std::chrono::nanoseconds timeout);
  static Deadline after_seconds(double seconds);
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  std::chrono::nanoseconds remaining() const;  // zero once expired
  double remaining_seconds() const { return std::chrono::duration<double>(remaining()).count(); }

 private:
  Clock::time_point at_;
};

// Measures elapsed time since construction.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void reset() { start_ = Clock::now(); }

 private:
  Clock::time_point start_;
};

// "396 MiB", "1.5 KiB", "12 B".
std::string format_bytes(uint64_t bytes);
// "1.8 s", "250 ms", "12 us".
std::string format_seconds(double seconds);

// Runs fn(i) for every i in [0, n) using up to `threads` threads (<= 1: inline).
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn);
// The same, also passing the index (0 .. threads - 1) of the thread running
// the item, for per-thread scratch. Which thread runs which item varies.
void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& fn);

// ------------------------------------------------------ memory admission ---

// What this machine can give: MemAvailable (/proc/meminfo) and the free
// space of `shm_dir` (statvfs); 0 when unknown. The test hooks
// EPLB_TEST_MEMAVAILABLE and EPLB_TEST_SHM_FREE (byte sizes, "2GiB")
// replace the real values, so tests simulate limits without allocating.
struct MachineMemory {
  uint64_t available_bytes = 0;
  uint64_t shm_free_bytes = 0;
  std::string source;  // where the numbers came from, for the error
};
Result<MachineMemory> read_machine_memory(const std::string& shm_dir = "/dev/shm");
// The share of what is free that an allocation may take, in tenths (9: 90%).
inline constexpr uint64_t kAdmissionPercent = 9;
// Ok when `bytes` fit: at most 90% of MemAvailable and, for shared memory
// (tmpfs is RAM), at most 90% of /dev/shm's free space too; 0 (unknown)
// admits. InvalidArgument naming `what`, the size and the limit otherwise.
Status admit_bytes(uint64_t bytes, bool shared_memory, std::string_view what, const MachineMemory& machine);
// admit_bytes against the machine as it is now.
Status admit_allocation(uint64_t bytes, bool shared_memory, std::string_view what);

}  // namespace eplb
