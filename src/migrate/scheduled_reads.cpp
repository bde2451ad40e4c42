// [issue 31] The hook of the contention-aware transfer schedule into the
// executor: a rank's READs of one layer, round by round, as
// schedule_transfers (plan.h) orders them. Every rank computes the same
// schedule from the same plan; each uses its own rows of it.
#include <fmt/format.h>

#include "migrator_state.h"

namespace eplb::migrate {

Result<std::vector<std::vector<ReadRequest>>> scheduled_read_rounds(const LayerPlan& plan, const Topology& topology,
                                                                    const ExpertStore& store, int me,
                                                                    const LinkBandwidths& bandwidths) {
  const double bytes_per_expert = double(store.layout().bytes_per_expert(plan.layer));
  if (bytes_per_expert <= 0) return std::vector<std::vector<ReadRequest>>{};
  auto schedule = schedule_transfers(plan, topology, bandwidths, bytes_per_expert);
  if (!schedule) return schedule.status().with_context(fmt::format("layer {} on rank {}", plan.layer, me));
  return rank_rounds(*schedule, me);
}

}  // namespace eplb::migrate

namespace eplb {

Result<std::optional<LinkBandwidths>> transfer_schedule_named(std::string_view name) {
  if (name == "off") return std::optional<LinkBandwidths>{};
  if (name == "ranks") return std::optional<LinkBandwidths>{LinkBandwidths{1, 1, 0}};
  if (name == "hosts") return std::optional<LinkBandwidths>{LinkBandwidths{1, 1, 1}};
  return error(Code::InvalidArgument,
               fmt::format("must be {}, got '{}'", kTransferScheduleNames, name));
}

std::string transfer_schedule_name(const std::optional<LinkBandwidths>& schedule) {
  if (!schedule) return "off";
  if (schedule->intra_host == 1 && schedule->nic == 1) {
    if (schedule->host == 0) return "ranks";
    if (schedule->host == 1) return "hosts";
  }
  return "custom";
}

}  // namespace eplb
