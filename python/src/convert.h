// python/src/convert.h - conversions between numpy arrays and the library's
// types, and failed Status values turned into Python exceptions.
//
// Contract: every array coming from Python is untrusted. The helpers check
// its rank, its shape against the topology and every index against its
// range before any library call, and throw StatusError (translated to
// eplb.errors.Error with the Status code and message) when something is off.
// The Python layer (eplb/_arrays.py) has already turned torch tensors, lists
// and every dtype into C-contiguous float64 or int64 numpy arrays.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "eplb/placement.h"
#include "eplb/placement_io.h"
#include "eplb/status.h"

namespace eplb::python {

namespace py = pybind11;

using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Float32Array = py::array_t<float, py::array::c_style>;  // exactly float32, C order: no conversion
using IndexArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Whether an array dimension is in [1, 2^30], the range every input extent
// must be in (checked_extent throws the error for one outside it).
inline bool extent_in_range(py::ssize_t extent) { return extent >= 1 && extent <= (py::ssize_t(1) << 30); }

// A failed Status on its way to Python (see register_status_translator).
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& status)
      : std::runtime_error(status.message()), code_(status.code()), peer_(status.peer()) {}
  Code code() const { return code_; }
  int peer() const { return peer_; }

 private:
  Code code_;
  int peer_;
};

void throw_if_error(const Status& status);
template <typename T>
T value_or_throw(Result<T> result) {
  if (!result.is_ok()) throw StatusError(result.status());
  return std::move(result).value();
}
[[noreturn]] void throw_invalid(const std::string& message);

// Maps StatusError to eplb.errors.Error (through eplb.errors._from_status).
void register_status_translator();

// A [L][E] load (2-D) or a [W][L][E] window (3-D) as a trace; every value
// finite and >= 0 (the message names the first bad entry).
LoadTrace trace_from_array(const DoubleArray& array, const char* name);
// The same from float32 (torch's usual load dtype), widened once into the trace.
LoadTrace trace_from_array(const Float32Array& array, const char* name);
// A [L][E] load; a [W][L][E] window is summed over W.
LoadMatrix load_from_array(const DoubleArray& array, const char* name);

// A 2-D [L][R] index array, every entry in [low, high), narrowed to int32.
std::vector<int32_t> indices_from_array(const IndexArray& array, const char* name, int64_t low, int64_t high);
// Rows and columns of a 2-D array (after indices_from_array checked it is 2-D).
int rows_of(const py::array& array);
int columns_of(const py::array& array);

// A Placement from a [L][R] phy2log over E experts (every expert needs a
// replica): E above R or kMaxExpertsPerLayer is refused before any table.
Placement placement_from_array(const IndexArray& phy2log, int64_t num_experts, const char* name);

// A new float64 numpy array of the given shape holding `values`.
py::array_t<double> float64_array(std::span<const double> values, const std::vector<py::ssize_t>& shape);

// int64 copies of int32 results (output.cpp): one new numpy array per part,
// all in one block of memory that lives while any of them does. A block of
// 1 MiB or more is 2 MiB-aligned and advised as a transparent huge page.
struct Int64Part {
  std::span<const int32_t> values;
  std::vector<py::ssize_t> shape;
};
std::vector<py::array_t<int64_t>> int64_arrays(const std::vector<Int64Part>& parts);
// The block itself, for results written straight in int64: `count` values
// (uninitialized) and the capsule that owns them (the arrays' base).
struct Int64Block {
  int64_t* data;
  py::capsule owner;
};
Int64Block int64_block(size_t count);
// int32 -> int64, vectorized.
void widen(const int32_t* __restrict source, size_t count, int64_t* __restrict out);
py::array_t<int64_t> int64_array(std::span<const int32_t> values, const std::vector<py::ssize_t>& shape);

}  // namespace eplb::python
