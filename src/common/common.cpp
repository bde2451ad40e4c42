#include "eplb/common.h"

#include <cstdio>

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
  char text[32];
  if (unit == 0 || value == static_cast<double>(static_cast<uint64_t>(value)))
    std::snprintf(text, sizeof text, "%llu %s", static_cast<unsigned long long>(value), units[unit]);
  else
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds >= 1.0)
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  else if (seconds >= 1e-3)
    std::snprintf(text, sizeof text, "%.0f ms", seconds * 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f us", seconds * 1e6);
  return text;
}

}  // namespace eplb
