// deadlines.cpp - derive_deadlines: the one place every deadline of a
// migration comes from (include/eplb/migrate.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eplb/migrate.h"

namespace eplb {
namespace {

constexpr double kBaseTransferSeconds = 5.0;            // automatic: the fixed part of a layer's transfers
constexpr double kBytesPerSecondAtLeast = 256.0 * (1 << 20);  // automatic: the slowest rate assumed
constexpr double kCollectiveMargin = 10.0;              // a collective waits for the slowest rank's transfers + this
constexpr double kServingMargin = 5.0;                  // a serving thread waits for a vote's result this much longer
constexpr double kDrainCollectives = 3.0;               // closing an async round: this many collectives' worth

}  // namespace

Status validate_timeouts(const MigrateOptions& options) {
  for (double seconds : {options.timeout_seconds, options.collective_timeout_seconds})
    if (!std::isfinite(seconds) || seconds < 0 || seconds > kMaxTimeoutSeconds)
      return error(Code::InvalidArgument,
                   fmt::format("migration timeouts must be in [0, {}] seconds (0: automatic), got {}",
                               kMaxTimeoutSeconds, seconds));
  return Status::ok();
}

Deadlines derive_deadlines(const MigrateOptions& options, uint64_t largest_read_bytes) {
  Deadlines deadlines;
  deadlines.transfer_seconds = options.timeout_seconds > 0
                                   ? options.timeout_seconds
                                   : kBaseTransferSeconds + double(largest_read_bytes) / kBytesPerSecondAtLeast;
  deadlines.collective_seconds = options.collective_timeout_seconds > 0
                                     ? options.collective_timeout_seconds
                                     : deadlines.transfer_seconds + kCollectiveMargin;
  deadlines.setup_seconds = deadlines.collective_seconds;
  deadlines.serving_wait_seconds = deadlines.collective_seconds + kServingMargin;
  deadlines.drain_seconds = kDrainCollectives * deadlines.collective_seconds;
  return deadlines;
}

}  // namespace eplb
