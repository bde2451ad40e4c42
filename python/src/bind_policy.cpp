// Policies: place() runs one policy by name, with the GIL released while the
// estimator and the policy run (other Python threads keep going); estimate()
// runs only the estimator.
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "convert.h"
#include "eplb/common.h"
#include "eplb/deepseek_vec.h"
#include "eplb/estimator.h"
#include "eplb/policy.h"

namespace eplb::python {
namespace {

struct PlaceArguments {
  int num_slots = 0, num_groups = 1, num_nodes = 1, num_ranks = 1;
  std::string policy;
  std::string estimator;
  PolicyOptions options;
};

// The load the policy plans for: the window through the estimator (a single
// [L][E] step summed is itself, so it is moved, not recomputed).
Result<LoadMatrix> planning_load(LoadTrace&& trace, const Estimator& estimator) {
  if (trace.num_steps == 1 && estimator.kind == EstimatorKind::Sum) {
    LoadMatrix load;
    load.num_layers = trace.num_layers;
    load.num_experts = trace.num_experts;
    load.values = std::move(trace.values);
    return load;
  }
  return estimate_load(trace, 0, trace.num_steps, estimator);
}

// `deepseek` with its default options, which never reads the placement in force.
bool is_plain_deepseek(const PlaceArguments& arguments) {
  return arguments.policy == "deepseek" && arguments.options.min_gain <= 0 && !arguments.options.anti_affinity;
}

// The placement in force: `current`, else the default placement. `deepseek`
// ignores it unless min_gain or anti_affinity asks (policy.h), so it is not
// built for nothing there: an empty Placement stands in.
Placement placement_in_force(const std::optional<IndexArray>& current, const Topology& topology,
                             const PlaceArguments& arguments) {
  if (!current) {
    if (is_plain_deepseek(arguments)) return Placement();
    return default_placement(topology);
  }
  if (current->ndim() != 2 || current->shape(0) != topology.num_layers || current->shape(1) != topology.num_slots)
    throw StatusError(Status(Code::Mismatch, "current must be [layers][num_replicas] = [" +
                                                 std::to_string(topology.num_layers) + "][" +
                                                 std::to_string(topology.num_slots) + "] like the result"));
  return placement_from_array(*current, topology.num_experts, "current");
}

// `deepseek`'s arrays as the result: log2phy written as int64 straight into
// the result block (no int32 log2phy, no widening of it). The seconds cover
// the policy's work, log2phy included, as deepseek_placement's do.
py::tuple deepseek_result(Result<DeepSeekArrays>&& computed, double seconds, int threads) {
  const DeepSeekArrays arrays = value_or_throw(std::move(computed));
  const py::ssize_t layers = arrays.num_layers, slots = arrays.num_slots, experts = arrays.num_experts,
                    width = arrays.max_replicas;
  Int64Block block = int64_block(size_t(layers) * size_t(slots + experts * width + experts));
  int64_t* phy2log = block.data;
  int64_t* log2phy = phy2log + layers * slots;
  int64_t* logcnt = log2phy + layers * experts * width;
  {
    py::gil_scoped_release release;
    Stopwatch watch;
    write_log2phy(arrays, log2phy, std::clamp(threads, 1, arrays.num_layers));
    seconds += watch.seconds();
    widen(arrays.phy2log.data(), arrays.phy2log.size(), phy2log);
    widen(arrays.logcnt.data(), arrays.logcnt.size(), logcnt);
  }
  return py::make_tuple(py::array_t<int64_t>({layers, slots}, phy2log, block.owner),
                        py::array_t<int64_t>({layers, experts, width}, log2phy, block.owner),
                        py::array_t<int64_t>({layers, experts}, logcnt, block.owner), seconds);
}

// `deepseek` with its default options (no current placement needed).
py::tuple place_deepseek(LoadTrace&& trace, const Estimator& estimator, const Topology& topology, int threads) {
  Result<DeepSeekArrays> computed = Status(Code::Internal, "the policy did not run");
  double seconds = 0;
  {
    py::gil_scoped_release release;
    Result<LoadMatrix> load = planning_load(std::move(trace), estimator);
    Stopwatch watch;
    computed = load.is_ok() ? deepseek_arrays(*load, topology, threads) : Result<DeepSeekArrays>(load.status());
    seconds = watch.seconds();
  }
  return deepseek_result(std::move(computed), seconds, threads);
}

using InPlaceLoads = py::array_t<double, py::array::c_style>;  // float64 in C order: readable as it is

// The same over float64 [L][E] loads read where numpy keeps them (no copy;
// the caller holds the array for the call). An invalid value is named by
// the conversion's own message, found again on that failure path only.
py::tuple place_deepseek_in_place(const InPlaceLoads& weight, const Topology& topology, int threads) {
  const LoadView view{weight.data(), topology.num_layers, topology.num_experts};
  Result<DeepSeekArrays> computed = Status(Code::Internal, "the policy did not run");
  double seconds = 0;
  {
    py::gil_scoped_release release;
    Stopwatch watch;
    computed = deepseek_arrays(view, topology, threads);
    seconds = watch.seconds();
  }
  if (!computed.is_ok()) (void)trace_from_array(weight.cast<DoubleArray>(), "weight");  // throws its named error
  return deepseek_result(std::move(computed), seconds, threads);
}

// The in-place path's topology when it applies: plain deepseek summing a
// float64 C-order [L][E] array with a valid topology (anything else takes
// the general path, which reports errors in its usual order).
std::optional<Topology> in_place_topology(const py::array& weight, const PlaceArguments& arguments) {
  if (!is_plain_deepseek(arguments) || arguments.estimator != "sum" || !py::isinstance<InPlaceLoads>(weight) ||
      weight.ndim() != 2)
    return std::nullopt;
  if (!extent_in_range(weight.shape(0)) || !extent_in_range(weight.shape(1))) return std::nullopt;
  Topology topology{int(weight.shape(0)), int(weight.shape(1)), arguments.num_slots, arguments.num_groups,
                    arguments.num_nodes, arguments.num_ranks};
  if (!topology.validate().is_ok()) return std::nullopt;
  return topology;
}

// The weight as a trace: C-order float32 converts straight into it, any
// other array through a float64 array first.
LoadTrace trace_of_weight(const py::array& weight, const char* name = "weight") {
  if (py::isinstance<Float32Array>(weight) && (weight.flags() & py::array::c_style))
    return trace_from_array(weight.cast<Float32Array>(), name);
  return trace_from_array(weight.cast<DoubleArray>(), name);
}

// Returns (phy2log [L][R], log2phy [L][E][max replicas], logcnt [L][E], policy seconds).
py::tuple place(const py::array& weight, const PlaceArguments& arguments, const std::optional<IndexArray>& current) {
  if (std::optional<Topology> topology = in_place_topology(weight, arguments))
    return place_deepseek_in_place(weight.cast<InPlaceLoads>(), *topology, arguments.options.threads);
  LoadTrace trace = trace_of_weight(weight);
  Topology topology{trace.num_layers, trace.num_experts, arguments.num_slots, arguments.num_groups,
                    arguments.num_nodes, arguments.num_ranks};
  throw_if_error(topology.validate());
  Estimator estimator = value_or_throw(parse_estimator(arguments.estimator));
  std::unique_ptr<Policy> policy = value_or_throw(make_policy(arguments.policy));
  Placement in_force = placement_in_force(current, topology, arguments);
  if (is_plain_deepseek(arguments))
    return place_deepseek(std::move(trace), estimator, topology, arguments.options.threads);

  Result<Placement> placed = Status(Code::Internal, "the policy did not run");
  double seconds = 0;
  {
    py::gil_scoped_release release;
    Result<LoadMatrix> load = planning_load(std::move(trace), estimator);
    if (load.is_ok()) {
      Stopwatch watch;
      placed = policy->place(*load, topology, in_force, arguments.options);
      seconds = watch.seconds();
    } else {
      placed = load.status();
    }
  }
  const Placement& placement = value_or_throw(std::move(placed));
  auto arrays = int64_arrays(
      {{placement.phy2log_data(), {topology.num_layers, topology.num_slots}},
       {placement.log2phy_data(), {topology.num_layers, topology.num_experts, placement.max_replicas()}},
       {placement.logcnt_data(), {topology.num_layers, topology.num_experts}}});
  return py::make_tuple(arrays[0], arrays[1], arrays[2], seconds);
}

// The estimator's load for a window [S][L][E] (or one step [L][E]):
// (float64 [L][E], the estimator applied: `auto` resolved to ema:H or sum).
py::tuple estimate(const py::array& window, const std::string& text) {
  LoadTrace trace = trace_of_weight(window, "window");
  const Estimator asked = value_or_throw(parse_estimator(text));
  Result<Estimator> applied = Status(Code::Internal, "the estimator did not run");
  Result<LoadMatrix> load = Status(Code::Internal, "the estimator did not run");
  {
    py::gil_scoped_release release;
    applied = resolve_estimator(trace, 0, trace.num_steps, asked);
    load = applied.is_ok() ? estimate_load(trace, 0, trace.num_steps, *applied) : Result<LoadMatrix>(applied.status());
  }
  const LoadMatrix& matrix = value_or_throw(std::move(load));
  py::array_t<double> out({py::ssize_t(matrix.num_layers), py::ssize_t(matrix.num_experts)});
  std::copy(matrix.values.begin(), matrix.values.end(), out.mutable_data());
  return py::make_tuple(out, applied->to_string());
}

// SGLang's deepseek_vec or deepseek_torch (eplb/deepseek_vec.h) over tokens
// [S][L][E] (float64, C order) with the precision SGLang would compute in
// ("int", "float32", "float64"): (phy2log, log2phy, logcnt, policy seconds), int64.
using VecFunction = Result<VecArrays> (*)(const double*, const VecShape&, VecPrecision);

py::tuple place_deepseek_vec(VecFunction function, const DoubleArray& tokens, const VecShape& partial,
                             const std::string& precision) {
  if (tokens.ndim() != 3)
    throw StatusError(Status(Code::InvalidArgument, "sglang: tokens must be [steps][layers][experts], got " +
                                                        std::to_string(tokens.ndim()) + " dimensions"));
  for (int d = 0; d < 3; ++d)
    if (!extent_in_range(tokens.shape(d)))
      throw StatusError(Status(Code::InvalidArgument, "sglang: tokens extent out of range"));
  VecShape shape = partial;
  shape.steps = int(tokens.shape(0)), shape.layers = int(tokens.shape(1)), shape.experts = int(tokens.shape(2));
  VecPrecision kind = VecPrecision::Float32;
  if (precision == "int") kind = VecPrecision::Int;
  else if (precision == "float64") kind = VecPrecision::Float64;
  else if (precision != "float32")
    throw StatusError(Status(Code::InvalidArgument, "sglang: precision must be int, float32 or float64, got '" +
                                                        precision + "'"));
  Result<VecArrays> computed = Status(Code::Internal, "the policy did not run");
  double seconds = 0;
  {
    py::gil_scoped_release release;
    Stopwatch watch;
    computed = function(tokens.data(), shape, kind);
    seconds = watch.seconds();
  }
  const VecArrays arrays = value_or_throw(std::move(computed));
  auto out = int64_arrays({{arrays.phy2log, {arrays.num_layers, arrays.num_slots}},
                           {arrays.log2phy, {arrays.num_layers, arrays.num_experts, arrays.width}},
                           {arrays.logcnt, {arrays.num_layers, arrays.num_experts}}});
  return py::make_tuple(out[0], out[1], out[2], seconds);
}

}  // namespace

void bind_policy(py::module_& module) {
  for (auto [name, function] : {std::pair<const char*, VecFunction>{"deepseek_vec", &deepseek_vec},
                                 std::pair<const char*, VecFunction>{"deepseek_torch", &deepseek_torch}})
    module.def(
        name,
        [function](const DoubleArray& tokens, int num_slots, int local_slots, int num_groups, int num_nodes,
                   bool hierarchical, const std::string& precision) {
          VecShape shape;
          shape.slots = num_slots, shape.local_slots = local_slots, shape.groups = num_groups, shape.nodes = num_nodes;
          shape.hierarchical = hierarchical;
          return place_deepseek_vec(function, tokens, shape, precision);
        },
        py::arg("tokens"), py::arg("num_slots"), py::arg("local_slots"), py::arg("num_groups"), py::arg("num_nodes"),
        py::arg("hierarchical"), py::arg("precision"),
        "SGLang's algorithm (deepseek_vec, or deepseek in torch's tie order): (phy2log, log2phy, logcnt, policy "
        "seconds). Releases the GIL while it runs.");
  module.def("policy_names", &policy_names, "Names of the placement policies.");
  module.def("estimate", &estimate, py::arg("window"), py::arg("estimator"),
             "A window's load through an estimator: (float64 [layers][experts], the estimator applied). "
             "Releases the GIL while it runs.");
  module.def(
      "place",
      [](const py::array& weight, int num_slots, int num_groups, int num_nodes, int num_ranks,
         const std::string& policy, const std::optional<IndexArray>& current, int threads, double budget,
         bool anti_affinity, double min_gain, double move_threshold, const std::string& estimator,
         const std::string& cluster, double interval_seconds, double bytes_per_expert, const std::string& stall_mode) {
        PlaceArguments arguments{num_slots, num_groups, num_nodes, num_ranks, policy, estimator, {}};
        arguments.options.threads = threads;
        arguments.options.budget = budget;
        arguments.options.anti_affinity = anti_affinity;
        arguments.options.min_gain = min_gain;
        arguments.options.move_threshold = move_threshold;
        arguments.options.cluster = cluster;
        arguments.options.interval_seconds = interval_seconds;
        arguments.options.bytes_per_expert = bytes_per_expert;
        arguments.options.stall_mode = stall_mode;
        return place(weight, arguments, current);
      },
      py::arg("weight"), py::arg("num_slots"), py::arg("num_groups"), py::arg("num_nodes"), py::arg("num_ranks"),
      py::arg("policy"), py::arg("current"), py::arg("threads"), py::arg("budget"), py::arg("anti_affinity"),
      py::arg("min_gain"), py::arg("move_threshold"), py::arg("estimator"), py::arg("cluster") = PolicyOptions{}.cluster,
      py::arg("interval_seconds") = PolicyOptions{}.interval_seconds,
      py::arg("bytes_per_expert") = PolicyOptions{}.bytes_per_expert,
      py::arg("stall_mode") = PolicyOptions{}.stall_mode,
      "One policy call: (phy2log, log2phy, logcnt, policy seconds). Releases the GIL while the policy runs.");
}

}  // namespace eplb::python
