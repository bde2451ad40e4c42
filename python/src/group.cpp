// Process groups for Python: eplb's own bootstraps (local launcher
// environment, mpirun) and a group whose exchange() primitive is a Python
// object (eplb.group's torch.distributed exchange). The C++ collectives
// (allgather, barrier, vote) run on either.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "eplb/bootstrap.h"
#include "group.h"
#include "python_plane.h"

namespace eplb::python {
namespace {

// exchange() calls `exchange(kind, data, timeout_seconds) -> list[bytes]` on
// a Python object. It runs on whichever thread the engine collects on, so it
// takes the GIL for the call. A Python exception becomes a Status: its
// `code` attribute (an eplb.Error's code name) or Backend, and its message.
class PythonGroup final : public ProcessGroup {
 public:
  PythonGroup(py::object exchange, int rank, int size, std::string backend)
      : exchange_(std::move(exchange)), rank_(rank), size_(size), backend_(std::move(backend)) {}
  ~PythonGroup() override {
    py::gil_scoped_acquire gil;
    exchange_ = py::object();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return backend_; }

  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override {
    py::gil_scoped_acquire gil;
    try {
      py::object result = exchange_(std::string(collective_name(kind)), py::bytes(mine),
                                    std::max(0.0, deadline.remaining_seconds()));
      std::vector<std::string> contributions;
      for (py::handle item : result) contributions.push_back(item.cast<std::string>());
      if (int(contributions.size()) != size_)
        return error(Code::Internal, backend_ + " group: exchange returned " + std::to_string(contributions.size()) +
                                         " contributions for " + std::to_string(size_) + " ranks");
      return contributions;
    } catch (py::error_already_set& failure) {
      return status_of(failure);
    } catch (const py::cast_error& failure) {
      return error(Code::Internal, backend_ + " group: exchange must return a list of bytes (" + failure.what() + ")");
    }
  }

 private:
  py::object exchange_;
  int rank_, size_;
  std::string backend_;
};

std::shared_ptr<ProcessGroup> local_group_from_env(double timeout_seconds) {
  LocalGroupOptions options = value_or_throw(local_group_options_from_env());
  if (timeout_seconds > 0) options.connect_timeout_seconds = timeout_seconds;
  py::gil_scoped_release release;
  return value_or_throw(make_local_group(options));
}

std::shared_ptr<ProcessGroup> mpi_group(double timeout_seconds) {
  py::gil_scoped_release release;
  return value_or_throw(make_mpi_group(timeout_seconds, 4));
}

std::vector<py::bytes> allgather(ProcessGroup& group, const std::string& mine, double timeout_seconds) {
  Result<std::vector<std::string>> gathered = [&] {
    py::gil_scoped_release release;
    return group.allgather(mine, Deadline::after_seconds(timeout_seconds));
  }();
  std::vector<py::bytes> result;
  for (const auto& item : value_or_throw(std::move(gathered))) result.emplace_back(item);
  return result;
}

}  // namespace

Code code_from_name(const std::string& name) {
  for (int value = 0; value <= int(Code::Internal); ++value)
    if (code_name(Code(value)) == name) return Code(value);
  return Code::Backend;
}

void bind_group(py::module_& module) {
  py::class_<ProcessGroup, std::shared_ptr<ProcessGroup>>(module, "ProcessGroup")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("backend", &ProcessGroup::backend_name)
      .def("allgather", &allgather, py::arg("data"), py::arg("timeout"))
      .def(
          "barrier",
          [](ProcessGroup& group, double timeout_seconds) {
            py::gil_scoped_release release;
            throw_if_error(group.barrier(Deadline::after_seconds(timeout_seconds)));
          },
          py::arg("timeout"));
  module.def(
      "python_group",
      [](py::object exchange, int rank, int size, std::string backend) -> std::shared_ptr<ProcessGroup> {
        if (size < 1 || rank < 0 || rank >= size)
          throw_invalid("process group: rank " + std::to_string(rank) + " of " + std::to_string(size));
        return std::make_shared<PythonGroup>(std::move(exchange), rank, size, std::move(backend));
      },
      py::arg("exchange"), py::arg("rank"), py::arg("size"), py::arg("backend"));
  module.def("local_group_from_env", &local_group_from_env, py::arg("timeout"));
  module.def("mpi_group", &mpi_group, py::arg("timeout"));
  module.def("launched_by_mpirun", &launched_by_mpirun);
}

}  // namespace eplb::python
