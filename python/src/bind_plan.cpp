// Migration plan statistics: what a change of placement costs, in slots,
// bytes and read requests.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "eplb/plan.h"

namespace eplb::python {
namespace {

struct PlanArguments {
  int num_ranks = 1, num_nodes = 1, num_experts = 0;
  int64_t bytes_per_expert = 0;
};

// The experts a plan's placements imply: the largest id + 1, which must be
// below the slots per layer (every expert needs a slot); refused naming the
// entry before any table is sized by it.
int experts_in(const IndexArray& old_phy2log, const IndexArray& new_phy2log) {
  int64_t largest = -1;
  for (const auto& [array, name] : {std::pair{&old_phy2log, "old_phy2log"}, std::pair{&new_phy2log, "new_phy2log"}}) {
    if (array->size() == 0) continue;
    const int64_t* at = std::max_element(array->data(), array->data() + array->size());
    const int64_t slots = array->shape(1);
    if (*at >= slots)
      throw_invalid(fmt::format("{}[{}][{}] = {}: expert ids must be below the {} slots per layer (every expert "
                                "needs a slot); give num_logical_experts if the ids are right",
                                name, (at - array->data()) / slots, (at - array->data()) % slots, *at, slots));
    largest = std::max(largest, *at);
  }
  return static_cast<int>(std::max<int64_t>(largest + 1, 1));
}

py::dict plan_dict(const MigrationPlan& plan, const Topology& topology, int64_t bytes_per_expert) {
  const PlanStats& stats = plan.stats;
  std::vector<int64_t> requests_per_rank(topology.num_ranks, 0), slots_read_per_rank(topology.num_ranks, 0);
  std::vector<int64_t> slots_changed;
  for (const LayerPlan& layer : plan.layers) {
    slots_changed.push_back(layer.stats.slots_local_copy + layer.stats.slots_read_intra_node +
                            layer.stats.slots_read_inter_node);
    for (const RankLayerPlan& rank : layer.ranks)
      for (const ReadRequest& request : rank.reads) {
        ++requests_per_rank[rank.rank];
        slots_read_per_rank[rank.rank] += request.slots();
      }
  }
  py::dict out;
  out["slots_kept"] = stats.slots_kept;
  out["slots_local"] = stats.slots_local_copy;
  out["slots_intra_node"] = stats.slots_read_intra_node;
  out["slots_inter_node"] = stats.slots_read_inter_node;
  out["bytes_per_expert"] = bytes_per_expert;
  out["bytes_kept"] = stats.slots_kept * bytes_per_expert;
  out["bytes_local"] = stats.slots_local_copy * bytes_per_expert;
  out["bytes_intra_node"] = stats.slots_read_intra_node * bytes_per_expert;
  out["bytes_inter_node"] = stats.slots_read_inter_node * bytes_per_expert;
  out["bytes_over_network"] = (stats.slots_read_intra_node + stats.slots_read_inter_node) * bytes_per_expert;
  out["requests"] = stats.requests;
  out["descriptors"] = stats.descriptors;
  out["requests_per_rank"] = requests_per_rank;
  out["bytes_read_per_rank"] = [&] {
    std::vector<int64_t> bytes(slots_read_per_rank);
    for (int64_t& value : bytes) value *= bytes_per_expert;
    return bytes;
  }();
  out["slots_changed_per_layer"] = slots_changed;
  return out;
}

py::dict plan_migration_of(const IndexArray& old_phy2log, const IndexArray& new_phy2log, PlanArguments arguments) {
  if (arguments.bytes_per_expert <= 0)
    throw_invalid("bytes_per_expert must be > 0, got " + std::to_string(arguments.bytes_per_expert));
  if (old_phy2log.ndim() != 2 || new_phy2log.ndim() != 2 || old_phy2log.shape(0) != new_phy2log.shape(0) ||
      old_phy2log.shape(1) != new_phy2log.shape(1))
    throw StatusError(Status(Code::Mismatch, "old_phy2log and new_phy2log must both be [layers][slots] of one shape"));
  if (arguments.num_experts <= 0) arguments.num_experts = experts_in(old_phy2log, new_phy2log);
  Placement old_placement = placement_from_array(old_phy2log, arguments.num_experts, "old_phy2log");
  Placement new_placement = placement_from_array(new_phy2log, arguments.num_experts, "new_phy2log");
  Topology topology{old_placement.num_layers(), arguments.num_experts, old_placement.num_slots(), 1,
                    arguments.num_nodes, arguments.num_ranks};
  throw_if_error(topology.validate());
  Result<MigrationPlan> planned = Status(Code::Internal, "the planner did not run");
  {
    py::gil_scoped_release release;
    planned = plan_migration(old_placement, new_placement, topology);
  }
  const MigrationPlan& plan = value_or_throw(std::move(planned));
  return plan_dict(plan, topology, arguments.bytes_per_expert);
}

}  // namespace

void bind_plan(py::module_& module) {
  module.def(
      "plan_migration",
      [](const IndexArray& old_phy2log, const IndexArray& new_phy2log, int num_ranks, int num_nodes,
         int64_t bytes_per_expert, int num_experts) {
        return plan_migration_of(old_phy2log, new_phy2log, {num_ranks, num_nodes, num_experts, bytes_per_expert});
      },
      py::arg("old_phy2log"), py::arg("new_phy2log"), py::arg("num_ranks"), py::arg("num_nodes"),
      py::arg("bytes_per_expert"), py::arg("num_experts"),
      "Statistics of the migration plan from old to new (num_experts <= 0: inferred).");
}

}  // namespace eplb::python
