#include "eplb/common.h"

#include <fmt/format.h>

namespace eplb {

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
