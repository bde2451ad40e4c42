// The serving side of a rebalance (eplb/cluster.h): stalls per commit mode
// and tokens served until the next rebalance.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eplb/cluster.h"

namespace eplb {

ServingStall serving_stall(const MigrationCost& cost, const ClusterSpec& cluster, bool scheduled) {
  ServingStall stall;
  stall.sync = scheduled ? cost.scheduled_seconds : cost.unscheduled_seconds;
  for (const LayerCost& layer : cost.layers) {
    if (!layer.changed) continue;
    stall.async_copy += layer.busiest_commit_bytes / cluster.copy_bytes_per_second + cluster.commit_seconds;
    stall.async_swap += cluster.commit_seconds;
  }
  return stall;
}

Result<StallMode> parse_stall_mode(const std::string& name) {
  if (name == "sync") return StallMode::Sync;
  if (name == "async-copy") return StallMode::AsyncCopy;
  if (name == "async-swap") return StallMode::AsyncSwap;
  return error(Code::InvalidArgument, "unknown stall mode '" + name + "' (known: sync, async-copy, async-swap)");
}

std::string to_string(StallMode mode) {
  switch (mode) {
    case StallMode::Sync: return "sync";
    case StallMode::AsyncCopy: return "async-copy";
    case StallMode::AsyncSwap: return "async-swap";
  }
  return "sync";
}

Status ServingModel::validate() const {
  auto positive = [](double value) { return std::isfinite(value) && value > 0; };
  if (!positive(step_seconds) || !positive(tokens_per_step) || !positive(interval_seconds))
    return error(Code::InvalidArgument,
                 fmt::format("serving: step time ({} s), tokens per step ({}) and interval ({} s) must be finite and > 0",
                             step_seconds, tokens_per_step, interval_seconds));
  return Status::ok();
}

double tokens_served(const ServingModel& serving, double balance_before, double balance_after, double migration,
                     double stall) {
  const double rate = serving.tokens_per_step / serving.step_seconds;  // at perfect balance
  const double interval = serving.interval_seconds;
  if (serving.mode == StallMode::Sync) return std::max(0.0, interval - migration) * rate * balance_after;
  const double moving = std::min(migration, interval);
  const double after = std::max(0.0, interval - moving - stall);
  return rate * (moving * balance_before + after * balance_after);
}

}  // namespace eplb
