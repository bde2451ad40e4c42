// Public entry points of the planner: argument checks around LayerPlanner.
#include "eplb/plan.h"

#include <string>

#include "layer_planner.h"

namespace eplb {

int ReadRequest::slots() const {
  int total = 0;
  for (const ReadRun& run : runs) total += run.count;
  return total;
}

namespace {

// The view of `count` elements at the offset `view` has in `from_storage`,
// placed in `to_storage` instead.
template <class T>
std::span<const T> same_view(std::span<const T> view, const std::vector<T>& from_storage,
                             const std::vector<T>& to_storage) {
  if (view.empty()) return {};
  return {to_storage.data() + (view.data() - from_storage.data()), view.size()};
}

}  // namespace

LayerPlan::LayerPlan(const LayerPlan& other)
    : layer(other.layer),
      ranks(other.ranks),
      stats(other.stats),
      slots_read_from(other.slots_read_from),
      slot_storage(other.slot_storage),
      read_storage(other.read_storage),
      read_from_storage(other.read_from_storage) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].slots = same_view(other.ranks[r].slots, other.slot_storage, slot_storage);
    ranks[r].reads = same_view(other.ranks[r].reads, other.read_storage, read_storage);
  }
  for (size_t r = 0; r < slots_read_from.size(); ++r)
    slots_read_from[r] = same_view<int>(other.slots_read_from[r], other.read_from_storage, read_from_storage);
}

LayerPlan& LayerPlan::operator=(const LayerPlan& other) {
  if (this != &other) *this = LayerPlan(other);
  return *this;
}

PlanStats& PlanStats::operator+=(const PlanStats& other) {
  slots_kept += other.slots_kept;
  slots_local_copy += other.slots_local_copy;
  slots_read_intra_node += other.slots_read_intra_node;
  slots_read_inter_node += other.slots_read_inter_node;
  requests += other.requests;
  descriptors += other.descriptors;
  return *this;
}

Result<LayerPlan> plan_layer(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                             const Topology& topology, int layer) {
  EPLB_TRY(topology.validate().with_context("plan layer " + std::to_string(layer)));
  plan_detail::LayerPlanner planner(topology);
  return planner.plan(old_phy2log, new_phy2log, layer);
}

Result<MigrationPlan> plan_migration(const Placement& old_placement, const Placement& new_placement,
                                     const Topology& topology) {
  EPLB_TRY(topology.validate().with_context("plan migration"));
  auto shape_check = [&topology](const Placement& placement, const char* which) -> Status {
    if (placement.num_layers() != topology.num_layers || placement.num_experts() != topology.num_experts ||
        placement.num_slots() != topology.num_slots ||
        placement.phy2log_data().size() != size_t(topology.num_layers) * size_t(topology.num_slots))
      return error(Code::InvalidArgument, std::string("plan migration: the ") + which + " placement (layers=" +
                                              std::to_string(placement.num_layers()) +
                                              " experts=" + std::to_string(placement.num_experts()) +
                                              " slots=" + std::to_string(placement.num_slots()) +
                                              ") does not match topology " + topology.to_string());
    return Status::ok();
  };
  EPLB_TRY(shape_check(old_placement, "old"));
  EPLB_TRY(shape_check(new_placement, "new"));

  plan_detail::LayerPlanner planner(topology);
  MigrationPlan migration;
  migration.layers.reserve(size_t(topology.num_layers));
  for (int layer = 0; layer < topology.num_layers; ++layer) {
    EPLB_ASSIGN_OR_RETURN(LayerPlan plan,
                          planner.plan(old_placement.layer_phy2log(layer), new_placement.layer_phy2log(layer), layer));
    migration.stats += plan.stats;
    migration.layers.push_back(std::move(plan));
  }
  return migration;
}

}  // namespace eplb
