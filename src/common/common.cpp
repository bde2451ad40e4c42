#include "eplb/common.h"

#include <fmt/format.h>

namespace eplb {

Deadline Deadline::after(std::chrono::nanoseconds timeout) {
  const Clock::time_point now = Clock::now();
  if (timeout.count() <= 0) return Deadline(now);
  if (timeout > Clock::time_point::max() - now) return Deadline(Clock::time_point::max());
  return Deadline(now + std::chrono::duration_cast<Clock::duration>(timeout));
}

Deadline Deadline::after_seconds(double seconds) {
  if (!(seconds > 0)) return after(std::chrono::nanoseconds(0));  // NaN too
  // int64 nanoseconds hold about 292 years; anything longer is "never".
  if (seconds >= 9.2e9) return Deadline(Clock::time_point::max());
  return after(std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)));
}

std::chrono::nanoseconds Deadline::remaining() const {
  auto left = at_ - Clock::now();
  return left.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                          : std::chrono::nanoseconds(0);
}

std::string format_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0 || value == static_cast<double>(static_cast<uint64_t>(value)))
    return fmt::format("{} {}", static_cast<uint64_t>(value), units[unit]);
  return fmt::format("{:.1f} {}", value, units[unit]);
}

std::string format_seconds(double seconds) {
  if (seconds >= 1.0) return fmt::format("{:.1f} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.0f} ms", seconds * 1e3);
  return fmt::format("{:.0f} us", seconds * 1e6);
}

}  // namespace eplb
