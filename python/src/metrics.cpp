// Balance metrics of a placement under a load: rank loads and balancedness.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"

namespace eplb::python {
namespace {

struct Measured {
  LoadMatrix load;
  Topology topology;
  Placement placement;
};

// The load ([L][E], or [W][L][E] summed), and the placement [L][R] over the
// load's experts spread over num_ranks ranks, checked against each other.
Measured measured(const DoubleArray& load_array, const IndexArray& phy2log, int num_ranks) {
  Measured out{load_from_array(load_array, "load"), {}, {}};
  if (phy2log.ndim() != 2 || phy2log.shape(0) != out.load.num_layers)
    throw StatusError(Status(Code::Mismatch, "phy2log must be [layers][slots] with the load's " +
                                                 std::to_string(out.load.num_layers) + " layers"));
  out.topology = Topology{out.load.num_layers, out.load.num_experts, columns_of(phy2log), 1, 1, num_ranks};
  throw_if_error(out.topology.validate());
  out.placement = placement_from_array(phy2log, out.load.num_experts, "phy2log");
  return out;
}

py::array_t<double> rank_loads_of(const DoubleArray& load, const IndexArray& phy2log, int num_ranks) {
  Measured input = measured(load, phy2log, num_ranks);
  std::vector<double> loads;
  loads.reserve(size_t(input.topology.num_layers) * num_ranks);
  for (int l = 0; l < input.topology.num_layers; ++l) {
    std::vector<double> layer = rank_loads(input.placement, input.load, input.topology, l);
    loads.insert(loads.end(), layer.begin(), layer.end());
  }
  return float64_array(loads, {input.topology.num_layers, num_ranks});
}

py::dict balancedness_of(const DoubleArray& load, const IndexArray& phy2log, int num_ranks) {
  Measured input = measured(load, phy2log, num_ranks);
  BalanceSummary summary = balancedness(input.placement, input.load, input.topology);
  const py::ssize_t layers = input.topology.num_layers;
  py::dict out;
  out["mean"] = summary.mean_balancedness;
  out["sum"] = summary.sum_balancedness;
  out["per_layer"] = float64_array(summary.per_layer, {layers});
  out["max_rank_load"] = float64_array(summary.max_load, {layers});
  out["mean_rank_load"] = float64_array(summary.mean_load, {layers});
  return out;
}

}  // namespace

void bind_metrics(py::module_& module) {
  module.def("rank_loads", &rank_loads_of, py::arg("load"), py::arg("phy2log"), py::arg("num_ranks"),
             "Per layer and rank, the load the rank serves: [L][P].");
  module.def("balancedness", &balancedness_of, py::arg("load"), py::arg("phy2log"), py::arg("num_ranks"),
             "Balancedness summary: mean, sum, per_layer, max_rank_load, mean_rank_load.");
}

}  // namespace eplb::python
