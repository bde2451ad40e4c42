// What one migration costs on a cluster (eplb/cluster.h): per layer, the
// lower bound, the schedule's makespan, and the fluid model's time with and
// without the schedule; the commit work of the busiest rank.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eplb/cluster.h"

namespace eplb {

namespace {

// Rows the busiest rank writes into its live buffer at the copy commit:
// every slot whose expert changes (reads and local copies alike).
double busiest_commit_bytes(const LayerPlan& plan, double bytes_per_expert) {
  size_t busiest = 0;
  for (const RankLayerPlan& rank : plan.ranks) {
    size_t changed = 0;
    for (const SlotOp& op : rank.slots) changed += op.action != SlotAction::Keep;
    busiest = std::max(busiest, changed);
  }
  return double(busiest) * bytes_per_expert;
}

Result<LayerCost> layer_cost(const LayerPlan& plan, const Topology& topology, const ClusterSpec& cluster,
                             double bytes_per_expert) {
  LayerCost cost;
  cost.layer = plan.layer;
  cost.changed = plan.stats.slots_local_copy + plan.stats.slots_read_intra_node + plan.stats.slots_read_inter_node > 0;
  if (!cost.changed) return cost;
  EPLB_ASSIGN_OR_RETURN(TransferSchedule schedule, schedule_transfers(plan, topology, cluster.links, bytes_per_expert));
  cost.lower_bound = schedule.lower_bound_seconds;
  cost.schedule_makespan = schedule.makespan_seconds;
  cost.scheduled = fluid_layer_seconds(plan, topology, cluster.links, bytes_per_expert, &schedule);
  cost.unscheduled = fluid_layer_seconds(plan, topology, cluster.links, bytes_per_expert, nullptr);
  cost.busiest_commit_bytes = busiest_commit_bytes(plan, bytes_per_expert);
  return cost;
}

}  // namespace

LayerPrice layer_price(const LayerPlan& plan, const Topology& topology, const ClusterSpec& cluster,
                       double bytes_per_expert) {
  LayerPrice price;
  price.changed = plan.stats.slots_local_copy + plan.stats.slots_read_intra_node + plan.stats.slots_read_inter_node > 0;
  if (!price.changed) return price;
  price.seconds = lower_bound_seconds(link_loads(plan, topology, bytes_per_expert), cluster.links) +
                  cluster.layer_overhead_seconds;
  price.stall_copy = busiest_commit_bytes(plan, bytes_per_expert) / cluster.copy_bytes_per_second + cluster.commit_seconds;
  price.stall_swap = cluster.commit_seconds;
  return price;
}

Result<MigrationCost> migration_cost(const Placement& before, const Placement& after, const Topology& topology,
                                     const ClusterSpec& cluster, double bytes_per_expert) {
  EPLB_TRY(cluster.validate());
  if (!(std::isfinite(bytes_per_expert) && bytes_per_expert > 0))
    return error(Code::InvalidArgument, fmt::format("bytes per expert must be finite and > 0, got {}", bytes_per_expert));
  EPLB_ASSIGN_OR_RETURN(MigrationPlan plan, plan_migration(before, after, topology));
  MigrationCost cost;
  cost.loads = LinkLoads(topology.num_ranks, topology.num_nodes);
  for (const LayerPlan& layer : plan.layers) {
    EPLB_ASSIGN_OR_RETURN(LayerCost layer_result, layer_cost(layer, topology, cluster, bytes_per_expert));
    cost.loads += link_loads(layer, topology, bytes_per_expert);
    if (layer_result.changed) {
      const double overhead = cluster.layer_overhead_seconds;
      ++cost.layers_changed;
      cost.lower_bound_seconds += layer_result.lower_bound + overhead;
      cost.scheduled_seconds += layer_result.scheduled + overhead;
      cost.unscheduled_seconds += layer_result.unscheduled + overhead;
      cost.schedule_makespan_seconds += layer_result.schedule_makespan + overhead;
    }
    cost.layers.push_back(layer_result);
  }
  cost.bytes_local = double(plan.stats.slots_local_copy) * bytes_per_expert;
  cost.bytes_intra_host = double(plan.stats.slots_read_intra_node) * bytes_per_expert;
  cost.bytes_inter_host = double(plan.stats.slots_read_inter_node) * bytes_per_expert;
  return cost;
}

}  // namespace eplb
