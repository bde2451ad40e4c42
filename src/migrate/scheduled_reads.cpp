// [issue 31] The hook of the contention-aware transfer schedule into the
// executor: a rank's READs of one layer, round by round, as
// schedule_transfers (plan.h) orders them. Every rank computes the same
// schedule from the same plan; each uses its own rows of it.
#include <fmt/format.h>

#include "migrator_state.h"

namespace eplb::migrate {

Result<std::vector<std::vector<ReadRequest>>> scheduled_read_rounds(const LayerPlan& plan, const Topology& topology,
                                                                    const ExpertStore& store, int me,
                                                                    const LinkBandwidths& bandwidths,
                                                                    bool every_round) {
  const double bytes_per_expert = double(store.layout().bytes_per_expert(plan.layer));
  if (bytes_per_expert <= 0) return std::vector<std::vector<ReadRequest>>{};
  auto schedule = schedule_transfers(plan, topology, bandwidths, bytes_per_expert);
  if (!schedule) return schedule.status().with_context(fmt::format("layer {} on rank {}", plan.layer, me));
  return rank_rounds(*schedule, me, every_round);
}

}  // namespace eplb::migrate

namespace eplb {

Status set_transfer_schedule(MigrateOptions& options, std::string_view name) {
  constexpr std::string_view kFenced = "-fenced";
  const bool fenced = name.size() > kFenced.size() && name.substr(name.size() - kFenced.size()) == kFenced;
  const std::string_view links = fenced ? name.substr(0, name.size() - kFenced.size()) : name;
  std::optional<LinkBandwidths> schedule;
  if (links == "ranks") schedule = LinkBandwidths{1, 1, 0};
  else if (links == "hosts") schedule = LinkBandwidths{1, 1, 1};
  else if (links != "off" || fenced)
    return error(Code::InvalidArgument, fmt::format("must be {}, got '{}'", kTransferScheduleNames, name));
  options.transfer_schedule = schedule;
  options.fence_schedule_rounds = fenced;
  return Status::ok();
}

std::string transfer_schedule_name(const MigrateOptions& options) {
  const std::optional<LinkBandwidths>& schedule = options.transfer_schedule;
  if (!schedule) return "off";
  std::string name = "custom";
  if (schedule->intra_host == 1 && schedule->nic == 1 && (schedule->host == 0 || schedule->host == 1))
    name = schedule->host == 0 ? "ranks" : "hosts";
  return options.fence_schedule_rounds ? name + "-fenced" : name;
}

}  // namespace eplb
