// eplb's files from Python: load files and traces (.npy, .csv, .json) and
// placement JSON (as written by `eplb rebalance --out`), read by the
// library's bounds-checked readers.
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "convert.h"

namespace eplb::python {
namespace {

py::array_t<double> read_trace(const std::string& path) {
  LoadTrace trace = value_or_throw(read_load_trace(path));
  return float64_array(trace.values, {trace.num_steps, trace.num_layers, trace.num_experts});
}

py::array_t<double> read_load(const std::string& path) {
  LoadMatrix load = value_or_throw(read_load_file(path));
  return float64_array(load.values, {load.num_layers, load.num_experts});
}

py::dict topology_dict(const Topology& topology) {
  py::dict out;
  out["num_layers"] = topology.num_layers;
  out["num_logical_experts"] = topology.num_experts;
  out["num_replicas"] = topology.num_slots;
  out["num_groups"] = topology.num_groups;
  out["num_nodes"] = topology.num_nodes;
  out["num_ranks"] = topology.num_ranks;
  return out;
}

py::dict read_placement(const std::string& path) {
  PlacementFile file = value_or_throw(read_placement_file(path));
  const Placement& placement = file.placement;
  py::dict out = topology_dict(file.topology);
  auto arrays = int64_arrays(
      {{placement.phy2log_data(), {placement.num_layers(), placement.num_slots()}},
       {placement.log2phy_data(), {placement.num_layers(), placement.num_experts(), placement.max_replicas()}},
       {placement.logcnt_data(), {placement.num_layers(), placement.num_experts()}}});
  out["phy2log"] = arrays[0];
  out["log2phy"] = arrays[1];
  out["logcnt"] = arrays[2];
  return out;
}

}  // namespace

void bind_files(py::module_& module) {
  module.def("read_load_trace", &read_trace, py::arg("path"), "A load trace [W][L][E] (a 2-D file has W = 1).");
  module.def("read_load", &read_load, py::arg("path"), "A load [L][E] (a 3-D trace is summed over W).");
  module.def("read_placement", &read_placement, py::arg("path"),
             "A placement JSON: topology counts, phy2log, log2phy, logcnt.");
}

}  // namespace eplb::python
