// eplb's files from Python: load files and traces (.npy, .csv, .json) and
// placement JSON (as written by `eplb rebalance --out`), read by the
// library's bounds-checked readers; and the CLI's byte sizes (its
// --max-input-bytes), read by the CLI's own parser.
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "common/text.h"
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

// parse_byte_size (common/text.h); `option` names the flag in the message
// as the CLI does ("--max-input-bytes: '1XB' is not a byte size ...").
uint64_t byte_size(const std::string& text, const std::optional<std::string>& option) {
  Result<uint64_t> bytes = parse_byte_size(text);
  if (!bytes && option) throw StatusError(bytes.status().with_context(*option));
  return value_or_throw(std::move(bytes));
}

}  // namespace

void bind_files(py::module_& module) {
  module.def("read_load_trace", &read_trace, py::arg("path"), "A load trace [W][L][E] (a 2-D file has W = 1).");
  module.def("read_load", &read_load, py::arg("path"), "A load [L][E] (a 3-D trace is summed over W).");
  module.def("read_placement", &read_placement, py::arg("path"),
             "A placement JSON: topology counts, phy2log, log2phy, logcnt.");
  module.def("parse_byte_size", &byte_size, py::arg("text"), py::arg("option") = py::none(),
             "A byte size as the eplb CLI reads one (4096, 512KiB, 1.5GiB; powers of 1024), in [1 B, 1 TiB]; "
             "eplb.Error (invalid argument) naming `option` otherwise.");
}

}  // namespace eplb::python
