// Array conversions and the Status -> Python exception translator.
#include "convert.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace eplb::python {

void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw StatusError(status);
}

void throw_invalid(const std::string& message) { throw StatusError(Status(Code::InvalidArgument, message)); }

void register_status_translator() {
  py::register_exception_translator([](std::exception_ptr pending) {
    try {
      if (pending) std::rethrow_exception(pending);
    } catch (const StatusError& failure) {
      py::object make = py::module_::import("eplb.errors").attr("_from_status");
      py::object peer = failure.peer() >= 0 ? py::object(py::int_(failure.peer())) : py::object(py::none());
      py::object exception = make(std::string(code_name(failure.code())), failure.what(), peer);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    }
  });
}

namespace {

std::string shape_text(const py::array& array) {
  std::string text = "(";
  for (py::ssize_t d = 0; d < array.ndim(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(array.shape(d));
  }
  text += array.ndim() == 1 ? ",)" : ")";
  return text;
}

int checked_extent(const py::array& array, py::ssize_t dim, const char* name) {
  py::ssize_t extent = array.shape(dim);
  if (!extent_in_range(extent))
    throw_invalid(std::string(name) + " has shape " + shape_text(array) + ": every dimension must be in [1, 2^30]");
  return static_cast<int>(extent);
}

std::string position(const std::vector<size_t>& extents, size_t flat) {
  std::vector<size_t> index(extents.size());
  for (size_t d = extents.size(); d-- > 0;) {
    index[d] = flat % extents[d];
    flat /= extents[d];
  }
  std::string text;
  for (size_t i : index) {
    text += '[';
    text += std::to_string(i);
    text += ']';
  }
  return text;
}

// Whether every value is finite and >= 0, in one branch-free pass that
// vectorizes (NaN fails both comparisons); the slow loop that names the bad
// value runs only when this says no.
bool all_loads_valid(const double* values, size_t count) {
  constexpr double kMax = std::numeric_limits<double>::max();
  bool valid = true;
  for (size_t i = 0; i < count; ++i) valid &= (values[i] >= 0) & (values[i] <= kMax);
  return valid;
}

// Values of any float type converted once, straight into the trace.
template <typename Array>
LoadTrace trace_of_array(const Array& array, const char* name) {
  if (array.ndim() != 2 && array.ndim() != 3)
    throw_invalid(std::string(name) + " must be [layers][experts] or [window][layers][experts], got shape " +
                  shape_text(array));
  LoadTrace trace;
  const bool window = array.ndim() == 3;
  trace.num_steps = window ? checked_extent(array, 0, name) : 1;
  trace.num_layers = checked_extent(array, window ? 1 : 0, name);
  trace.num_experts = checked_extent(array, window ? 2 : 1, name);
  const size_t count = size_t(trace.num_steps) * trace.num_layers * trace.num_experts;
  trace.values.assign(array.data(), array.data() + count);
  const double* data = trace.values.data();
  if (all_loads_valid(data, count)) return trace;
  for (size_t i = 0; i < count; ++i) {
    if (std::isfinite(data[i]) && data[i] >= 0) continue;
    std::vector<size_t> extents = {size_t(trace.num_layers), size_t(trace.num_experts)};
    if (window) extents.insert(extents.begin(), size_t(trace.num_steps));
    char value[32];
    std::snprintf(value, sizeof value, "%.17g", data[i]);
    throw_invalid(std::string(name) + position(extents, i) + " = " + value +
                  ": loads must be finite and >= 0");
  }
  return trace;
}

}  // namespace

LoadTrace trace_from_array(const DoubleArray& array, const char* name) { return trace_of_array(array, name); }
LoadTrace trace_from_array(const Float32Array& array, const char* name) { return trace_of_array(array, name); }

LoadMatrix load_from_array(const DoubleArray& array, const char* name) {
  LoadTrace trace = trace_from_array(array, name);
  if (trace.num_steps == 1) {
    LoadMatrix load;
    load.num_layers = trace.num_layers;
    load.num_experts = trace.num_experts;
    load.values = std::move(trace.values);
    return load;
  }
  LoadMatrix load = trace.sum(0, trace.num_steps);
  throw_if_error(load.validate().with_context(std::string(name) + " summed over its window"));
  return load;
}

int rows_of(const py::array& array) { return static_cast<int>(array.shape(0)); }
int columns_of(const py::array& array) { return static_cast<int>(array.shape(1)); }

std::vector<int32_t> indices_from_array(const IndexArray& array, const char* name, int64_t low, int64_t high) {
  if (array.ndim() != 2) throw_invalid(std::string(name) + " must be [layers][slots], got shape " + shape_text(array));
  const size_t rows = checked_extent(array, 0, name), columns = checked_extent(array, 1, name);
  const int64_t* data = array.data();
  std::vector<int32_t> values(rows * columns);
  for (size_t i = 0; i < values.size(); ++i) {
    if (data[i] < low || data[i] >= high)
      throw_invalid(std::string(name) + position({rows, columns}, i) + " = " + std::to_string(data[i]) +
                    " is out of range [" + std::to_string(low) + ", " + std::to_string(high) + ")");
    values[i] = static_cast<int32_t>(data[i]);
  }
  return values;
}

Placement placement_from_array(const IndexArray& phy2log, int64_t num_experts, const char* name) {
  if (phy2log.ndim() == 2 && (num_experts > phy2log.shape(1) || num_experts > kMaxExpertsPerLayer))
    throw_invalid("num_logical_experts = " + std::to_string(num_experts) + " for " + name + " of " +
                  std::to_string(phy2log.shape(1)) + " slots per layer: every expert needs a slot, so expert ids " +
                  "must be below the slots per layer (and at most " + std::to_string(kMaxExpertsPerLayer) + ")");
  std::vector<int32_t> values = indices_from_array(phy2log, name, 0, num_experts);
  auto placement = Placement::from_phy2log(rows_of(phy2log), num_experts, columns_of(phy2log), std::move(values));
  if (!placement.is_ok()) throw StatusError(placement.status().with_context(name));
  return std::move(placement).value();
}

py::array_t<double> float64_array(std::span<const double> values, const std::vector<py::ssize_t>& shape) {
  py::array_t<double> array(shape);
  std::copy(values.begin(), values.end(), array.mutable_data());
  return array;
}

}  // namespace eplb::python
